"""Typed structured configs: the loaded config is backed by the config classes of rlhf_core/config/schemas/.

``load_config`` merges the user's values into ``OmegaConf.structured(schema_class(name))``, so a loaded config is
complete, typed (an int key holds an int; assigning ``"x"`` to it raises) and in struct mode (reading an unknown
attribute raises). The classes are ordinary importable dataclasses, so pickle (Ray workers) finds them by reference.
Adding a key: declare it once in its class with :func:`rlhf_core.config.spec.key` (default, help, status), read it in
code by attribute, run ``python -m rlhf_core.config.gen_yaml`` (rewrites rlhf_core/configs/*.yaml and
docs/CONFIG_KEYS.md).
"""

from __future__ import annotations

import copy
import dataclasses
import functools

from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError
from .schema import CONFIG_NAMES, specs

SCHEMA_NAMES = CONFIG_NAMES


def schema_class(name: str) -> type:
    """The root dataclass of config ``name`` (``ppo_trainer``, ``sft_trainer``, ``evaluation``, ``generation``).

    ``OmegaConf.structured(schema_class(name))`` is the shipped config, typed, interpolations unresolved.
    Raises ConfigError for an unknown name.
    """
    if name not in CONFIG_NAMES:
        raise ConfigError(f"No schema named '{name}'; known: {list(CONFIG_NAMES)}")
    from .schemas import root_class

    return root_class(name)


@functools.lru_cache(maxsize=None)
def _structured(name: str) -> DictConfig:
    return OmegaConf.structured(schema_class(name))


def shipped_defaults(name: str) -> DictConfig:
    """The defaults of config ``name`` as declared (``1`` stays an int for a float key, so messages quote values as
    written), in a plain (untyped, not struct) DictConfig, interpolations unresolved."""
    return OmegaConf.create(dataclasses.asdict(schema_class(name)()))


def typed_defaults(name: str) -> DictConfig:
    """A fresh ``OmegaConf.structured(schema_class(name))`` (a copy of a per-process cached one: building
    it costs about ten times what copying it does)."""
    return open_free_form(copy.deepcopy(_structured(name)))


def open_free_form(cfg: DictConfig) -> DictConfig:
    """Let every free-form dict of ``cfg`` (a ``Dict[str, Any]`` field: chat-template kwargs, reward kwargs,
    engine kwargs...) take new sub-keys while the typed sections stay in struct mode; returns ``cfg``."""
    for key in cfg.keys():
        node = cfg._get_node(key)
        if isinstance(node, DictConfig) and not node._is_none() and not node._is_missing():
            if OmegaConf.get_type(node) is dict:
                OmegaConf.set_struct(node, False)
            else:
                open_free_form(node)
    return cfg


def schema_paths(name: str) -> set[str]:
    """Every dotted leaf path of the schema ``name`` (free-form dicts count as one leaf)."""
    return set(specs(name))


def to_typed(name: str, cfg: DictConfig) -> DictConfig:
    """Merge resolved ``cfg`` (every key a schema key) into the typed schema; struct mode, resolved.

    Values are converted to the field types (an int given for a float key becomes a float). Raises
    ConfigError naming the key when a value does not fit its type or a key is not in the schema.
    """
    try:
        typed = typed_defaults(name)
        typed.merge_with(cfg)
        OmegaConf.resolve(typed)
    except Exception as exc:  # omegaconf's ValidationError / ConfigKeyError carry the full key
        raise ConfigError(f"Config does not fit the typed schema of {name}.yaml: {exc}") from exc
    OmegaConf.set_struct(typed, True)
    return open_free_form(typed)


def full_key(node: Any, key: str) -> str:
    """The dotted path of ``node[key]`` in its config (``actor_rollout_ref.actor.fsdp_config.fsdp_size``) when
    ``node`` is a section of a loaded config, else ``key``: error messages name the key the user must change."""
    if isinstance(node, DictConfig):
        return node._get_full_key(key)  # omegaconf's own path bookkeeping (public in spirit, underscored in name)
    return key


ROLE_NAMES = {"actor": "actor", "ref": "reference", "critic": "critic", "rm": "reward model",
              "reward_model": "reward model", "sft": "SFT model", "rollout": "rollout"}


def role_name(role: str) -> str:
    """The reader's name of a worker role (``ref`` → ``reference``, ``rm`` → ``reward model``)."""
    return ROLE_NAMES.get(role, role)
