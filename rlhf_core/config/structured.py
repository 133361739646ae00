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
from typing import Any

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


def fresh_copy(cfg: DictConfig) -> DictConfig:
    """A deep copy of ``cfg`` (one of this module's per-process cached configs, kept read-only so no caller can
    change it), writable again; copying costs ~0.1 s for ppo_trainer, building ~0.2-0.5 s."""
    out = copy.deepcopy(cfg)
    OmegaConf.set_readonly(out, None)
    return out


@functools.lru_cache(maxsize=None)
def shared_shipped_defaults(name: str) -> DictConfig:
    """:func:`shipped_defaults`, built once per process and read-only: for readers that never change it
    (``load_config``'s base); :func:`fresh_copy` gives a writable copy."""
    cfg = OmegaConf.create(dataclasses.asdict(schema_class(name)()))
    OmegaConf.set_readonly(cfg, True)
    return cfg


def shipped_defaults(name: str) -> DictConfig:
    """The defaults of config ``name`` as declared (``1`` stays an int for a float key, so messages quote values as
    written), in a plain (untyped, not struct) DictConfig, interpolations unresolved; a fresh copy each call."""
    return fresh_copy(shared_shipped_defaults(name))


@functools.lru_cache(maxsize=None)
def _resolved_shipped(name: str) -> dict:
    """The shipped defaults of ``name`` resolved, as plain containers (read only: never hand it out)."""
    return OmegaConf.to_container(shipped_defaults(name), resolve=True)


@functools.lru_cache(maxsize=None)
def _typed_resolved(name: str) -> DictConfig:
    """:func:`typed_defaults` resolved, read-only (the typed config every load starts from)."""
    typed = typed_defaults(name)
    OmegaConf.resolve(typed)
    OmegaConf.set_readonly(typed, True)
    return typed


def typed_defaults(name: str) -> DictConfig:
    """A fresh ``OmegaConf.structured(schema_class(name))`` (a copy of a per-process cached one: building
    it costs about ten times what copying it does)."""
    return open_free_form(copy.deepcopy(_structured(name)))


_ABSENT = object()


def _same_value(a: Any, b: Any) -> bool:
    """``a == b`` with equal types all the way down (``1``, ``1.0`` and ``True`` differ: merged into a typed node
    they convert or fail differently)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


def _changed(values: dict, defaults: Any) -> dict:
    """The part of plain ``values`` that differs from plain ``defaults`` (same nesting; a list or a value whose type
    or value differs is kept whole)."""
    out = {}
    for key, value in values.items():
        default = defaults.get(key, _ABSENT) if isinstance(defaults, dict) else _ABSENT
        if isinstance(value, dict) and value and isinstance(default, dict):
            sub = _changed(value, default)
            if sub:
                out[key] = sub
        elif not _same_value(value, default):
            out[key] = value
    return out


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


PASS_THROUGH = ("ray_kwargs.ray_init", "ray_kwargs.ray_init.runtime_env")
"""Typed sections that also take keys the schema does not declare: verl hands ``ray_kwargs.ray_init`` to
``ray.init`` whole; each such key is checked against ``ray.init``'s signature at load
(:func:`rlhf_core.config.ray_kwargs.ray_init_key_error`) and passed on by ``ray_init_extra``."""


def to_typed(name: str, cfg: DictConfig) -> DictConfig:
    """Merge resolved ``cfg`` (every key a schema key) into the typed schema; struct mode, resolved.

    Values are converted to the field types (an int given for a float key becomes a float). Raises
    ConfigError naming the key when a value does not fit its type or a key is not in the schema.
    """
    try:
        # Only the values that differ from the resolved shipped defaults are merged, into the typed defaults resolved
        # once per process: the same config as merging every key into unresolved typed defaults (each of those keys
        # overwrites its default, interpolations included), without re-validating ~950 unchanged leaves each load.
        changed = _changed(OmegaConf.to_container(cfg, resolve=True), _resolved_shipped(name))
        typed = fresh_copy(_typed_resolved(name))
        # sections handed whole to a library call: any of its arguments (checked at load); the distillation teachers:
        # named entries added beside teacher_model, each key checked as teacher_model's (rlhf_core/config/distillation.py)
        for path in PASS_THROUGH + ("distillation.teacher_models",):
            node = OmegaConf.select(typed, path)
            if isinstance(node, DictConfig):
                OmegaConf.set_struct(node, False)
        typed.merge_with(changed)
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
