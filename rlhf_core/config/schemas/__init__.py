"""The config classes: one dataclass per section of each shipped config, every key declared once (spec.py).

``ROOTS`` maps a config name (``--config-name``) to the module and class of its root.
"""

from __future__ import annotations

import importlib

ROOTS = {"ppo_trainer": ("ppo_trainer", "PPOTrainerConfig"), "sft_trainer": ("sft_trainer", "SFTTrainerConfig"),
         "evaluation": ("evaluation", "EvaluationConfig"), "generation": ("generation", "GenerationConfig")}


def root_class(name: str) -> type:
    """The root dataclass of config ``name`` (a key of :data:`ROOTS`; KeyError otherwise)."""
    module, cls = ROOTS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def yaml_header(name: str) -> tuple[str, ...]:
    """The comment lines written at the top of rlhf_core/configs/``name``.yaml."""
    return importlib.import_module(f"{__name__}.{ROOTS[name][0]}").YAML_HEADER
