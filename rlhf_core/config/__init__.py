"""Configs: verl-compatible YAML (rlhf_core/configs/, package data), a typed schema, overrides, validation,
`rlhf config`.

Public API: load_config, apply_overrides, validate_ppo_config, validate_sft_config, config_dir,
shipped_config_dir, ConfigError. See docs/CONFIG_KEYS.md for every key and its status.
"""

from .errors import ConfigError
from .loader import CONFIG_NAMES, config_dir, load_base, load_config, resolved_yaml, shipped_config_dir
from .overrides import apply_overrides, parse_override, parse_value
from .validate import convert_deprecated, validate_ppo_config, validate_sft_config, world_size_of

__all__ = [
    "CONFIG_NAMES", "ConfigError", "apply_overrides", "config_dir", "convert_deprecated", "load_base",
    "load_config", "parse_override", "parse_value", "resolved_yaml", "shipped_config_dir",
    "validate_ppo_config", "validate_sft_config", "world_size_of",
]
