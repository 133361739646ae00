"""AdamW from ``*.optim`` (verl's FSDP optimizer config). The LR schedule is in ``rlhf_core.workers.lr_schedule``."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_cfg: Mapping[str, Any]) -> torch.optim.AdamW:
    """``AdamW(lr, betas, weight_decay, eps)`` with values from ``optim_cfg`` (an ``optim`` section).

    sft_trainer.yaml's ``optim`` has no ``eps`` (verl's SFT trainer leaves AdamW's default): 1e-8 there."""
    eps = optim_cfg.eps if "eps" in optim_cfg else 1e-8
    return torch.optim.AdamW(
        [p for p in params if p.requires_grad], lr=float(optim_cfg.lr), betas=tuple(optim_cfg.betas),
        weight_decay=float(optim_cfg.weight_decay), eps=float(eps))
