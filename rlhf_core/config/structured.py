"""Typed structured configs: one dataclass per YAML section, built from configs/*.yaml at first use.

Design decision: the shipped YAML stays the one place where keys and defaults are written. This
module builds, at import time of the first use (no generated code to keep in sync), a tree of
dataclasses registered with OmegaConf for each of ``ppo_trainer``, ``sft_trainer`` and
``evaluation``: one class per section, one field per key. A field's

* default is the YAML value as written (interpolations such as ``${data.max_prompt_length}`` kept);
* type is the type of its resolved default (bool, int, float, str, ``List[str]``...), or the entry of
  ``schema.TYPES`` for keys whose default is null or that take several types (several types →
  ``Any``); it is ``Optional`` when the default is null or the key is in ``schema.NULL_OK``;
  free-form dicts (``schema.OPEN_PATHS`` and empty-dict defaults) are ``Dict[str, Any]``.

Adding a key: write it, with its comment and default, in configs/<name>.yaml (add a ``schema.TYPES`` entry when
the default is null or the key takes several types, ``NULL_OK`` when a non-null default may be set to null,
``CHOICES`` for an enum, ``EFFECT``/``SUPPORT`` when it is not fully supported); read it in code by attribute;
run ``python -m rlhf_core.config.keys_doc > docs/CONFIG_KEYS.md``. No dataclass code to regenerate: the class
is built from the YAML at the next import. ``load_config`` merges the user's values into ``OmegaConf.structured(schema_class(name))``,
so a loaded config is complete, typed (an int key holds an int; assigning ``"x"`` to it raises) and
in struct mode (reading an unknown attribute raises).

Classes are module attributes named after their path (``ppo_trainer__actor_rollout_ref__actor``)
so pickle (Ray workers) finds them by reference; a process that has not built them yet builds them
on lookup (PEP 562 ``__getattr__`` below).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError
from .schema import NULL_OK, OPEN_PATHS, TYPES, flatten

SCHEMA_NAMES = ("ppo_trainer", "sft_trainer", "evaluation", "generation")
_SEP = "__"
_SCALARS = {bool: bool, int: int, float: float, str: str}


def _default_config_dir() -> Path:
    # same rule as loader.config_dir(); not imported from there to keep loader -> structured one-way
    env = os.environ.get("RLHF_CONFIG_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "configs"


def _list_type(items: list) -> Any:
    kinds = {type(v) for v in items}
    if kinds == {str}:
        return List[str]
    if kinds and kinds <= {int, float} and float in kinds:
        return List[float]
    if kinds == {int}:
        return List[int]
    return List[Any]


def field_type(path: str, default: Any) -> Any:
    """The python type of key ``path`` whose resolved YAML default is ``default`` (see module docstring)."""
    if path in OPEN_PATHS or isinstance(default, dict):
        hint: Any = Dict[str, Any]
    elif path in TYPES:
        types = TYPES[path]
        if types == (int, float):
            hint = float
        elif len(types) == 1 and types[0] in _SCALARS:
            hint = _SCALARS[types[0]]
        else:
            hint = Any
    elif default is None:
        return Any
    elif isinstance(default, list):
        hint = _list_type(default)
    else:
        hint = _SCALARS.get(type(default), Any)
    if hint is not Any and (default is None or path in NULL_OK):
        hint = Optional[hint]
    return hint


def _class_name(name: str, path: str) -> str:
    return _SEP.join([name] + (path.split(".") if path else []))


def _make_section(name: str, path: str, raw: dict, resolved: dict, out: dict[str, type]) -> type:
    """Build (depth first) the dataclass of section ``path`` and register it in ``out``."""
    fields = []
    for key, value in raw.items():
        sub = f"{path}.{key}" if path else key
        res = resolved[key]
        # a section whose keys are not python names (nsys's `cuda-memory-usage`) stays a Dict[str, Any] field
        if isinstance(value, dict) and value and sub not in OPEN_PATHS and all(str(k).isidentifier() for k in value):
            cls = _make_section(name, sub, value, res, out)
            fields.append((key, cls, dataclasses.field(default_factory=cls)))
            continue
        hint = field_type(sub, res)
        if isinstance(value, (dict, list)):
            fields.append((key, hint, dataclasses.field(default_factory=functools.partial(_copy, value))))
        else:
            fields.append((key, hint, dataclasses.field(default=value)))
    cls_name = _class_name(name, path)
    cls = dataclasses.make_dataclass(cls_name, fields)
    cls.__module__ = __name__
    cls.__qualname__ = cls_name
    cls.__doc__ = f"Section '{path or '<root>'}' of configs/{name}.yaml (built from the YAML, see {__name__})."
    out[cls_name] = cls
    return cls


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


@functools.lru_cache(maxsize=None)
def _build(name: str) -> type:
    if name not in SCHEMA_NAMES:
        raise ConfigError(f"No schema named '{name}'; known: {list(SCHEMA_NAMES)}")
    path = _default_config_dir() / f"{name}.yaml"
    raw_cfg = OmegaConf.load(path)
    raw = OmegaConf.to_container(raw_cfg, resolve=False)
    resolved = OmegaConf.to_container(raw_cfg, resolve=True)
    classes: dict[str, type] = {}
    root = _make_section(name, "", raw, resolved, classes)
    globals().update(classes)
    return root


def schema_class(name: str) -> type:
    """The root dataclass of configs/``name``.yaml (``ppo_trainer``, ``sft_trainer``, ``evaluation``).

    Built once per process from the YAML under ``RLHF_CONFIG_DIR`` (default the repo's configs/).
    ``OmegaConf.structured(schema_class(name))`` is the shipped config, typed, interpolations unresolved.
    Raises ConfigError for an unknown name.
    """
    return _build(name)


@functools.lru_cache(maxsize=None)
def _structured(name: str) -> DictConfig:
    return OmegaConf.structured(schema_class(name))


def typed_defaults(name: str) -> DictConfig:
    """A fresh ``OmegaConf.structured(schema_class(name))`` (a copy of a per-process cached one: building
    it costs ~0.5 s, copying it ~0.05 s)."""
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
    out: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            if dataclasses.is_dataclass(f.type) and isinstance(f.type, type):
                walk(f.type, prefix + f.name + ".")
            elif isinstance(default, dict) and default and prefix + f.name not in OPEN_PATHS:
                # a section kept as a dict because its keys are not python names: its leaves are schema keys
                out.update(prefix + f.name + "." + k for k in flatten(OmegaConf.create(default), resolve=False))
            else:
                out.add(prefix + f.name)
    walk(schema_class(name), "")
    return out


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


def __getattr__(attr: str) -> type:
    """Build the classes of a schema when pickle asks for one of them in a fresh process (PEP 562).

    A process without the YAML (a remote Ray worker with only the package) or with an older YAML gets an empty
    placeholder class of that name: unpickling needs only the class object, the values travel in the config, and
    reading them works; only re-validating assignments against the schema is lost there."""
    name = attr.split(_SEP, 1)[0]
    if name in SCHEMA_NAMES:
        try:
            _build(name)
        except (OSError, ConfigError):
            pass
        if attr not in globals():
            placeholder = dataclasses.make_dataclass(attr, [])
            placeholder.__module__, placeholder.__qualname__ = __name__, attr
            globals()[attr] = placeholder
        return globals()[attr]
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


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
