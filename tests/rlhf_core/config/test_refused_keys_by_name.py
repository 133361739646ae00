"""Keys whose effect needs a backend this project does not have are refused by name when set away from their
default (issue #35): the open sections of the generative reward model's engine and verl 0.9's v1 trainer loop, and
the rollout's MoE load-balance metrics."""
from __future__ import annotations

import pytest

from rlhf_core.config import load_config


@pytest.mark.parametrize("override,reason", [
    ("reward.reward_model.rollout.engine_kwargs={a: 1}", "generative reward model"),
    ("trainer.v1.sync={x: 2}", "v1 trainer loop"),
    ("trainer.v1.sampler.sampler_kwargs={k: 1}", "v1 trainer loop"),
    ("actor_rollout_ref.rollout.moe_load_balance_metrics_interval=5", "MoE load-balance metrics"),
])
def test_refused_by_name_away_from_the_default(override, reason):
    key = override.split("=")[0]
    with pytest.raises(Exception, match=rf"{key}=.*{reason}"):
        load_config("ppo_trainer", [override])


def test_defaults_load():
    cfg = load_config("ppo_trainer", [])
    assert cfg.trainer.v1.sync == {} and cfg.actor_rollout_ref.rollout.moe_load_balance_metrics_interval == 0
