"""docs/CONFIG_KEYS.md lists every key once; every declared key has a help line (its doc text and YAML comment)."""

from __future__ import annotations


import pytest

from rlhf_core.config import load_base
from rlhf_core.config.keys_doc import yaml_keys
from rlhf_core.config.loader import CONFIG_NAMES
from rlhf_core.config.schema import all_paths, specs
from tests.paths import REPO

DOC = REPO / "docs" / "CONFIG_KEYS.md"


def test_doc_lists_every_leaf_key_once():
    ppo = [p for p, _, _ in yaml_keys("ppo_trainer")]
    assert len(ppo) == len(set(ppo))
    assert "actor_rollout_ref.actor.optim.lr_wsd_decay_style" in ppo
    assert "actor_rollout_ref.model.override_config.moe_config.freeze_moe_router" in ppo
    # every key of the doc exists in the loaded config
    paths = set(all_paths(load_base("ppo_trainer")))
    assert set(ppo) <= paths


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_every_key_has_help_and_every_row_is_in_the_doc(name):
    doc = DOC.read_text(encoding="utf-8")
    for spec in specs(name).values():
        assert spec.help.strip(), f"{name}: {spec.path} has no help text"
        assert f"| `{spec.path}` |" in doc
