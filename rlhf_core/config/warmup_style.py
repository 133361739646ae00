"""verl 0.6's deprecated ``optim.warmup_style`` and its successor ``optim.lr_scheduler_type`` (run by
``validate.convert_deprecated`` when a PPO config loads; read by ``workers/lr_schedule.py``)."""
from __future__ import annotations

import warnings

from omegaconf import DictConfig, OmegaConf, open_dict

from .errors import ConfigError

A = "actor_rollout_ref"


def lr_scheduler_type_of(lr_scheduler_type: str, warmup_style: str | None, section: str) -> str:
    """The schedule of a PPO ``<section>``: the deprecated ``warmup_style`` when set, else ``lr_scheduler_type``.

    verl 0.6 (``FSDPOptimizerConfig.__post_init__``) copies a non-null ``warmup_style`` onto ``lr_scheduler_type``.
    Raises ConfigError naming both keys when both are set to different values (``lr_scheduler_type`` other than
    its default ``constant`` counts as set: an explicit ``constant`` cannot be told from the default, and then
    ``warmup_style`` wins, as in verl).
    """
    style, kind = warmup_style, lr_scheduler_type
    if style is None:
        return kind
    if kind not in ("constant", style):
        raise ConfigError(f"{section}.warmup_style={style!r} (deprecated) and {section}.lr_scheduler_type={kind!r} "
                          f"disagree: set only {section}.lr_scheduler_type.")
    return style


def convert_warmup_style(cfg: DictConfig) -> list[str]:
    """A set ``optim.warmup_style`` of the actor and critic written onto ``optim.lr_scheduler_type`` in place, with a
    DeprecationWarning (:func:`lr_scheduler_type_of`); returns the warning texts. Raises ConfigError as it does."""
    notes = []
    for section in (f"{A}.actor.optim", "critic.optim"):
        optim_cfg = OmegaConf.select(cfg, section)
        if optim_cfg is None or optim_cfg.warmup_style not in ("constant", "cosine"):
            continue  # unset, or a bad value the schema check reports with the choices
        kind = lr_scheduler_type_of(optim_cfg.lr_scheduler_type, optim_cfg.warmup_style, section)
        with open_dict(cfg):
            OmegaConf.update(cfg, f"{section}.lr_scheduler_type", kind, merge=False)
        note = f"{section}.warmup_style is deprecated; read as {section}.lr_scheduler_type={kind} (verl 0.6)."
        warnings.warn(note, DeprecationWarning, stacklevel=3)
        notes.append(note)
    return notes
