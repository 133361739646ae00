"""AdamW from ``*.optim`` (verl's FSDP optimizer config). The LR schedule is in ``rlhf_core.workers.lr_schedule``."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch


def _get(cfg: Mapping[str, Any], key: str, default: Any) -> Any:
    value = cfg.get(key, default) if cfg is not None else default
    return default if value is None else value


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_cfg: Mapping[str, Any]) -> torch.optim.AdamW:
    """``AdamW(lr, betas=(0.9, 0.999), weight_decay=0.01, eps=1e-8)`` with values from ``optim_cfg``."""
    betas = tuple(_get(optim_cfg, "betas", (0.9, 0.999)))
    return torch.optim.AdamW(
        [p for p in params if p.requires_grad], lr=float(_get(optim_cfg, "lr", 1e-6)), betas=betas,
        weight_decay=float(_get(optim_cfg, "weight_decay", 0.01)), eps=float(_get(optim_cfg, "eps", 1e-8)))
