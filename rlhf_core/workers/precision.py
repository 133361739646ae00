"""``fsdp_config.mixed_precision`` (verl's keys): FSDP2 ``MixedPrecisionPolicy`` from ``param_dtype``,
``reduce_dtype`` and ``buffer_dtype``.

The sharded parameters (and the optimizer state) stay in the model's dtype (``model_dtype``, fp32 by default); the
unsharded parameters used by forward and backward are cast to ``param_dtype``, gradients are reduced in
``reduce_dtype``, floating buffers (e.g. rotary ``inv_freq``) are cast to ``buffer_dtype``. All fp32 (the CPU
default in rlhf_core/configs/ppo_trainer.yaml) means no policy: the plain fp32 path. bf16 runs on GPUs and on CPUs with
AVX512-BF16/AMX (oneDNN kernels); whether it pays on a given CPU: BENCHMARKS.md, "bf16 against float32".
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from rlhf_core.models.loading import to_torch_dtype


def mixed_precision_policy(mp_cfg: Mapping[str, Any] | None):
    """A ``torch.distributed.fsdp.MixedPrecisionPolicy`` for ``mp_cfg`` (``param_dtype``, ``reduce_dtype``), or
    ``None`` when both are fp32 (or ``mp_cfg`` is ``None``).

    Raises:
        ValueError: for an unknown dtype spelling (from ``to_torch_dtype``).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if mp_cfg is None:
        return None
    param = to_torch_dtype(mp_cfg["param_dtype"])
    reduce = to_torch_dtype(mp_cfg["reduce_dtype"])
    if param == torch.float32 and reduce == torch.float32:
        return None
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce, output_dtype=None, cast_forward_inputs=True)


@torch.no_grad()
def cast_buffers(model: nn.Module, mp_cfg: Mapping[str, Any] | None) -> None:
    """Cast ``model``'s floating buffers to ``mp_cfg['buffer_dtype']`` in place (no-op for fp32 or ``None``)."""
    if mp_cfg is None:
        return
    dtype = to_torch_dtype(mp_cfg["buffer_dtype"])
    if dtype == torch.float32:
        return
    for module in model.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf is not None and buf.is_floating_point():
                module._buffers[name] = buf.to(dtype)
