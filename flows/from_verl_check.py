"""The load check of ``rlhf experiment from-verl`` (:mod:`flows.from_verl`): each stage's override list as the
pipeline builds it from the converted experiment, loaded with the project's config loader; the report line says
``loads`` or why not, the keys that change nothing here and verl's other spellings read as ours."""
from __future__ import annotations

import warnings
from typing import Any

import yaml

from rlhf_core.config.errors import ConfigError


def run_lists(plain: dict[str, Any], stages: set[str]) -> tuple[dict[str, list[str]], str]:
    """Each stage's override list as ``rlhf pipeline`` builds it from this experiment (its lifted fields included:
    ``ppo.adv_estimator``, steps, ``reward.*``; :func:`flows.settings.stage_override_lists`), so the load check is
    the run's; data files the script does not name are placeholders. ``({}, why)`` when the experiment itself
    does not load (the check then falls back to each stage's overrides alone)."""
    from flows.experiment import ExperimentError, load_experiment
    from flows.settings import resolve_settings, stage_override_lists
    from rlhf_core.config.notices import ConfigNotice

    data = plain.setdefault("data", {})
    if not data.get("generator"):
        for key in ("train_files", "val_files"):
            data[key] = data.get(key) or ["/validate-only/" + key + ".parquet"]
    plain.setdefault("evaluation", {})["enabled"] = "evaluation" in stages
    try:
        with warnings.catch_warnings():  # its config loads' notices: load_check reports them once, in the file
            warnings.simplefilter("ignore", ConfigNotice)
            settings = resolve_settings({}, load_experiment(yaml.safe_dump(plain, sort_keys=False)))
    except (ExperimentError, FileNotFoundError, ValueError) as exc:
        return {}, f"the experiment does not load: {' '.join(str(exc).split())}"
    names = {"eval": "evaluation"}
    return {names.get(stage, stage): overrides for stage, _, overrides in stage_override_lists(settings)}, ""


def load_check(config_name: str, active: list[str]) -> str:
    """``loads`` or the first error of ``load_config(config_name, active)``, plus the keys that load but change
    nothing here (ConfigNotice)."""
    from rlhf_core.config.loader import load_config
    from rlhf_core.config.notices import AliasNotice, ConfigNotice

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigNotice)
        try:
            load_config(config_name, active)
            result = "loads"
        except ConfigError as exc:
            result = "does not load as written: " + " ".join(str(exc).split())  # whole: the reason may be last
    quiet = sorted({str(w.message).split(":")[0].split()[0].strip("'") for w in caught
                    if issubclass(w.category, ConfigNotice) and not issubclass(w.category, AliasNotice)})
    renamed = sorted({str(w.message).split(" (")[0] + " -> " + str(w.message).split(" is read as ")[1].split(":")[0]
                      for w in caught if issubclass(w.category, AliasNotice)})
    return (result + (f"; accepted but change nothing here: {', '.join(quiet)}" if quiet else "")
            + (f"; verl's other spellings, read as ours: {', '.join(renamed)}" if renamed else ""))
