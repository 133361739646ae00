"""Checks of a config against its classes (rlhf_core/config/schemas/, each key declared once: spec.py).

Before the user's values are merged into the typed config, every known key is checked against its
:class:`~rlhf_core.config.spec.KeySpec`: its type (the annotation, or ``types=`` for a key taking several types),
null, its choices (a registry's choices are the names registered now), and its support here (a key for a backend
we do not have is accepted at its default only). A typo (unknown key, wrong type, value outside an enum) fails with a
message naming the key. Cross-key rules (batch sizes against the world size) live in validate.py.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any, Iterable

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlhf_core.flat import flatten_tree

from .distillation import template_path
from .errors import ConfigError
from .spec import DEFAULT_ONLY, KeySpec, Registered, section_aliases, spec_table

CONFIG_NAMES = ("ppo_trainer", "sft_trainer", "evaluation", "generation")


@functools.lru_cache(maxsize=None)
def specs(name: str) -> dict[str, KeySpec]:
    """Dotted path -> :class:`KeySpec` of every key of config ``name`` (one of :data:`CONFIG_NAMES`).

    Raises:
        ConfigError: for an unknown name.
    """
    if name not in CONFIG_NAMES:
        raise ConfigError(f"No config named '{name}'; known: {list(CONFIG_NAMES)}")
    from .schemas import root_class

    return spec_table(root_class(name))


@functools.lru_cache(maxsize=None)
def alias_map(name: str) -> dict[str, str]:
    """Earlier path -> current path, for every key and section of config ``name`` declared with ``aliases``."""
    from .schemas import root_class

    out = {old: path for path, s in specs(name).items() for old in s.aliases}
    out.update(section_aliases(root_class(name)))
    return out


def renamed_path(path: str, name: str) -> str | None:
    """The current path of ``path`` when it is an earlier spelling of a key of config ``name`` (or lies inside one:
    a sub-key of a free-form dict), else None."""
    amap = alias_map(name)
    if path in amap:
        return amap[path]
    parent = next((a for a in amap if path.startswith(a + ".")), None)
    return None if parent is None else amap[parent] + path[len(parent):]


@functools.lru_cache(maxsize=None)
def open_paths() -> frozenset[str]:
    """Paths of the free-form dicts of every config (HF config overrides, engine kwargs): sub-keys unchecked."""
    return frozenset(p for n in CONFIG_NAMES for p, s in specs(n).items() if s.open)


def is_open(path: str) -> bool:
    """True when ``path`` lies strictly inside a free-form dict (its sub-keys are not checked)."""
    return any(path.startswith(p + ".") for p in open_paths())


def flatten(cfg: DictConfig, resolve: bool = True, prefix: str = "") -> dict[str, Any]:
    """Map every declared leaf of ``cfg`` to its dotted path: lists, empty dicts and the free-form dicts
    (:func:`open_paths`) are leaves (:func:`rlhf_core.flat.flatten_tree`, the one flattening)."""
    container = OmegaConf.to_container(cfg, resolve=resolve) if isinstance(cfg, DictConfig) else cfg
    return flatten_tree(container, prefix, whole=open_paths(), keep_empty=True)


def all_paths(cfg: DictConfig) -> list[str]:
    """Every dotted path in ``cfg``: leaves and the intermediate nodes."""
    paths: set[str] = set()
    for leaf in flatten(cfg, resolve=False):
        parts = leaf.split(".")
        paths.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return sorted(paths)


def nearest_key(path: str, candidates: Iterable[str]) -> str | None:
    """The valid key closest to a mistyped ``path`` (difflib), or None when nothing is close.

    Tries the whole dotted path first, then the last component against keys with the same
    parent, then the last component against every key's last component.
    """
    cands = list(candidates)
    hit = difflib.get_close_matches(path, cands, n=1, cutoff=0.75)
    if hit:
        return hit[0]
    parent, _, leaf = path.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in cands if c.rpartition(".")[0] == parent}
    hit = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6)
    if hit:
        return siblings[hit[0]]
    leaves: dict[str, str] = {}
    for c in cands:
        leaves.setdefault(c.rpartition(".")[2], c)
    hit = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75)
    return leaves[hit[0]] if hit else None


# A path component that names a backend we do not have -> that backend (for unknown keys of verl's other configs).
FOREIGN_BACKENDS = {"megatron": "Megatron", "sglang": "sglang", "npu": "Ascend NPU",
                    "nsys": "NVIDIA Nsight Systems (nsys)"}


def nearest_keys(path: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` valid keys close to a mistyped ``path``, the closest first (see :func:`nearest_key`)."""
    cands = list(candidates)
    best = nearest_key(path, cands)
    out = [best] if best else []
    out += difflib.get_close_matches(path, cands, n=n + 1, cutoff=0.6)
    parent, _, leaf = path.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in cands if c.rpartition(".")[0] == parent}
    out += [siblings[h] for h in difflib.get_close_matches(leaf, list(siblings), n=n, cutoff=0.6)]
    return list(dict.fromkeys(out))[:n]


def foreign_backend(path: str) -> str | None:
    """The backend we do not have that a key belongs to (a component named megatron, sglang, npu, nsys), or None."""
    return next((FOREIGN_BACKENDS[p] for p in path.split(".") if p in FOREIGN_BACKENDS), None)


def unknown_key_error(path: str, candidates: Iterable[str], hint: str = "") -> ConfigError:
    """A ConfigError for an unknown key that names the nearest valid keys, and the backend when the key
    belongs to one we do not have (``actor_rollout_ref.actor.megatron.*`` names Megatron)."""
    near = nearest_keys(path, candidates)
    msg = f"Unknown config key '{path}'."
    backend = foreign_backend(path)
    if backend:
        msg += f" It is read only by verl's {backend} backend, which this project does not have."
    msg += f" Did you mean '{near[0]}'?" if near else " No similar key exists."
    if len(near) > 1:
        msg += " Other close keys: " + ", ".join(f"'{k}'" for k in near[1:]) + "."
    return ConfigError(msg + hint)


def _type_name(types: tuple) -> str:
    return " or ".join(t.__name__ for t in types)


def _check_type(spec: KeySpec, value: Any) -> tuple[str | None, Any]:
    """Return (error or None, value with numbers coerced to str for str-typed keys)."""
    path, types = spec.path, spec.types
    if types is None:
        return None, value
    if value is None:
        ok = spec.null_ok
        return (None if ok else f"{path}=null: this key cannot be null (expected {_type_name(types)})"), value
    if isinstance(value, bool) and bool not in types:
        return f"{path}={value!r}: expected {_type_name(types)}, got a bool", value
    if isinstance(value, types):
        return None, value
    if str in types and isinstance(value, (int, float)):
        return None, str(value)  # a name like experiment_name=123 is a string, as in a structured config
    if value == "":  # `KEY=$VAR` in a launch script whose VAR is unset (verl 0.6's data.return_raw_chat=$return_raw_chat)
        return (f"{path}='': expected {_type_name(types)}, got an empty value (a shell variable the launch script "
                f"leaves unset?); write the value, or leave the key out for its default"), value
    return f"{path}={value!r}: expected {_type_name(types)}, got {type(value).__name__}", value


def _check_value(spec: KeySpec, value: Any, cfg: DictConfig | None = None) -> list[str]:
    errors, path = [], spec.path
    unless = spec.choices.conditions() if isinstance(spec.choices, Registered) else ()
    if cfg is not None and any(OmegaConf.select(cfg, k, default=None) == v for k, v in unless):
        return errors  # e.g. reward.reward_manager.source=importlib: a class name, checked when it is loaded
    if isinstance(spec.choices, Registered) and (value is None or spec.choices.accepts(value)):
        choices = None  # a registered name (see Registered.accepts)
    else:
        choices = spec.choice_values()
    if choices and value not in choices and value is not None:
        near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        errors.append(f"{path}={value!r} is not one of {list(choices)}.{hint}")
    if spec.item_choices:
        items = [value] if isinstance(value, str) else (value or [])
        bad = [v for v in items if v not in spec.item_choices]
        if bad:
            errors.append(f"{path}: {bad} not among the allowed values {list(spec.item_choices)}")
    return errors


def _same(value: Any, allowed: Any) -> bool:
    if isinstance(value, bool) or isinstance(allowed, bool):
        return type(value) is type(allowed) and value == allowed
    return value == allowed


def check_support(cfg: DictConfig, name: str, flat: dict[str, Any] | None = None) -> list[str]:
    """Error lines for keys of backends we do not have that are set away from what they accept (status "default
    only"), and for values (``backend_values``) that need such a backend; each line names the backend.
    ``flat``: ``flatten(cfg)`` when the caller has it (a key it lacks is looked up in ``cfg``)."""
    errors = []
    flat = flat or {}
    for path, spec in specs(name).items():
        if spec.backend_values is None and spec.status != DEFAULT_ONLY:
            continue
        if path in flat:
            value = flat[path]
        else:
            node = OmegaConf.select(cfg, path, default="<absent>")
            if isinstance(node, str) and node == "<absent>":
                continue
            value = OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node
        needs = spec.backend_values or {}
        if isinstance(value, str) and value in needs:
            errors.append(f"{path}={value!r} needs {needs[value]}, a backend this project does not have; "
                          f"use one of {[v for v in spec.choice_values() or () if v not in needs]} or null")
        elif spec.status == DEFAULT_ONLY and not any(_same(value, a) for a in spec.allowed):
            errors.append(f"{path}={value!r} is not supported yet ({spec.why}); accepted: {list(spec.allowed)}")
    return errors


def check_schema(cfg: DictConfig, name: str) -> list[str]:
    """Check every known key of resolved ``cfg`` against the specs of config ``name``.

    Types, null, choices and backend support are checked; keys added with '+' (absent from the config) and keys
    inside free-form dicts are not. Numbers given for string keys are converted to strings in ``cfg``. Returns
    the list of error lines.
    """
    table = specs(name)
    errors: list[str] = []
    flat = flatten(cfg, resolve=True)
    for path, value in flat.items():
        spec = table.get(path) or table.get(template_path(path) or "")  # an added teacher: teacher_model's
        if spec is None:
            continue
        err, fixed = _check_type(spec, value)
        if err:
            errors.append(err.replace(spec.path, path, 1))
            continue
        if fixed is not value:
            OmegaConf.update(cfg, path, fixed, merge=False)
            flat[path] = fixed
        errors.extend(_check_value(spec, value, cfg))
    return errors + check_support(cfg, name, flat)
