"""A key the docs call "supported" must be read by code.

docs/CONFIG_KEYS.md marks each key *supported*, *no effect on CPU*, *accepted, no effect yet* or *default only*
(``rlhf_core.config.schema.EFFECT`` / ``SUPPORT``). This guard fails when a key marked supported is read by
nothing: its last path component must occur in the non-config source (``rlhf_core/`` minus
``rlhf_core/config/``, ``infra/``, ``tasks/``, ``flows/``) as an attribute access (``cfg.key``) or a string
literal (``cfg.get("key")``, ``cfg["key"]``, or one component of a dotted ``"section.key"``). Log messages and
docstrings do not count (the whole string must equal the name). It is a name check, not a proof of effect:
a new key either gets code that reads it, an ``EFFECT`` status, or an entry in ``READ_GENERICALLY`` below.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

from rlhf_core.config import load_base
from rlhf_core.config.keys_doc import status_of, yaml_keys
from rlhf_core.config.loader import CONFIG_NAMES
from rlhf_core.config.schema import EFFECT, NO_EFFECT_ON_CPU, NO_EFFECT_YET, all_paths

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("rlhf_core", "infra", "tasks", "flows")

# Supported keys read without their name appearing in code: config name -> {path: where it is read}.
READ_GENERICALLY: dict[str, dict[str, str]] = {
    "ppo_trainer": {
        # through the interpolation actor_rollout_ref.rollout.response_length: ${data.max_response_length}
        # (configs/ppo_trainer.yaml; the rollouts read rollout.response_length) and checked > 0 by
        # rlhf_core/config/validate.py
        "data.max_response_length": "configs/ppo_trainer.yaml interpolation -> rollout.response_length",
        # deprecated global size, converted to critic.forward_micro_batch_size_per_gpu by
        # rlhf_core/config/validate.py (_PPO_MICRO table) before any worker reads the config
        "critic.forward_micro_batch_size": "rlhf_core/config/validate.py _PPO_MICRO conversion",
    },
}


@lru_cache(maxsize=1)
def read_names() -> frozenset[str]:
    """Attribute names and string literals (plus the components of dotted ones) of the non-config source."""
    names: set[str] = set()
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.is_relative_to(ROOT / "rlhf_core" / "config"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute):
                    names.add(node.attr)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
                    names.add(node.value)
                    names.update(node.value.split("."))
    return frozenset(names)


def _supported(name: str) -> list[str]:
    return [p for p, _, _ in yaml_keys(name) if status_of(name, p).startswith("supported")]


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_every_supported_key_is_read_by_code(name):
    allowed = READ_GENERICALLY.get(name, {})
    unread = [p for p in _supported(name) if p not in allowed and p.rsplit(".", 1)[-1] not in read_names()]
    assert unread == [], (f"{name}.yaml keys marked 'supported' that no code reads: {unread}. Make them have "
                          f"effect, or give them an honest status in rlhf_core/config/schema.py EFFECT "
                          f"('{NO_EFFECT_YET}' / '{NO_EFFECT_ON_CPU}') and regenerate docs/CONFIG_KEYS.md")


def test_allow_list_is_short_and_current():
    # every entry is a supported key that really is missing from the code (else the entry is stale)
    for name, entries in READ_GENERICALLY.items():
        assert len(entries) <= 5
        for path in entries:
            assert path in _supported(name), path
            assert path.rsplit(".", 1)[-1] not in read_names(), f"{path} is read by name now; drop its entry"


def test_effect_table_names_existing_keys_with_known_statuses():
    known = set().union(*(all_paths(load_base(n)) for n in CONFIG_NAMES))
    assert sorted(set(EFFECT) - known) == []
    assert {status for status, _ in EFFECT.values()} <= {NO_EFFECT_ON_CPU, NO_EFFECT_YET}
    assert all(why for _, why in EFFECT.values())


@pytest.mark.parametrize("path", ["reward_model.model.use_remove_padding", "actor_rollout_ref.rollout.load_format"])
def test_unread_keys_are_not_called_supported(path):
    assert status_of("ppo_trainer", path).startswith(NO_EFFECT_YET)


@pytest.mark.parametrize("path", ["actor_rollout_ref.model.enable_activation_offload",
                                  "actor_rollout_ref.actor.use_torch_compile"])
def test_gpu_only_keys_say_so(path):
    assert status_of("ppo_trainer", path).startswith(NO_EFFECT_ON_CPU)


def test_ray_wait_timeout_is_supported_and_read():
    assert status_of("ppo_trainer", "trainer.ray_wait_register_center_timeout") == "supported"
    assert "ray_wait_register_center_timeout" in read_names()
