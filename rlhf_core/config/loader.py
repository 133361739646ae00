"""Load ppo_trainer / sft_trainer / evaluation configs the way verl's Hydra entry points do."""

from __future__ import annotations

import difflib
import functools
import os
import warnings
from pathlib import Path
from typing import Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from rlhf_core.redact import redact

from .errors import ConfigError
from .notices import (AliasNotice, ConfigNotice, alias_notice, changed_paths, effect_notices, named_engine_keys,
                      rename_aliases, resolve_aliases)
from .off_policy import derive_fully_async_batch
from .v1_trainer import resolve_v1_trainer
from .overrides import apply_overrides, parse_override
from .reads import record_reads
from .distillation import template_path
from .schema import CONFIG_NAMES, all_paths, check_schema, flatten, is_open, unknown_key_error
from .structured import (fresh_copy, schema_paths, shared_shipped_defaults, shipped_defaults, to_typed,
                         typed_defaults)
from .validate import convert_deprecated, validate_generation_config, validate_ppo_config, validate_sft_config
from .views import VIEWS, drop_group_choices, view_of
from .yaml_file import read_yaml_mapping

def shipped_config_dir() -> Path:
    """The folder of the YAML shipped with the package, ``rlhf_core/configs/`` (``ppo_trainer.yaml``...,
    generated from the config classes by :mod:`.gen_yaml`, and ``tools/``: verl's GSM8K tool and interaction
    configs). It is package data, as verl ships ``verl/trainer/config/*.yaml``, so a checkout, an editable install
    and an installed wheel all find it beside the code; the one place that computes the path (:func:`config_dir`,
    :mod:`.gen_yaml` and the tests go through it)."""
    return Path(__file__).resolve().parents[1] / "configs"


def config_dir() -> str:
    """Absolute path of the folder the configs are read from: ``$RLHF_CONFIG_DIR`` when set, else
    :func:`shipped_config_dir`."""
    env = os.environ.get("RLHF_CONFIG_DIR")
    return str(Path(env) if env else shipped_config_dir())


# verl 0.9.1's --config-name values: the same config under another name, or a config of a backend we do not have.
VERL_CONFIG_NAMES = {"_generated_ppo_trainer": "ppo_trainer"}  # sft_trainer_engine: a view of sft_trainer (views.py)
FOREIGN_CONFIG_NAMES = {"ppo_megatron_trainer": "Megatron", "_generated_ppo_megatron_trainer": "Megatron",
                        "ppo_torchtitan_trainer": "torchtitan", "_generated_ppo_torchtitan_trainer": "torchtitan",
                        "ppo_veomni_trainer": "veomni", "_generated_ppo_veomni_trainer": "veomni"}


def config_name_of(name: str) -> str:
    """Our config name for ``name`` as verl 0.9.1 spells it (``_generated_ppo_trainer`` -> ``ppo_trainer``; verl's
    ``sft_trainer_engine`` is a view of ``sft_trainer`` with verl 0.9.1's defaults, :mod:`.views`, kept as named); any
    other name or path is returned as it is.

    Raises:
        ConfigError: for verl's configs of a backend we do not have (``ppo_megatron_trainer``...), naming it.
    """
    if name in FOREIGN_CONFIG_NAMES:
        raise ConfigError(f"--config-name {name} is verl's config for its {FOREIGN_CONFIG_NAMES[name]} backend, which "
                          f"this project does not have; use ppo_trainer (FSDP)")
    return VERL_CONFIG_NAMES.get(name, name)


def _kind_of(user: DictConfig, path: Path) -> str:
    if path.stem in CONFIG_NAMES:
        return path.stem
    keys = set(user.keys())
    if "actor_rollout_ref" in keys or "algorithm" in keys or "critic" in keys:
        return "ppo_trainer"
    if "rollout" in keys or ("data" in keys and "n_samples" in user.data):
        return "generation"
    if "optim" in keys or "model" in keys:
        return "sft_trainer"
    if "data" in keys and "path" in user.data:
        return "evaluation"
    raise ConfigError(f"Cannot tell which config {path} extends: name it ppo_trainer.yaml, sft_trainer.yaml, "
                      f"evaluation.yaml or generation.yaml, or include actor_rollout_ref (PPO), rollout (generation), "
                      f"model/optim (SFT) or data.path.")


def load_base(name: str, config_dir: str | None = None) -> DictConfig:
    """The shipped config ``name`` (one of CONFIG_NAMES), unresolved, unvalidated: the defaults of its config
    classes, or the YAML file ``<config_dir>/<name>.yaml`` when a folder is given (``--config-dir`` or
    ``RLHF_CONFIG_DIR``), whose keys must be keys of the classes."""
    folder = _folder(config_dir)
    view = view_of(name)
    if view is not None:  # sft_trainer_engine: the sft_trainer defaults with verl 0.9.1's (rlhf_core/config/views.py)
        base = load_base(view[0], config_dir)
        for key, value in view[1].items():
            OmegaConf.update(base, key, value, merge=False)
        return base
    if not folder:
        if name not in CONFIG_NAMES:
            raise ConfigError(f"Unknown config '{name}'; known configs: {list(CONFIG_NAMES)}")
        return shipped_defaults(name)
    path = Path(folder) / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"Config '{name}' not found at {path}; known configs: {list(CONFIG_NAMES)}")
    return _load_mapping(path)


def _load_mapping(path: Path) -> DictConfig:
    """``path`` as an unresolved DictConfig; ConfigError naming the file (and the line of a YAML syntax error) when
    it is not valid YAML or not a mapping (:func:`~rlhf_core.config.yaml_file.read_yaml_mapping`)."""
    read_yaml_mapping(path)  # one line for PyYAML's errors; OmegaConf would read a bare word as a key
    try:
        return OmegaConf.load(path)
    except (OmegaConfBaseException, OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"Cannot read config file {path}: {exc}") from exc


def _drop_targets(node: DictConfig) -> DictConfig:
    """``node`` without verl's ``_target_`` entries (dataclass hints for Hydra's instantiate: accepted, ignored)."""
    plain = OmegaConf.to_container(node, resolve=False)

    def strip(d):
        return {k: strip(v) if isinstance(v, dict) else v for k, v in d.items() if k != "_target_"}
    return OmegaConf.create(strip(plain))


def _is_target(override: str) -> bool:
    """True for an override of a ``_target_`` entry (``a.b._target_=...``, ``+a._target_=...``)."""
    return override.lstrip("+~").split("=", 1)[0].strip().rsplit(".", 1)[-1] == "_target_"


def _load_unresolved(name: str, config_dir: str | None) -> tuple[str, DictConfig, DictConfig]:
    """(kind, base, cfg): a shipped name (or verl 0.9.1's name of one), or a user YAML file merged over the shipped
    config it extends."""
    name = config_name_of(name)
    if name in CONFIG_NAMES or name in VIEWS:
        base = _base(name, config_dir)
        return VIEWS[name][0] if name in VIEWS else name, base, fresh_copy(base)
    path = Path(name).expanduser()
    if not path.is_file():
        looks_like_path = "/" in name or name.endswith((".yaml", ".yml"))
        found = f"no file {str(path.resolve())!r}" if looks_like_path else "not a shipped config"
        near = difflib.get_close_matches(path.stem, [*CONFIG_NAMES, *VIEWS], n=1)
        hint = f"; did you mean '{near[0]}'?" if near and not looks_like_path else ""
        raise ConfigError(f"Unknown config '{name}' ({found}{hint}): expected one of {list(CONFIG_NAMES)} or a path "
                          "to a YAML file")
    user = _load_mapping(path)
    redact(OmegaConf.to_container(user, resolve=False))  # remembers its secret values: no error quotes them
    user = _drop_targets(user)
    kind = VIEWS[path.stem][0] if path.stem in VIEWS else _kind_of(user, path)
    user = _renamed(user, kind, str(path), native=path.stem in VIEWS)
    base = _base(path.stem if path.stem in VIEWS else kind, config_dir)  # sft_trainer_engine.yaml: its defaults
    known = set(all_paths(base))
    for key, value in flatten(user, resolve=False).items():
        # an added distillation teacher (teacher_models.<name>.x) has teacher_model's keys
        if key not in known and not is_open(key) and template_path(key) not in known:
            raise unknown_key_error(key, known, f" (in {path})")
        _refuse_value_for_section(base, key, value, path, kind)
    cfg = fresh_copy(base)
    with open_dict(cfg):
        cfg.merge_with(user)
    return kind, base, cfg


def _folder(config_dir: str | None) -> str | None:
    return config_dir or os.environ.get("RLHF_CONFIG_DIR")


def _base(name: str, config_dir: str | None) -> DictConfig:
    """:func:`load_base`, read-only: the per-process shared shipped defaults when no config folder is given (the
    loader only reads its base; :func:`~rlhf_core.config.structured.fresh_copy` gives a writable copy)."""
    if not _folder(config_dir) and name in CONFIG_NAMES:
        return shared_shipped_defaults(name)
    base = load_base(name, config_dir)
    OmegaConf.set_readonly(base, True)
    return base


def _renamed(user: DictConfig, kind: str, source: str, native: bool = False) -> DictConfig:
    """``user`` with earlier spellings of keys (declared ``aliases``) renamed, one AliasNotice per rename (none when
    ``native``: see :func:`_renamed_overrides`)."""
    flat, notices = rename_aliases(flatten(user, resolve=False), kind, source)
    if not notices:
        return user
    for notice in notices if not native else []:
        warnings.warn(notice, AliasNotice, stacklevel=3)
    out = OmegaConf.create({})
    for key, value in flat.items():
        OmegaConf.update(out, key, value, merge=False, force_add=True)
    return out


def _renamed_overrides(overrides: Sequence[str], kind: str, native: bool = False) -> list[str]:
    """``overrides`` with an earlier spelling of a key (declared ``aliases``) replaced by the key, one AliasNotice
    per rename (an override that does not parse is left for :func:`apply_overrides` to name). ``native``: a view
    whose own spellings these are (``sft_trainer_engine``: verl 0.9's, every sft_trainer alias): no notice."""
    from .schema import renamed_path, specs

    out, given = [], {}  # given: key as read -> (key as written, value) of each setting override
    for text in overrides:
        try:
            override = parse_override(text)
        except ConfigError:
            out.append(text)
            continue
        key, new = override.key, renamed_path(override.key, kind)
        read_as = new or key
        if override.op != "delete":
            written, value = given.setdefault(read_as, (key, override.value))
            if written != key and value != override.value:
                raise ConfigError(f"{written}={value!r} and {key}={override.value!r} are two spellings of one key "
                                  f"(overrides); set one of them.")
        if new is not None:
            start = text.index(key)
            # `+old=v` (verl's struct lacked the old spelling) names a key declared here: set it, do not add it
            prefix = text[:start].replace("+", "", 1) if override.op == "add" and new in specs(kind) else text[:start]
            text = prefix + new + text[start + len(key):]
            if not native:
                warnings.warn(alias_notice(key, new, "override"), AliasNotice, stacklevel=3)
        out.append(text)
    return out


def _refuse_value_for_section(base: DictConfig, key: str, value: object, path: Path, kind: str) -> None:
    """ConfigError (one line naming the file and the key) when the user file sets ``key``, a section of the shipped
    config (e.g. ``trainer: 5``), to a value rather than to keys below it; merged, it would delete every key of the
    section, ``null`` too (``trainer:`` with nothing below it). Free-form sections are left alone."""
    section = OmegaConf.select(base, key, throw_on_resolution_failure=False)
    if is_open(key) or not isinstance(section, DictConfig) or isinstance(value, dict):
        return
    sub = ", ".join(f"{key}.{k}" for k in list(section.keys())[:2])
    shown = "null" if value is None else repr(value)
    raise ConfigError(f"{path}: {key} is a section of {kind}.yaml (keys such as {sub}), not a value: got "
                      f"{key}: {shown}; set its keys on the lines below it, indented, or remove the line")


def _remember_secrets(overrides: Sequence[str]) -> None:
    """Make every later message scrub the secret values these overrides set (``+a.api_key=v``, a dict value
    ``a.reward_kwargs={api_key: v}``): :func:`rlhf_core.redact.redact` remembers them. An override that does not
    parse is skipped here (:func:`apply_overrides` names it, its text scrubbed by ``ConfigError``)."""
    for text in overrides:
        try:
            ov = parse_override(text)
        except ConfigError:
            continue
        redact({ov.key: ov.value})


def load_config(name: str, overrides: Sequence[str] = (), config_dir: str | None = None) -> DictConfig:
    """Load a config, apply verl-style overrides, resolve, convert deprecated keys and validate.

    ``name``: "ppo_trainer", "sft_trainer", "evaluation", "generation" (from ``config_dir``, default the shipped
    rlhf_core/configs/), or a path to a YAML file whose keys are merged over the shipped config it extends.
    Overrides are applied before interpolations are resolved (``${data.max_prompt_length}`` sees
    ``data.max_prompt_length=256``). A key written in another of verl's spellings (declared ``aliases``, e.g.
    verl 0.9's ``reward.custom_reward_function.path``) is read as the key, with one AliasNotice. verl's ``_target_``
    entries (in a file or an override) are ignored. Deprecated ``*_micro_batch_size`` keys become ``*_per_gpu``
    (÷ trainer.nnodes × trainer.n_gpus_per_node) with a DeprecationWarning. The PPO/SFT batch-size
    rules run with that world size; call validate_ppo_config/validate_sft_config again with the
    real one. ``ray_init.*`` and verl 0.6's ``ray_kwargs.*`` spellings are made equal (rlhf_core/config/
    notices.py). Each key set to a value that changes nothing here gets one ConfigNotice warning naming the
    key and why. Returns a resolved, complete, typed DictConfig in struct mode backed by the
    dataclasses of ``structured.schema_class(kind)``; with ``RLHF_CONFIG_READS`` set, its nodes record the
    keys read from them (rlhf_core/config/reads.py). Raises ConfigError (a ValueError).
    """
    _remember_secrets(overrides)
    kind, base, cfg = _load_unresolved(name, config_dir)
    overrides = _renamed_overrides(drop_group_choices(overrides, kind), kind, native=Path(str(name)).stem in VIEWS)
    apply_overrides(cfg, [o for o in overrides if not _is_target(o)])
    user_set = changed_paths(cfg, base)  # before the aliases copy a value onto its other spelling
    user_set |= named_engine_keys(overrides)  # e.g. rollout.tensor_model_parallel_size=2 (its default) with hf
    resolve_aliases(cfg, base, kind)
    _import_extensions(cfg)  # before the choices are checked: their registered names are valid values
    if kind in ("ppo_trainer", "sft_trainer"):
        try:
            convert_deprecated(cfg, sft=kind == "sft_trainer")
        except OmegaConfBaseException as exc:
            raise ConfigError(f"Could not resolve an interpolation: {exc}") from exc
    if kind == "ppo_trainer":
        resolve_v1_trainer(cfg, user_set)  # trainer.v1.trainer_mode=separate_async -> the fully async driver's keys
        derive_fully_async_batch(cfg)  # verl's fully async scripts set data.train_batch_size=0
    try:
        OmegaConf.resolve(cfg)
        if _folder(config_dir):  # a shipped base (the config classes' defaults) always resolves
            OmegaConf.resolve(fresh_copy(base))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"Could not resolve an interpolation: {exc}") from exc
    errors = check_schema(cfg, kind) + _shape_errors(kind, cfg, overrides)
    if errors:
        raise ConfigError("Invalid config:\n  - " + "\n  - ".join(errors))
    if kind == "ppo_trainer":  # on the user's values, so messages quote them as typed (1, not 1.0)
        validate_ppo_config(cfg)
    elif kind == "sft_trainer":
        validate_sft_config(cfg)
    elif kind == "generation":
        validate_generation_config(cfg)
    for notice in effect_notices(cfg, user_set, kind):
        warnings.warn(notice, ConfigNotice, stacklevel=2)
    return record_reads(to_typed(kind, cfg))


def _import_extensions(cfg: DictConfig) -> None:
    """Run the files of ``trainer.extensions`` (:func:`rlhf_core.user_code.import_extensions`), one at a time.

    Raises:
        ConfigError: naming the key (and the file) when the value is not a list, a file is missing, or a file raises
            or exits while running (its exception type, message and line).
    """
    paths = OmegaConf.select(cfg, "trainer.extensions", default=None)
    if not paths:
        return
    if not isinstance(paths, ListConfig):
        raise ConfigError(f"trainer.extensions={paths!r}: expected a list of Python files, e.g. "
                          f"trainer.extensions=[{paths}]")
    from rlhf_core.user_code import import_extensions

    for path in OmegaConf.to_container(paths, resolve=True):
        try:
            import_extensions([path])
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from exc
        except BaseException as exc:  # the user's file raised (or called sys.exit) while running: name it and where
            if isinstance(exc, KeyboardInterrupt):
                raise
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f" (line {tb.tb_lineno} of {tb.tb_frame.f_code.co_filename})" if tb is not None else ""
            raise ConfigError(f"trainer.extensions: running {path!r} failed{where}: {type(exc).__name__}: "
                              f"{_short(exc)}") from exc


def _short(exc: BaseException) -> str:
    """The exception's message without memory addresses (``<function f at 0x7f...>`` -> ``<function f>``)."""
    import re

    return re.sub(r" at 0x[0-9a-f]+>", ">", str(exc))


def _shape_errors(kind: str, cfg: DictConfig, overrides: Sequence[str]) -> list[str]:
    """Keys added with '+' that the schema lacks, and schema keys deleted with '~'.

    A loaded config holds exactly the schema's keys (free-form dicts such as override_config take
    any sub-key), so a new key is declared in its class (rlhf_core/config/schemas/), and a key cannot be
    deleted: set it (to null where the key allows it) instead.
    """
    schema = schema_paths(kind)
    have = set(flatten(cfg, resolve=False))
    errors = []
    for key in sorted(have - schema):
        if template_path(key) in schema:  # distillation.teacher_models.<name>.x: teacher_model's key x
            continue
        if not is_open(key) and not any(key.startswith(p + ".") for p in schema):
            if key.startswith("ray_kwargs.ray_init.") and kind in ("ppo_trainer", "evaluation"):
                from rlhf_core.config.ray_kwargs import ray_init_key_error  # imports ray: only for such a key
                passed = ray_init_key_error(key)  # verl passes this section to ray.init: any of its arguments
                errors += [passed] if passed else []
                continue
            errors.append(str(unknown_key_error(key, _typed_paths(kind), f" It is not a key of {kind}: declare it in its class "
                                                            f"in rlhf_core/config/schemas/ to make it a config key.")))
    for key in sorted(schema - have):
        if not any(h.startswith(key + ".") for h in have):
            given = [o for o in overrides if o.lstrip("~").partition("=")[0] in
                     {".".join(key.split(".")[: i + 1]) for i in range(key.count(".") + 1)}]
            how = f" (override {given[0]!r})" if given else ""
            errors.append(f"'{key}' was deleted{how}: every loaded config holds all keys of "
                          f"rlhf_core/configs/{kind}.yaml; set it instead (e.g. {key}=null where null is allowed).")
    return errors


@functools.lru_cache(maxsize=None)
def _typed_paths(kind: str) -> tuple[str, ...]:
    """Every dotted path of the typed defaults of ``kind`` (the did-you-mean candidates), once per process."""
    return tuple(all_paths(typed_defaults(kind)))


def resolved_yaml(cfg: DictConfig) -> str:
    """The config as resolved YAML text (what `rlhf config show` prints), with every value under a secret name
    (:func:`rlhf_core.redact.is_secret_name`) shown as ``***``: the output lands in terminals and logs."""
    return OmegaConf.to_yaml(OmegaConf.create(redact(OmegaConf.to_container(cfg, resolve=True))))


__all__ = ["CONFIG_NAMES", "config_dir", "config_name_of", "load_base", "load_config", "resolved_yaml",
           "shipped_config_dir"]
