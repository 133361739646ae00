"""How a config key is declared, once: a dataclass field carrying its default, type, help and status.

The config classes (``rlhf_core/config/schemas/``) are plain dataclasses, one per section, in the style of verl
0.9's ``verl/workers/config/*.py`` and TRL's ``GRPOConfig`` (a ``help`` per field). Each leaf is declared with
:func:`key`, which stores everything known about the key in the field's ``metadata``:

* the default (as verl writes it: ``${data.max_prompt_length}`` interpolations are kept) and the annotation
  (``int``, ``Optional[float]``, ``List[str]``; ``Any`` plus ``types=`` for a key taking several types);
* ``help``: one line, the comment written above the key in the generated YAML and the documentation;
* ``choices``: allowed values (a tuple, or :func:`registered` for a registry: the names registered when the
  config is checked, so a user's ``register_adv_est`` name is accepted); ``item_choices`` for list items;
* its status here: supported (nothing to declare), ``no_effect_yet=`` / ``no_effect_on_cpu=`` (accepted, does
  nothing, with what happens instead), or ``only=`` + ``why=`` (accepted at those values only: a backend we do not
  have); ``backend_values`` names values that need such a backend;
* ``same_as``: another spelling of the same setting, both in the config (the reference's ``ray_init`` and verl
  0.6's ``ray_kwargs.ray_init``); both are kept equal on load; ``aliases``: earlier paths of the key, not in the
  config (verl renamed or moved it), read as the key with one notice; ``engine``: the rollout engine that alone reads the key; ``ours``: not a verl key.

Everything else is generated from these classes: the YAML in ``rlhf_core/configs/`` (:mod:`.gen_yaml`), the table in
``docs/CONFIG_KEYS.md`` (:mod:`.keys_doc`), the type/choice/support checks (:mod:`.schema`) and the notices for
keys without effect (:mod:`.notices`). :func:`specs` flattens a config class into one :class:`KeySpec` per
dotted path.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import typing
from dataclasses import dataclass, field
from typing import Any

NO_EFFECT_ON_CPU = "no effect on CPU"
NO_EFFECT_YET = "accepted, no effect yet"
DEFAULT_ONLY = "default only"
SUPPORTED = "supported"

# registry kind -> (module, function returning the registered names). Imported at check time only.
REGISTRIES: dict[str, tuple[str, str]] = {
    "adv_estimator": ("rlhf_core.algos", "registered_adv_estimators"),
    "policy_loss": ("rlhf_core.algos", "registered_policy_losses"),
    "reward_manager": ("rlhf_core.reward.loader", "registered_reward_managers"),
    "tool_parser": ("rlhf_core.tools.parser", "registered_tool_parsers"),
}


@dataclass(frozen=True)
class Registered:
    """Choices that are the names in a registry (``kind``: a key of :data:`REGISTRIES`), read when checked.
    ``unless``: ``(dotted key, value)``, or a tuple of them: when a key holds its value, any name is accepted here (verl 0.9's
    ``reward.reward_manager.source=importlib`` names a class in a file instead of a registered manager)."""

    kind: str
    unless: tuple | None = None

    def conditions(self) -> tuple[tuple[str, Any], ...]:
        """``unless`` as a tuple of ``(dotted key, value)`` pairs (empty when None)."""
        if not self.unless:
            return ()
        return (self.unless,) if isinstance(self.unless[0], str) else tuple(self.unless)

    def names(self) -> tuple[str, ...]:
        """The names registered now (importing the module that owns the registry, and with it torch)."""
        module, fn = REGISTRIES[self.kind]
        return tuple(getattr(importlib.import_module(module), fn)())

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is a registered name. A built-in name is answered from the generated index
        (``schemas/_registered.py``, kept current by tests/rlhf_core/config/test_config_generated.py) without importing the
        registry's module: that import pulls in torch (seconds), and ``rlhf config check`` of a built-in
        estimator should not pay it. Any other value is looked up in the live registry."""
        from .schemas._registered import BUILTIN

        return value in BUILTIN[self.kind] or value in self.names()


def registered(kind: str, unless: tuple | None = None) -> Registered:
    """Choices read from the registry ``kind`` (a key of :data:`REGISTRIES`); ``unless``: see :class:`Registered`."""
    if kind not in REGISTRIES:
        raise KeyError(f"no registry {kind!r}; known: {sorted(REGISTRIES)}")
    return Registered(kind, unless)


def key(default: Any, help: str, *, types: tuple | None = None, choices: tuple | Registered | None = None,
        item_choices: tuple | None = None, only: tuple | None = None, why: str | None = None,
        no_effect_yet: str | None = None, no_effect_on_cpu: str | None = None,
        backend_values: dict[Any, str] | None = None, same_as: str | None = None, engine: str | None = None,
        ours: bool = False, leaf_help: dict[str, str] | None = None, aliases: tuple[str, ...] = (),
        null_ok: bool = False, verl_default: Any = None, differs: str | None = None) -> Any:
    """A dataclass field for one config key (see the module docstring for each argument).

    ``only=None`` with ``why`` set means "accepted at its default only". A dict default with ``leaf_help`` is a
    fixed section whose keys are not Python names (nsys's ``cuda-memory-usage``): each of its keys is a config
    key with that help. ``aliases``: earlier dotted paths of this key (verl renamed or moved it); a user file or
    override that sets one is read as this key, with one notice naming it. ``null_ok``: null is accepted though the
    default is not null, for a key whose annotation is ``Any`` (several types; otherwise write ``Optional[...]``).
    ``differs``: why our default is not verl 0.9.1's, which is ``verl_default`` (the reference's default wins, or a
    CPU/product reason); tests/rlhf_core/config/test_config_verl091.py holds every other key to verl's default.
    Mutable defaults are copied per instance.
    """
    meta = {"help": help, "types": types, "choices": choices, "item_choices": item_choices, "only": only,
            "why": why, "no_effect_yet": no_effect_yet, "no_effect_on_cpu": no_effect_on_cpu,
            "backend_values": backend_values, "same_as": same_as, "engine": engine, "ours": ours,
            "leaf_help": leaf_help, "aliases": tuple(aliases), "null_ok": null_ok}
    if differs is not None:
        meta["verl_default"] = (verl_default, differs)
    if isinstance(default, (list, dict)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata=meta)
    return field(default=default, metadata=meta)


def free_form(help: str, default: dict | None = None, *, ours: bool = False, **status: Any) -> Any:
    """A ``Dict[str, Any]`` field whose sub-keys are not checked (HF config overrides, engine kwargs)."""
    return field(default_factory=functools.partial(copy.deepcopy, default or {}),
                 metadata={"help": help, "open": True, "ours": ours, **status})


def free_form_or_null(help: str, **status: Any) -> Any:
    """An ``Optional[Dict[str, Any]]`` field, null by default, whose sub-keys are not checked (extra keyword
    arguments handed to a library, which checks them itself: ``optim.override_optimizer_config``)."""
    return field(default=None, metadata={"help": help, "open": True, **status})


def follower(default: str, help: str, **status: Any) -> Any:
    """A ``Dict[str, Any]`` field whose default interpolates a whole section (``${oc.select:a.b.qat,null}``): verl's
    copy of another section, one leaf here (its sub-keys are the followed section's, checked there)."""
    return field(default=default, metadata={"help": help, "open": True, **status})


def section(cls: type, help: str = "", aliases: tuple[str, ...] = ()) -> Any:
    """A field holding the section dataclass ``cls``; ``help`` is the comment above it in the YAML; ``aliases``:
    earlier dotted paths of the whole section (verl moved it), each key below one read as the key below this."""
    return field(default_factory=cls, metadata={"help": help, "aliases": tuple(aliases)})


class SectionErrors(ValueError):
    """Raised by a section's ``__post_init__`` (its checks that involve that section only): one line per broken
    rule, each naming its keys as ``{section}.<key>``; :func:`rlhf_core.config.validate.section_errors` puts the
    section's dotted path in their place."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


def check_section(errors: list[str]) -> None:
    """Raise :class:`SectionErrors` when ``errors`` is not empty (the end of a section's ``__post_init__``)."""
    if errors:
        raise SectionErrors(errors)


def trainer_errors(trainer: Any) -> list[str]:
    """The rules of a ``trainer`` section both trainers share (``ppo_trainer`` and ``sft_trainer``): resume_path
    needs resume_from_path; ``total_training_steps`` is null (the dataloader's batches × ``total_epochs``) or >= 1
    (verl takes any non-null value as the step count, so a negative one is refused, not read as "use epochs")."""
    errors = ["{section}.resume_mode=resume_path needs {section}.resume_from_path, got null."] \
        if trainer.resume_mode == "resume_path" and not trainer.resume_from_path else []
    steps = trainer.total_training_steps
    if number(steps) and steps < 1:
        errors.append(f"{{section}}.total_training_steps={steps} must be >= 1, or null for the dataloader's batches "
                      f"× {{section}}.total_epochs.")
    return errors


def number(value: Any) -> bool:
    """True for an int or float value (not a bool, not an unresolved ``${...}`` default)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class KeySpec:
    """Everything declared about one config key (a leaf, or a free-form dict), with its dotted ``path``.

    ``types`` is the tuple of Python types its values may have (None: unchecked); ``null_ok`` whether null is
    accepted; ``status`` one of :data:`SUPPORTED`, :data:`NO_EFFECT_ON_CPU`, :data:`NO_EFFECT_YET`,
    :data:`DEFAULT_ONLY`, with ``why`` saying what happens instead (or why other values are refused).
    """

    path: str
    default: Any
    help: str
    types: tuple | None
    null_ok: bool
    choices: tuple | Registered | None
    item_choices: tuple | None
    status: str
    why: str | None
    allowed: tuple | None
    backend_values: dict | None
    open: bool
    same_as: str | None
    engine: str | None
    ours: bool
    aliases: tuple[str, ...] = ()
    verl: tuple | None = None  # (verl 0.9.1's default, why ours differs), declared with differs=

    def choice_values(self) -> tuple | None:
        """The allowed values now (a registry's names are read at this call), or None when any value goes."""
        return self.choices.names() if isinstance(self.choices, Registered) else self.choices


_SCALAR_TYPES = {bool: (bool,), int: (int,), float: (int, float), str: (str,), list: (list,), dict: (dict,)}


def _types_of(annotation: Any, declared: tuple | None) -> tuple[tuple | None, bool]:
    """(accepted python types or None, whether the annotation allows None) of a field annotation."""
    optional = False
    if typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else Any
    if annotation is Any:
        return declared, optional
    origin = typing.get_origin(annotation) or annotation
    return _SCALAR_TYPES.get(origin, (origin,)), optional


def _status(meta: dict) -> tuple[str, str | None, tuple | None]:
    if meta.get("why") is not None:
        return DEFAULT_ONLY, meta["why"], meta.get("only")
    if meta.get("no_effect_on_cpu"):
        return NO_EFFECT_ON_CPU, meta["no_effect_on_cpu"], None
    if meta.get("no_effect_yet"):
        return NO_EFFECT_YET, meta["no_effect_yet"], None
    return SUPPORTED, None, None


def _leaf(path: str, f: dataclasses.Field, hint: Any, default: Any) -> KeySpec:
    meta = dict(f.metadata)
    types, optional = _types_of(hint, meta.get("types"))
    status, why, allowed = _status(meta)
    if status == DEFAULT_ONLY and allowed is None:
        allowed = (default,)
    return KeySpec(path=path, default=default, help=meta.get("help", ""), types=types,
                   null_ok=optional or default is None or types is None or bool(meta.get("null_ok")), choices=meta.get("choices"),
                   item_choices=meta.get("item_choices"), status=status, why=why, allowed=allowed,
                   backend_values=meta.get("backend_values"), open=bool(meta.get("open")),
                   same_as=meta.get("same_as"), engine=meta.get("engine"), ours=bool(meta.get("ours")),
                   aliases=tuple(meta.get("aliases") or ()), verl=meta.get("verl_default"))


def _default_of(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def iter_specs(cls: type, prefix: str = "") -> typing.Iterator[KeySpec]:
    """One :class:`KeySpec` per key of the config dataclass ``cls``, depth first in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            yield from iter_specs(hint, path + ".")
            continue
        default = _default_of(f)
        leaf_help = f.metadata.get("leaf_help")
        if leaf_help:  # a fixed section whose keys are not python names: each key is a config key
            for sub, value in default.items():
                meta = {**f.metadata, "help": leaf_help[sub]}
                sub_field = dataclasses.field(default=value, metadata=meta)
                sub_field.name = sub
                yield _leaf(f"{path}.{sub}", sub_field, Any if value is None else type(value), value)
            continue
        yield _leaf(path, f, hint, default)


def section_help(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, str, type]]:
    """(dotted path, help, class) of every section field below ``cls``, depth first."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            yield prefix + f.name, f.metadata.get("help", ""), hint
            yield from section_help(hint, prefix + f.name + ".")


def section_aliases(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, str]]:
    """(earlier path, current path) of every section below ``cls`` declared with ``aliases``."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            for old in f.metadata.get("aliases") or ():
                yield old, prefix + f.name
            yield from section_aliases(hint, prefix + f.name + ".")


def spec_table(cls: type) -> dict[str, KeySpec]:
    """Dotted path -> :class:`KeySpec` for every key of the config dataclass ``cls``."""
    return {s.path: s for s in iter_specs(cls)}

