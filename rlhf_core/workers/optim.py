"""AdamW from ``*.optim`` (verl's FSDP optimizer config). The LR schedule is in ``rlhf_core.workers.lr_schedule``."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

# devices with a fused (one kernel for all parameters) AdamW in torch 2.x
_FUSED_DEVICES = ("cpu", "cuda")


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_cfg: Mapping[str, Any]) -> torch.optim.AdamW:
    """``AdamW(lr, betas, weight_decay, eps)`` with values from ``optim_cfg`` (an ``optim`` section).

    The update is torch's fused AdamW (``fused=True``) when every trainable parameter is a floating-point tensor on
    CPU or CUDA (FSDP2's DTensors included), else the default implementation. torch picks the per-tensor loop by
    default on CPU (``foreach`` only for CUDA tensors); the fused step is the fastest of the three on an FSDP2 tiny
    Qwen2 (``bench/bench_kernels.py --only adamw``; BENCHMARKS.md, "Kernels"). The result is the same update up to
    float rounding (tests/rlhf_core/workers/test_workers_optim.py).

    sft_trainer.yaml's ``optim`` has no ``eps`` (verl's SFT trainer leaves AdamW's default): 1e-8 there."""
    eps = optim_cfg.eps if "eps" in optim_cfg else 1e-8
    trainable = [p for p in params if p.requires_grad]
    fused = bool(trainable) and all(p.device.type in _FUSED_DEVICES and p.is_floating_point() for p in trainable)
    return torch.optim.AdamW(
        trainable, lr=float(optim_cfg.lr), betas=tuple(optim_cfg.betas),
        weight_decay=float(optim_cfg.weight_decay), eps=float(eps), fused=fused or None)


def keep_optimizer_implementation(optimizer: torch.optim.Optimizer) -> None:
    """Give every param group the optimizer's own ``fused``/``foreach`` choice again after a state load: a loaded
    state carries the saving run's param-group settings, and a checkpoint written before AdamW went fused
    (:func:`build_optimizer`) would otherwise turn the fused kernel off for the rest of the run."""
    for group in optimizer.param_groups:
        for key in ("fused", "foreach"):
            if key in optimizer.defaults:
                group[key] = optimizer.defaults[key]
