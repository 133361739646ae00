"""docs/CONFIG_KEYS.md is current, and the schema tables name only real keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhf_core.config import load_base
from rlhf_core.config.loader import CONFIG_NAMES
from rlhf_core.config.keys_doc import render_markdown, yaml_keys
from rlhf_core.config.schema import CHOICES, LIST_CHOICES, SUPPORT, TYPES, all_paths

DOC = Path(__file__).resolve().parents[2] / "docs" / "CONFIG_KEYS.md"


def test_doc_is_generated_from_current_configs():
    assert DOC.read_text(encoding="utf-8") == render_markdown(), \
        "stale: run `python -m rlhf_core.config.keys_doc > docs/CONFIG_KEYS.md`"


def test_doc_lists_every_leaf_key_once():
    ppo = [p for p, _, _ in yaml_keys("ppo_trainer")]
    assert len(ppo) == len(set(ppo))
    assert "actor_rollout_ref.actor.optim.lr_wsd_decay_style" in ppo
    assert "actor_rollout_ref.model.override_config.moe_config.freeze_moe_router" in ppo
    # every key of the doc exists in the loaded config
    paths = set(all_paths(load_base("ppo_trainer")))
    assert set(ppo) <= paths


@pytest.mark.parametrize("table", [SUPPORT, CHOICES, LIST_CHOICES, TYPES], ids=["SUPPORT", "CHOICES", "LIST", "TYPES"])
def test_schema_tables_name_existing_keys(table):
    # a typo in a table would silently check nothing
    known = set().union(*(all_paths(load_base(n)) for n in CONFIG_NAMES))
    assert sorted(set(table) - known) == []
