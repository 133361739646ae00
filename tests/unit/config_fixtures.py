"""One way for tests to build configs: the full typed config from the schema, plus overrides.

``typed_config("ppo_trainer", "data.seed=0", ...)`` is ``rlhf_core/configs/ppo_trainer.yaml`` as the typed structured
config (every key present, typed, struct mode) with verl-style overrides applied and interpolations resolved.
Unlike ``load_config`` it skips the batch-size rules, so unit tests can build a worker's section with small
sizes without making the whole PPO config consistent. ``section(name, path, **values)`` returns one
section (e.g. ``actor_rollout_ref.actor``) with ``values`` set on it.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlhf_core.config import apply_overrides
from rlhf_core.config.structured import typed_defaults


def typed_config(name: str = "ppo_trainer", *overrides: str) -> DictConfig:
    """The whole typed config ``name`` with ``overrides`` (``a.b=v``; '+' keys are refused by the schema)."""
    cfg = typed_defaults(name)
    apply_overrides(cfg, list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


def section(name: str, path: str, **values: Any) -> DictConfig:
    """Section ``path`` of the typed config ``name`` with ``values`` assigned (nested dicts merge).

    The section keeps its parent, so interpolations and full-path reads still work."""
    node = OmegaConf.select(typed_config(name), path)
    for key, value in values.items():
        if isinstance(value, dict):
            node[key].merge_with(value)
        else:
            OmegaConf.update(node, key, value, merge=False)
    return node
