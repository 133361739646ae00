"""AdamW and the LR schedule from ``*.optim`` (verl's FSDP optimizer config).

Schedule: linear warmup over ``W`` steps, then ``constant`` or ``cosine``: factor
``min_lr_ratio + (1 − min_lr_ratio)·½(1 + cos(2π·num_cycles·p))`` with progress ``p = (s − W)/(total − W)``
(verl's default ``num_cycles=0.5`` is one half-wave, reaching ``min_lr_ratio``·lr at the last step).
``W = lr_warmup_steps`` when ``>= 0``, else ``int(lr_warmup_steps_ratio × total_training_steps)``.

The first update never runs at LR 0: the warmup factor at scheduler step ``s`` is ``(s + 1) / (W + 1)``
(transformers' ``get_*_schedule_with_warmup`` use ``s / W``, which is 0 at the first step). It reaches 1 at
``s = W``, exactly where the transformers schedule does; after it the two agree. ``W = total`` does not crash.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import torch
from torch.optim.lr_scheduler import LambdaLR


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_cfg: Mapping[str, Any]) -> torch.optim.AdamW:
    """``AdamW(lr, betas, weight_decay, eps)`` with values from ``optim_cfg`` (an ``optim`` section).

    sft_trainer.yaml's ``optim`` has no ``eps`` (verl's SFT trainer leaves AdamW's default): 1e-8 there."""
    eps = optim_cfg.eps if "eps" in optim_cfg else 1e-8
    return torch.optim.AdamW(
        [p for p in params if p.requires_grad], lr=float(optim_cfg.lr), betas=tuple(optim_cfg.betas),
        weight_decay=float(optim_cfg.weight_decay), eps=float(eps))


def warmup_steps(optim_cfg: Mapping[str, Any], total_training_steps: int) -> int:
    steps = int(optim_cfg.lr_warmup_steps)
    if steps >= 0:
        return steps
    ratio = float(optim_cfg.lr_warmup_steps_ratio)
    if ratio > 0 and total_training_steps <= 0:
        raise ValueError("optim.lr_warmup_steps_ratio > 0 needs optim.total_training_steps > 0 "
                         "(the driver injects it; set optim.lr_warmup_steps instead)")
    return int(ratio * max(total_training_steps, 0))


def lr_lambda(step: int, warmup: int, total: int, kind: str, min_lr_ratio: float, num_cycles: float) -> float:
    """LR multiplier at scheduler step ``step`` (0-based; step 0 is the first update)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * max(0.0, cosine)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: Mapping[str, Any],
                       total_training_steps: int | None = None) -> LambdaLR:
    """The schedule of the module docstring; stepped once per ``update_*`` call (one training step).

    ``total_training_steps`` defaults to ``optim_cfg.total_training_steps``.
    Raises ``ValueError`` for an unknown ``lr_scheduler_type`` (the key is named) or a cosine schedule
    without a total step count."""
    total = int(total_training_steps if total_training_steps is not None else optim_cfg.total_training_steps)
    kind = str(optim_cfg.lr_scheduler_type)
    if kind not in ("constant", "cosine"):
        raise ValueError(f"optim.lr_scheduler_type={kind!r}: use 'constant' or 'cosine'")
    if kind == "cosine" and total <= 0:
        raise ValueError("optim.lr_scheduler_type=cosine needs optim.total_training_steps > 0")
    warmup = warmup_steps(optim_cfg, total)
    # critic.optim.min_lr_ratio is null in verl's YAML: no floor, i.e. 0.0
    min_ratio = 0.0 if optim_cfg.min_lr_ratio is None else float(optim_cfg.min_lr_ratio)
    cycles = float(optim_cfg.num_cycles)
    return LambdaLR(optimizer, lambda s: lr_lambda(s, warmup, total, kind, min_ratio, cycles))
