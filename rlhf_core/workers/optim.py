"""The optimizer from ``*.optim`` (verl 0.9 ``build_optimizer``). The LR schedule is in
``rlhf_core.workers.lr_schedule``."""
from __future__ import annotations

import inspect
from typing import Any, Iterable, Mapping

import torch

from rlhf_core.config.structured import full_key

# devices with a fused (one kernel for all parameters) AdamW in torch 2.x
_FUSED_DEVICES = ("cpu", "cuda")
# the lower-case spellings of this project's actor/critic sections (verl 0.6's `adam`): torch.optim.AdamW
_ALIASES = {"adam": "AdamW", "adamw": "AdamW"}


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The class ``optim.optimizer`` names: ``adam``/``adamw`` → ``torch.optim.AdamW`` (this project's spellings),
    any other name the ``torch.optim`` class of that name (verl 0.9: ``getattr(torch.optim, optimizer)``;
    ``optim.optimizer_impl`` is ``torch.optim`` only).

    Raises:
        ValueError: a name that is no ``torch.optim`` optimizer class."""
    cls = getattr(torch.optim, _ALIASES.get(name, name), None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ValueError(f"optim.optimizer={name!r} is no torch.optim optimizer class")
    return cls


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_cfg: Mapping[str, Any]) -> torch.optim.Optimizer:
    """The optimizer ``optim_cfg.optimizer`` names (:func:`optimizer_class`; AdamW by default) over the trainable
    ``params``, as verl 0.9 builds it: ``lr`` and ``weight_decay``, plus ``betas`` and ``eps`` for an Adam-family
    class (``'adam'`` in its lower-case name), then every item of ``optim.override_optimizer_config`` (verl: it is
    applied last, so it may also replace those).

    Adam and AdamW run torch's fused kernel (``fused=True``) when every trainable parameter is a floating-point
    tensor on CPU or CUDA (FSDP2's DTensors included), else the default implementation (an override's ``fused`` or
    ``foreach`` wins). The fused step is the fastest of the three on an FSDP2 tiny Qwen2 (``bench/bench_kernels.py
    --only adamw``; BENCHMARKS.md, "Kernels"), the same update up to float rounding
    (tests/rlhf_core/workers/test_workers_optim.py).

    verl's SFT trainer has no ``eps`` key (it leaves AdamW's default): sft_trainer.yaml declares ``optim.eps`` (ours)
    at that default, 1e-8.

    Raises:
        ValueError: naming ``optim.override_optimizer_config`` for a keyword the optimizer class does not take
            (before any parameter is touched), or ``optim.optimizer`` for an unknown class."""
    name = str(optim_cfg.optimizer)
    try:
        cls = optimizer_class(name)
    except ValueError as exc:
        raise ValueError(f"{full_key(optim_cfg, 'optimizer')}={name!r}: no torch.optim optimizer class "
                         f"of that name (use adam, adamw, AdamW or another torch.optim class)") from exc
    override = optim_cfg.override_optimizer_config  # null: none
    override = {} if override is None else dict(override)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    unknown = sorted(k for k in override if k not in accepted)
    if unknown:
        raise ValueError(f"{full_key(optim_cfg, 'override_optimizer_config')}: torch.optim.{cls.__name__} takes no "
                         f"keyword {', '.join(map(repr, unknown))}; it takes {sorted(accepted)}")
    trainable = [p for p in params if p.requires_grad]
    kwargs: dict[str, Any] = {"lr": float(optim_cfg.lr), "weight_decay": float(optim_cfg.weight_decay)}
    if "adam" in cls.__name__.lower():
        kwargs["betas"] = tuple(optim_cfg.betas)
        kwargs["eps"] = float(optim_cfg.eps)
    if "fused" in accepted and cls in (torch.optim.Adam, torch.optim.AdamW):
        fused = bool(trainable) and all(p.device.type in _FUSED_DEVICES and p.is_floating_point() for p in trainable)
        kwargs["fused"] = fused or None
    kwargs.update(override)
    if kwargs.get("foreach") and kwargs.get("fused"):  # an override chose foreach: the fused default gives way
        kwargs["fused"] = None
    return cls(trainable, **kwargs)


def keep_optimizer_implementation(optimizer: torch.optim.Optimizer) -> None:
    """Give every param group the optimizer's own ``fused``/``foreach`` choice again after a state load: a loaded
    state carries the saving run's param-group settings, and a checkpoint written before AdamW went fused
    (:func:`build_optimizer`) would otherwise turn the fused kernel off for the rest of the run."""
    for group in optimizer.param_groups:
        for key in ("fused", "foreach"):
            if key in optimizer.defaults:
                group[key] = optimizer.defaults[key]
