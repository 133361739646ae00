"""verl / Hydra command-line overrides: ``a.b=v``, ``+a.new=v``, ``++a.b=v``, ``~a.b``, through Hydra's own parser.

verl reads its command line with Hydra, so an override means here exactly what it means there: the text is
parsed by ``hydra.core.override_parser.overrides_parser.OverridesParser`` (Hydra's ANTLR grammar: quoting,
escapes such as ``a\\,b``, ``null``/``true``/numbers, lists ``[a,b]``, dicts ``{k: v}``, interpolations
``${data.x}`` kept for later resolution, casts like ``int(3.0)``) and applied to the config with the rules of
Hydra's ``ConfigLoaderImpl._apply_overrides_to_config`` (see :func:`apply_overrides`). What is ours: the errors
(an unknown key names the nearest known keys), free-form dicts (``schema.open_paths()``, e.g.
``custom_reward_function.reward_kwargs={format_score: 0.1}``) taking new sub-keys without ``+``, and refusing a sweep (``a=1,2``, which needs ``--multirun``) or a
config-group package (``a@pkg=v``) with one line that says what to write instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from .errors import ConfigError
from .schema import all_paths, is_open, open_paths, unknown_key_error

_OPS = {OverrideType.CHANGE: "set", OverrideType.ADD: "add", OverrideType.FORCE_ADD: "force",
        OverrideType.DEL: "delete"}
_PARSER: OverridesParser | None = None


def _parser() -> OverridesParser:
    global _PARSER
    if _PARSER is None:
        _PARSER = OverridesParser.create()
    return _PARSER


@dataclass(frozen=True)
class Override:
    """One parsed override. ``op``: set | add (``+``) | force (``++``) | delete (``~``); ``has_value`` is False for
    a delete without a value to check (``~a.b``, or ``~a.b=null`` as in Hydra)."""

    op: str
    key: str
    value: Any = None
    has_value: bool = True
    text: str = ""


def parse_override(text: str) -> Override:
    """Parse ``text`` (``[+|++|~]dotted.key[=value]``) with Hydra's override grammar into an Override.

    Raises ConfigError naming the override when Hydra cannot parse it, when it is a sweep (``a=1,2``) or a
    config-group package override (``a@pkg=v``).
    """
    try:
        parsed = _parser().parse_override(text.strip())
    except HydraException as exc:  # OverrideParseException and the grammar errors under it
        hint = "" if "=" in text else " (an override is KEY=VALUE, e.g. trainer.total_epochs=2)"
        raise ConfigError(f"Cannot parse override '{text}'{hint}: {exc}") from exc
    key = parsed.key_or_group
    if parsed.is_sweep_override():
        raise ConfigError(
            f"Ambiguous value in override '{text}': an unquoted ',' (or a sweep function) is a Hydra sweep, which "
            "is not supported. Use brackets for a list (key=[a,b]) or quotes for a string (key='a,b').")
    if parsed.package is not None:
        raise ConfigError(f"Override '{text}' looks like a config-group override ('{key}@{parsed.package}'); "
                          f"this config has no config groups: write '{key}=...'")
    value = parsed.value()
    return Override(_OPS[parsed.type], key, value, value is not None or parsed.type != OverrideType.DEL, text)


def parse_value(text: str, origin: str = "") -> Any:
    """Parse an override's right-hand side into a python value, as Hydra does for ``key=<text>``.

    Raises ConfigError (naming ``origin``, default ``text``) on what :func:`parse_override` refuses.
    """
    try:
        return parse_override(f"key={text}").value
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("'key=" + text + "'", f"'{origin or text}'")) from exc


def _exists(cfg: DictConfig, key: str) -> bool:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
    return True


def _apply_one(cfg: DictConfig, ov: Override) -> None:
    """One override with Hydra's rules (``ConfigLoaderImpl._apply_overrides_to_config``): a set merges into the
    existing value; ``+`` is allowed where the current value is null or missing, or the value is a dict or list
    (then merged); ``++`` always sets (merging); ``~`` needs a non-null current value, equal to the given one."""
    current = OmegaConf.select(cfg, ov.key, throw_on_missing=False)
    if ov.op == "set":
        try:
            if ov.key in open_paths() or is_open(ov.key):  # ours: a free-form dict takes new sub-keys without '+'
                with open_dict(cfg):
                    OmegaConf.update(cfg, ov.key, ov.value, merge=True)
            else:
                OmegaConf.update(cfg, ov.key, ov.value, merge=True)
        except (ConfigAttributeError, ConfigKeyError) as exc:
            if _exists(cfg, ov.key):  # a dict value with keys the existing dict lacks (Hydra refuses it too)
                raise ConfigError(f"Could not override '{ov.key}' (override '{ov.text}'): {exc}. To add keys to "
                                  f"it use '+{ov.text}'") from exc
            raise unknown_key_error(ov.key, all_paths(cfg), f" (override '{ov.text}')") from exc
    elif ov.op == "add":
        if current is not None and not isinstance(ov.value, (dict, list)):
            raise ConfigError(f"Could not append to config: an item is already at '{ov.key}' (override "
                              f"'{ov.text}'). Use '{ov.key}=...' to change it or '++{ov.key}=...' to force.")
        OmegaConf.update(cfg, ov.key, ov.value, merge=True, force_add=True)
    elif ov.op == "force":
        OmegaConf.update(cfg, ov.key, ov.value, merge=True, force_add=True)
    else:
        if current is None:
            if _exists(cfg, ov.key):
                raise ConfigError(f"Could not delete '{ov.key}' (override '{ov.text}'): its value is null, which "
                                  f"Hydra (and so verl) treats as absent; set it instead ('{ov.key}=...').")
            raise unknown_key_error(ov.key, all_paths(cfg), f" (override '{ov.text}': nothing to delete)")
        if ov.has_value and current != ov.value:
            raise ConfigError(f"Could not delete '{ov.key}' (override '{ov.text}'): its value is {current!r}, "
                              f"not {ov.value!r}")
        parent_key, _, leaf = ov.key.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        with open_dict(cfg):
            del parent[leaf]


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """Apply verl/Hydra overrides to ``cfg`` in order, in place, and return it.

    ``a.b=v`` sets an existing key, merging a dict into a dict (an unknown key raises ConfigError naming the
    nearest valid one); ``+a.b=v`` adds a key (error if it holds a non-null value and ``v`` is not a dict or list,
    like Hydra); ``++a.b=v`` sets or adds; ``~a.b`` / ``~a.b=v`` deletes (the key must hold a non-null value;
    with a value, it must match). Interpolations are left unresolved so they see later overrides. ``cfg`` is put
    in struct mode, as Hydra's composed config is.
    """
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of strings, not one string")
    OmegaConf.set_struct(cfg, True)
    for text in overrides:
        ov = parse_override(text)
        try:
            _apply_one(cfg, ov)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"Could not apply override '{text}': {exc}") from exc
    return cfg
