"""Key statuses are honest and consistent (the proof that "supported" keys are read is elsewhere).

docs/CONFIG_KEYS.md marks each key *supported*, *no effect on CPU*, *accepted, no effect yet* or *default only*
(``rlhf_core.config.schema.EFFECT`` / ``SUPPORT``). That a supported key is read, by full path, in a real run is
checked by tests/integration/test_config_reads_e2e.py (it replaced the name check that lived here: a key's last
name appearing somewhere in the code proved nothing about which section was read).
"""
from __future__ import annotations

import pytest

from rlhf_core.config import load_base
from rlhf_core.config.keys_doc import status_of
from rlhf_core.config.loader import CONFIG_NAMES
from rlhf_core.config.schema import EFFECT, NO_EFFECT_ON_CPU, NO_EFFECT_YET, all_paths


def test_effect_table_names_existing_keys_with_known_statuses():
    known = set().union(*(all_paths(load_base(n)) for n in CONFIG_NAMES))
    assert sorted(set(EFFECT) - known) == []
    assert {status for status, _ in EFFECT.values()} <= {NO_EFFECT_ON_CPU, NO_EFFECT_YET}
    assert all(why for _, why in EFFECT.values())


@pytest.mark.parametrize("path", ["reward_model.launch_reward_fn_async", "actor_rollout_ref.rollout.load_format"])
def test_unread_keys_are_not_called_supported(path):
    assert status_of("ppo_trainer", path).startswith(NO_EFFECT_YET)


@pytest.mark.parametrize("path", ["actor_rollout_ref.model.enable_activation_offload",
                                  "actor_rollout_ref.actor.use_torch_compile"])
def test_gpu_only_keys_say_so(path):
    assert status_of("ppo_trainer", path).startswith(NO_EFFECT_ON_CPU)


def test_ray_wait_timeout_is_supported():
    assert status_of("ppo_trainer", "trainer.ray_wait_register_center_timeout") == "supported"
