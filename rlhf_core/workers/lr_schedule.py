"""The one LR schedule of PPO (actor and critic ``optim.*``) and SFT (``optim.*`` of ``sft_trainer.yaml``).

Multiplier of ``optim.lr`` at update ``s`` (0-based: ``s = 0`` is the first optimizer update), with ``W`` warmup
updates, ``T`` updates in all, ``m = min_lr_ratio`` and ``c = num_cycles`` (verl 0.6,
``verl/utils/torch_functional.py``: ``get_constant_schedule_with_warmup``, ``get_cosine_schedule_with_warmup``,
``get_wsd_schedule_with_warmup``):

* warmup, ``s < W``: linear from ``init`` to 1, ``init + (1 − init)·s/W`` (verl's ``init_lr_ratio``). verl's
  default ``init = 0`` runs the first update at LR 0; ours is ``init = 1/(W + 1)``, i.e. ``(s + 1)/(W + 1)``, so
  the first update never runs at LR 0; the ramp still reaches 1 at ``s = W``, where verl's does. SFT passes
  ``init = m`` when ``m > 0`` (SEMANTICS: lr 1.5e-6, warmup 0.1, m 0.1 starts at 1.5e-7).
* ``constant`` after warmup: 1.
* ``cosine`` after warmup: ``m + (1 − m)·½(1 + cos(2π·c·p))``, ``p = min(1, (s − W)/max(1, T − W))``; with
  ``c = 0.5`` it falls from 1 to ``m``, reached at ``s = T`` (just after the last update).
* ``wsd`` (warmup–stable–decay) after warmup: with ``D = int(stable_ratio·max(0, T − W))`` stable updates, 1 while
  ``s < W + D``; then the cosine above with ``p = (s − W − D)/max(1, T − W − D)`` while ``s < T``; ``m`` after.

``W = T`` (warmup over the whole run) is valid: the LR rises until the end.

PPO (verl's FSDP workers): ``W = optim.lr_warmup_steps`` when ``>= 0``, else
``int(optim.lr_warmup_steps_ratio × optim.total_training_steps)``; ``optim.lr_scheduler_type`` is ``constant`` or
``cosine`` (the deprecated ``optim.warmup_style``, when set, takes its place, see
:func:`rlhf_core.config.warmup_style.lr_scheduler_type_of`); a null ``min_lr_ratio`` is 0. The scheduler is stepped
once per ``update_actor`` / ``update_critic`` call. ``optim.zero_indexed_step: False`` makes the cosine schedule
count from 1 (its multiplier at update ``s`` is the one above at ``s + 1``: verl 0.9's
``get_cosine_schedule_with_warmup(zero_indexed_step=False)``, torchtitan's convention); verl's constant schedule
ignores the key, and so does ours (SFT's ``optim.zero_indexed_step`` likewise, for its cosine schedule).
SFT (verl's ``fsdp_sft_trainer``; verl 0.9's ``sft_trainer`` spells the keys ``lr_warmup_steps_ratio`` and
``lr_scheduler_type``, aliases here): ``W = optim.lr_warmup_steps`` when ``>= 0``, else
``int(optim.warmup_steps_ratio × T)``; ``optim.lr_scheduler`` is ``constant``, ``cosine`` or ``wsd`` (the deprecated
``optim.warmup_style``, when set, takes its place), ``c = optim.num_cycles`` (0.5), with ``optim.min_lr_ratio`` and
``optim.stable_ratio``; stepped once per optimizer update.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from rlhf_core.config.warmup_style import lr_scheduler_type_of

SCHEDULES = ("constant", "cosine", "wsd")


def lr_multiplier(step: int, *, kind: str, warmup: int, total: int, min_lr_ratio: float | None = 0.0,
                  num_cycles: float = 0.5, stable_ratio: float = 0.9, init_lr_ratio: float | None = None) -> float:
    """The LR factor (a float in [0, 1]) at 0-based update ``step``; the formulas are in the module docstring.

    ``init_lr_ratio=None`` means ``1/(warmup + 1)``; ``min_lr_ratio=None`` means 0 (verl).
    Raises:
        ValueError: ``kind`` not in :data:`SCHEDULES`.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"LR schedule {kind!r}: use one of {list(SCHEDULES)}")
    m = 0.0 if min_lr_ratio is None else float(min_lr_ratio)
    if step < warmup:
        init = 1.0 / (warmup + 1) if init_lr_ratio is None else float(init_lr_ratio)
        return init + (1.0 - init) * step / warmup
    if kind == "constant":
        return 1.0
    decay_start = warmup
    if kind == "wsd":
        decay_start = warmup + int(float(stable_ratio) * max(0, total - warmup))
        if step < decay_start:
            return 1.0
        if step >= total:
            return m
    progress = min(1.0, (step - decay_start) / max(1, total - decay_start))
    return m + (1.0 - m) * max(0.0, 0.5 * (1.0 + math.cos(2.0 * math.pi * float(num_cycles) * progress)))


def _lambda_lr(optimizer: torch.optim.Optimizer, step_offset: int = 0, **schedule: Any) -> LambdaLR:
    """``LambdaLR`` of :func:`lr_multiplier` at update ``s + step_offset`` (1: a schedule that counts from 1)."""
    lr_multiplier(0, **schedule)  # an unknown kind fails here, before training
    return LambdaLR(optimizer, lambda s: lr_multiplier(s + step_offset, **schedule))


def ppo_warmup_steps(optim_cfg: Any, total_training_steps: int) -> int:
    """``W`` of a PPO ``optim`` section: ``lr_warmup_steps`` when ``>= 0``, else ``int(lr_warmup_steps_ratio × T)``.

    Raises:
        ValueError: a ratio > 0 while ``total_training_steps <= 0`` (nothing to take the ratio of).
    """
    steps = optim_cfg.lr_warmup_steps
    if steps is not None and int(steps) >= 0:
        return int(steps)
    ratio = float(optim_cfg.lr_warmup_steps_ratio)
    if ratio > 0 and total_training_steps <= 0:
        raise ValueError("optim.lr_warmup_steps_ratio > 0 needs optim.total_training_steps > 0 "
                         "(the driver injects it; set optim.lr_warmup_steps instead)")
    return int(ratio * max(total_training_steps, 0))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: Any) -> LambdaLR:
    """The PPO actor's or critic's ``LambdaLR`` from its ``optim`` section (``total_training_steps`` injected).

    Raises:
        ValueError: ``lr_scheduler_type`` (or ``warmup_style``) not ``constant``/``cosine``, a cosine schedule or
            a warmup ratio without ``total_training_steps > 0``.
        ConfigError: ``warmup_style`` and ``lr_scheduler_type`` set to different values.
    """
    total = int(optim_cfg.total_training_steps)
    kind = lr_scheduler_type_of(optim_cfg.lr_scheduler_type, optim_cfg.warmup_style, "optim")
    if kind not in ("constant", "cosine"):
        raise ValueError(f"optim.lr_scheduler_type={kind!r}: use 'constant' or 'cosine'")
    if kind == "cosine" and total <= 0:
        raise ValueError("optim.lr_scheduler_type=cosine needs optim.total_training_steps > 0")
    offset = 1 if kind == "cosine" and not optim_cfg.zero_indexed_step else 0  # verl: the cosine schedule only
    return _lambda_lr(optimizer, offset, kind=kind, warmup=ppo_warmup_steps(optim_cfg, total), total=total,
                      min_lr_ratio=optim_cfg.min_lr_ratio, num_cycles=float(optim_cfg.num_cycles))


def build_sft_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: Any, total_steps: int) -> LambdaLR:
    """The SFT ``LambdaLR`` from ``sft_trainer.yaml``'s ``optim`` over ``total_steps`` updates.

    Raises:
        ValueError: the schedule (``optim.warmup_style`` when set, else ``optim.lr_scheduler``) not one of
            :data:`SCHEDULES`.
    """
    kind = str(optim_cfg.warmup_style if optim_cfg.warmup_style is not None else optim_cfg.lr_scheduler)
    if kind not in SCHEDULES:
        raise ValueError(f"optim.lr_scheduler={kind!r}: use one of {list(SCHEDULES)}")
    m = float(optim_cfg.min_lr_ratio)
    steps = int(optim_cfg.lr_warmup_steps)
    warmup = steps if steps >= 0 else int(float(optim_cfg.warmup_steps_ratio) * total_steps)
    offset = 1 if kind == "cosine" and not optim_cfg.zero_indexed_step else 0  # verl: the cosine schedule only
    return _lambda_lr(optimizer, offset, kind=kind, warmup=warmup, total=int(total_steps), min_lr_ratio=m,
                      num_cycles=float(optim_cfg.num_cycles), stable_ratio=float(optim_cfg.stable_ratio),
                      init_lr_ratio=m if m > 0 else None)
