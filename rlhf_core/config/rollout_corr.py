"""``algorithm.rollout_correction`` (verl 0.9.1) without torch: its value grammar, presets and the verl 0.6 keys.

* :func:`parse_is_threshold` / :func:`parse_rs` read ``rollout_is_threshold`` (``2.0`` = truncate at 2.0, TIS;
  ``"0.5_5.0"`` = zero outside [0.5, 5.0], IcePop) and ``rollout_rs`` + ``rollout_rs_threshold`` (comma lists);
  the config check (``RolloutCorrectionConfig.__post_init__``) and the math (rlhf_core/algos/rollout_correction.py)
  both use them, so a bad value is refused before anything starts.
* :data:`PRESETS` are verl 0.9.1's ``RolloutCorrectionConfig.<name>()`` constructors (defaults of their
  arguments) as key values. verl has no config key that picks one; write its values as overrides
  (:func:`preset_overrides`), e.g. ``rlhf ppo $(python -m rlhf_core.config.rollout_corr bypass_pg_is)``.
* :func:`convert_rollout_is` reads verl 0.6's ``algorithm.rollout_is*`` keys as the equivalent
  ``algorithm.rollout_correction.*`` settings, with one notice (run by ``convert_deprecated``).
"""
from __future__ import annotations

import math
import sys
import warnings
from typing import Any

RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
IS_LEVELS = ("token", "sequence")
LOSS_TYPES = ("ppo_clip", "reinforce")
SECTION = "algorithm.rollout_correction"


def _number(text: str, key: str, spec: Any) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{key}={spec!r}: {text!r} is not a number") from None


def parse_is_threshold(spec: Any, key: str = f"{SECTION}.rollout_is_threshold") -> tuple[float, float | None]:
    """``(upper, lower or None)`` of a ``rollout_is_threshold``: a number or number string is a TIS upper bound;
    ``"lower_upper"`` (e.g. ``"0.5_5.0"``) gives IcePop bounds (verl 0.9.1 ``_parse_rollout_is_threshold``).

    Raises:
        ValueError: naming ``key``: a bool, an empty or non-numeric string, a bound <= 0, or lower > upper.
    """
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"{key}={spec!r}: expected a number or a 'lower_upper' string such as '0.5_5.0'")
    lower = None
    if isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise ValueError(f"{key}='': expected a number or a 'lower_upper' string such as '0.5_5.0'")
        if "_" in text:
            low, high = text.split("_", 1)
            lower, upper = _number(low, key, spec), _number(high, key, spec)
        else:
            upper = _number(text, key, spec)
    else:
        upper = float(spec)
    if not upper > 0 or (lower is not None and not lower > 0):
        raise ValueError(f"{key}={spec!r}: bounds must be > 0")
    if lower is not None and lower > upper:
        raise ValueError(f"{key}={spec!r}: the lower bound must be <= the upper bound")
    return upper, lower


def parse_rs(rollout_rs: str, threshold: Any) -> list[tuple[str, float | None, float]]:
    """``[(option, lower, upper)]`` of ``rollout_rs`` (comma list, duplicates dropped, order kept) with its
    ``rollout_rs_threshold`` (one value for all options, or one per option, comma separated). ``*_k1`` options
    bound the ratio: ``"lower_upper"``, or one number U meaning [1/U, U]; k2/k3 options take one upper bound and
    ``lower`` is None (verl 0.9.1 ``_parse_rollout_rs_thresholds``).

    Raises:
        ValueError: naming the key: an unknown option, a missing threshold, a count that is neither 1 nor the
            number of options, a non-numeric or non-positive bound, lower > upper, or a 'lower_upper' for k2/k3.
    """
    rs_key, th_key = f"{SECTION}.rollout_rs", f"{SECTION}.rollout_rs_threshold"
    options = list(dict.fromkeys(o.strip() for o in str(rollout_rs).split(",") if o.strip()))
    bad = [o for o in options if o not in RS_OPTIONS]
    if not options or bad:
        raise ValueError(f"{rs_key}={rollout_rs!r}: unknown option(s) {bad}; expected a comma list of {list(RS_OPTIONS)}")
    if threshold is None or isinstance(threshold, bool):
        raise ValueError(f"{rs_key}={rollout_rs!r} needs {th_key} (a number, or 'lower_upper' for *_k1), got {threshold!r}")
    specs = [threshold] if isinstance(threshold, (int, float)) else [s.strip() for s in str(threshold).split(",") if s.strip()]
    if len(specs) not in (1, len(options)):
        raise ValueError(f"{th_key}={threshold!r}: give one threshold or {len(options)} (one per {rs_key} option)")
    specs = specs * len(options) if len(specs) == 1 else specs
    out = []
    for option, spec in zip(options, specs):
        text = str(spec)
        if option.endswith("k1"):
            low, high = text.split("_", 1) if "_" in text else (None, text)
            upper = _number(high, th_key, threshold)
            lower = _number(low, th_key, threshold) if low is not None else (1.0 / upper if upper > 0 else 0.0)
        elif "_" in text:
            raise ValueError(f"{th_key}={threshold!r}: {option} takes one upper bound, not 'lower_upper'")
        else:
            upper, lower = _number(text, th_key, threshold), None
        if not upper > 0 or (lower is not None and not lower > 0):
            raise ValueError(f"{th_key}={threshold!r}: bounds for {option} must be > 0")
        if lower is not None and lower > upper:
            raise ValueError(f"{th_key}={threshold!r}: lower > upper for {option}")
        out.append((option, lower, upper))
    return out


def _preset(is_=None, is_th=2.0, rs=None, rs_th=None, bypass=False, loss="ppo_clip") -> dict[str, Any]:
    return {"rollout_is": is_, "rollout_is_threshold": is_th, "rollout_rs": rs, "rollout_rs_threshold": rs_th,
            "bypass_mode": bypass, "loss_type": loss, "rollout_is_batch_normalize": False}


GEO = "0.999_1.001"
# verl 0.9.1 RolloutCorrectionConfig.<name>() with its default arguments.
PRESETS: dict[str, dict[str, Any]] = {
    "disabled": _preset(),
    "decoupled_token_is": _preset("token"),
    "decoupled_seq_is": _preset("sequence"),
    "decoupled_token_icepop": _preset("token", "0.5_5.0"),
    "decoupled_seq_is_rs": _preset("sequence", 2.0, "seq_sum_k1", "0.5_2.0"),
    "decoupled_geo_rs": _preset(None, 2.0, "seq_mean_k1", GEO),
    "decoupled_geo_rs_seq_tis": _preset("sequence", 2.0, "seq_mean_k1", GEO),
    "decoupled_geo_rs_token_tis": _preset("token", 2.0, "seq_mean_k1", GEO),
    "decoupled_k3_rs": _preset(None, 2.0, "seq_mean_k3", 0.01),
    "decoupled_k3_rs_seq_tis": _preset("sequence", 2.0, "seq_mean_k3", 0.01),
    "decoupled_k3_rs_token_tis": _preset("token", 2.0, "seq_mean_k3", 0.01),
    "bypass_ppo_clip": _preset(bypass=True),
    "bypass_ppo_clip_geo_rs": _preset(None, 2.0, "seq_mean_k1", GEO, True),
    "bypass_ppo_clip_k3_rs": _preset(None, 2.0, "seq_mean_k3", 0.01, True),
    "bypass_pg_is": _preset("sequence", 2.0, None, None, True, "reinforce"),
    "bypass_pg_token_icepop": _preset("token", "0.5_5.0", None, None, True, "reinforce"),
    "bypass_pg_geo_rs": _preset(None, 2.0, "seq_mean_k1", GEO, True, "reinforce"),
    "bypass_pg_geo_rs_seq_tis": _preset("sequence", 2.0, "seq_mean_k1", GEO, True, "reinforce"),
    "bypass_pg_geo_rs_token_tis": _preset("token", 2.0, "seq_mean_k1", GEO, True, "reinforce"),
}


def preset_overrides(name: str) -> list[str]:
    """The ``algorithm.rollout_correction.*=value`` overrides of preset ``name`` (a key of :data:`PRESETS`).

    Raises:
        KeyError: an unknown preset, naming the known ones.
    """
    if name not in PRESETS:
        raise KeyError(f"unknown rollout correction preset {name!r}; known: {sorted(PRESETS)}")
    def text(v: Any) -> str:
        return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

    return [f"{SECTION}.{k}={text(v)}" for k, v in PRESETS[name].items()]


def legacy_settings(rollout_is: bool, threshold: float | None, threshold_lower: float | None, level: str,
                    mode: str) -> dict[str, Any]:
    """The ``rollout_correction`` values that verl 0.6's ``algorithm.rollout_is*`` keys mean; {} when the 0.6 keys
    do nothing (``rollout_is_threshold`` null). ``rollout_is=False`` with a threshold was metrics only: 0.9's
    ``rollout_is: null``. Level ``geometric`` (no 0.9 level) maps to ``sequence`` here; the geometric mean and the
    0.6 veto (``rollout_is_veto_threshold``) are applied from the 0.6 keys themselves (rlhf_core/algos/
    rollout_correction.py ``legacy``). ``mask`` mode = IcePop ``"lower_upper"`` with lower = threshold_lower or
    1/threshold; ``truncate`` = TIS at threshold (0.6 ignored threshold_lower there too)."""
    if threshold is None:
        return {}
    if mode == "mask":
        lower = threshold_lower if threshold_lower is not None else 1.0 / threshold
        spec: Any = f"{lower!r}_{float(threshold)!r}"
    else:
        spec = float(threshold)
    return {"rollout_is": ("token" if level == "token" else "sequence") if rollout_is else None,
            "rollout_is_threshold": spec}


_DECIDED_BY = {"rollout_is": ("rollout_is", "rollout_is_level"),
               "rollout_is_threshold": ("rollout_is_threshold", "rollout_is_threshold_lower", "rollout_is_mode")}
"""Each ``rollout_correction`` key of :func:`legacy_settings` -> the verl 0.6 ``algorithm.*`` keys that decide it."""
_LEGACY_DEFAULTS = {"rollout_is": False, "rollout_is_threshold": None, "rollout_is_threshold_lower": None,
                    "rollout_is_level": "token", "rollout_is_mode": "truncate"}
"""verl 0.6's defaults of those keys (``AlgoConfig``): a key at its default was not set by the user."""


def convert_rollout_is(cfg: Any) -> list[str]:
    """Write verl 0.6's ``algorithm.rollout_is*`` onto ``algorithm.rollout_correction.*`` in ``cfg`` (a DictConfig)
    with one DeprecationWarning naming the new keys; returns the notices.

    Raises:
        ConfigError: a new key set away from its default to a value other than the one the 0.6 keys mean (naming
            both keys).
    """
    from omegaconf import OmegaConf, open_dict

    from .errors import ConfigError

    algo = OmegaConf.select(cfg, "algorithm")
    if algo is None or "rollout_correction" not in algo or algo.get("rollout_is_threshold") is None:
        return []
    new = legacy_settings(bool(algo.rollout_is), algo.rollout_is_threshold, algo.rollout_is_threshold_lower,
                          algo.rollout_is_level, algo.rollout_is_mode)
    defaults = PRESETS["disabled"]
    errors = []
    for k, v in new.items():
        have = algo.rollout_correction.get(k)
        if have != defaults[k] and have != v and str(have) != str(v):
            # name only the 0.6 keys the user set (away from their default) that decide this value; the
            # threshold (set: the 0.6 block is active at all) when none of them is
            named = [f"algorithm.{o}" for o in _DECIDED_BY[k] if algo.get(o) != _LEGACY_DEFAULTS[o]]
            named = named or ["algorithm.rollout_is_threshold"]
            errors.append(f"{' and '.join(named)} (verl 0.6) {'means' if len(named) == 1 else 'mean'} "
                          f"{SECTION}.{k}={v!r}, but {SECTION}.{k}={have!r} is set too; remove the 0.6 keys "
                          f"(algorithm.rollout_is*) or make them agree.")
    if errors:
        raise ConfigError("Invalid config:\n  - " + "\n  - ".join(errors))
    with open_dict(cfg):
        for k, v in new.items():
            OmegaConf.update(cfg, f"{SECTION}.{k}", v, merge=False)
    extra = ""
    if algo.rollout_is:
        extra = (f"; the 0.6 veto (algorithm.rollout_is_veto_threshold={algo.rollout_is_veto_threshold})"
                 + (" and geometric level" if algo.rollout_is_level == "geometric" else "")
                 + " still applied (no 0.9 key)")
    note = (f"algorithm.rollout_is* (verl 0.6) read as " + ", ".join(f"{SECTION}.{k}={v}" for k, v in new.items())
            + f"{extra}. Set {SECTION}.* directly.")
    warnings.warn(note, DeprecationWarning, stacklevel=3)
    return [note]


if __name__ == "__main__":  # print a preset's overrides: python -m rlhf_core.config.rollout_corr bypass_pg_is
    print(" ".join(preset_overrides(sys.argv[1] if len(sys.argv) > 1 else "disabled")))
