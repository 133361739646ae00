"""SFT learning-rate schedules (``sft_trainer.yaml`` ``optim.lr_scheduler``: ``cosine`` | ``wsd``).

Multiplier of ``optim.lr`` at update ``s`` (0-based; ``T`` updates in all, ``W = int(warmup_steps_ratio × T)``,
``m = min_lr_ratio``):

* warmup (``s < W``): linear from ``start`` at ``s = 0`` to 1 at ``s = W``, with ``start = m`` when ``m > 0`` and
  ``1 / (W + 1)`` when ``m = 0`` — so the first update never runs at LR 0 (for ``m = 0`` this is
  ``(s + 1) / (W + 1)``, the same as the RL optimizer's schedule in ``rlhf_core.workers.optim``);
* ``cosine`` after warmup: ``m + (1 − m)·½(1 + cos(π·p))`` with ``p = (s − W) / max(1, T − W)`` (verl's
  ``get_cosine_schedule_with_warmup``): the schedule reaches ``m·lr`` at ``s = T``, just after the last update, so
  with ``m = 0`` no update runs at LR 0 either;
* ``wsd`` after warmup: hold 1 for the first ``D = int(stable_ratio × (T − W))`` updates, then the same cosine
  with ``p = (s − W − D + 1) / (T − W − D + 1)``: the first decay update is already below the peak.

SEMANTICS example: lr 1.5e-6, warmup 0.1, m = 0.1, T = 100 → 1.5e-7 at s = 0, 1.5e-6 at s = 10, and the last update
(s = 99) at 1.504e-7 (the schedule's end value 1.5e-7 is reached at s = 100).
``W = T`` (warmup over the whole run) is valid: the LR rises until the end.
"""
from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def sft_lr_multiplier(step: int, total: int, warmup: int, kind: str = "cosine", min_lr_ratio: float = 0.0,
                      stable_ratio: float = 0.9) -> float:
    """LR multiplier at update ``step`` (see the module docstring).

    Raises:
        ValueError: for an unknown ``kind``.
    """
    if kind not in ("cosine", "wsd"):
        raise ValueError(f"optim.lr_scheduler={kind!r}: use 'cosine' or 'wsd'")
    m = float(min_lr_ratio)
    if step < warmup:
        start = m if m > 0 else 1.0 / (warmup + 1)
        return start + (1.0 - start) * step / warmup
    if kind == "wsd":
        decay_start = warmup + int(float(stable_ratio) * max(0, total - warmup))
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start + 1) / max(1, total - decay_start + 1))
    else:
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_sft_scheduler(optimizer: torch.optim.Optimizer, optim_cfg, total_steps: int) -> LambdaLR:
    """A ``LambdaLR`` over :func:`sft_lr_multiplier` from ``optim.{warmup_steps_ratio, lr_scheduler, min_lr_ratio,
    stable_ratio}``; step it once per optimizer update."""
    warmup = int(float(optim_cfg.warmup_steps_ratio) * total_steps)
    kind = str(optim_cfg.lr_scheduler)
    m = float(optim_cfg.min_lr_ratio)
    stable = float(optim_cfg.stable_ratio)  # an explicit 0 stays 0 (was rewritten to 0.9)
    sft_lr_multiplier(0, total_steps, warmup, kind, m, stable)  # validates kind early
    return LambdaLR(optimizer, lambda s: sft_lr_multiplier(s, total_steps, warmup, kind, m, stable))
