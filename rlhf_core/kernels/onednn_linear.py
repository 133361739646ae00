"""float32 ``nn.Linear`` layers of the trained and reference models as oneDNN matrix products on CPUs where MKL is slow.

torch multiplies float32 matrices on CPU with MKL's ``sgemm``. MKL picks its code path by CPU vendor, and on a
non-Intel CPU it runs a slower one, where an update's forward and backward products take longer than oneDNN's
(``bench/bench_kernels.py --only linear``; figures in BENCHMARKS.md, "Kernels"). oneDNN, which torch already uses
for bf16 products, picks its kernels by instruction set. :func:`use_onednn_linears` makes the float32 linear layers of a model
(:class:`OneDNNLinearLayer`) call ``torch.ops.mkldnn._linear_pointwise`` (the operator inductor emits for a CPU
linear) in the forward and in the two products of the backward (:class:`OneDNNLinear`).

It is the same float32 arithmetic in another summation order: oneDNN's default ``fpmath`` mode is strict, and torch's
``torch.backends.mkldnn.matmul.fp32_precision`` is left as it is. Which library runs is chosen once per process
(:func:`onednn_is_faster`): the environment variable ``RLHF_FP32_LINEAR`` = ``onednn`` or ``torch`` forces it;
unset or ``auto``, oneDNN where torch's BLAS is MKL on an x86 CPU not made by Intel.
"""
from __future__ import annotations

import functools
import logging
import os
import platform

import torch
from torch import nn

logger = logging.getLogger(__name__)

ENV = "RLHF_FP32_LINEAR"
_CHOICES = ("auto", "onednn", "torch")


def onednn_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (r, in) @ weight (out, in)ᵀ (+ bias)`` → ``(r, out)`` through oneDNN, in ``x``'s dtype (float32 or bf16);
    strided operands and a weight reordered by ``torch.ops.mkldnn._reorder_linear_weight`` are accepted."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def onednn_available() -> bool:
    """Whether this torch build has oneDNN with the linear operator (x86 and aarch64 CPU wheels do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def cpu_vendor() -> str | None:
    """The x86 CPU's ``vendor_id`` from ``/proc/cpuinfo`` (``GenuineIntel``, ``AuthenticAMD``, ...); ``None`` on
    another architecture or where the file cannot be read."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


@functools.cache
def onednn_is_faster() -> bool:
    """The process-wide choice for float32 CPU linears: ``RLHF_FP32_LINEAR`` when set to ``onednn`` or ``torch``;
    otherwise (``auto``) oneDNN when torch's float32 BLAS is MKL (``torch.backends.mkl.is_available()``) and the CPU
    is an x86 CPU not made by Intel (:func:`cpu_vendor`), the case where MKL runs its slower code path.

    A rule rather than a timing: a measurement at start-up, tried first, chose torch in Ray workers that started
    while the rest of the job was loading, and every rank and run must make the same choice.

    Raises ``ValueError`` naming the variable for any other value."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"{ENV}={os.environ[ENV]!r}: expected one of {', '.join(_CHOICES)}")
    if not onednn_available():
        return False
    if choice != "auto":
        return choice == "onednn"
    vendor = cpu_vendor()
    faster = torch.backends.mkl.is_available() and vendor is not None and vendor != "GenuineIntel"
    logger.info("float32 linears: %s (CPU vendor %s, MKL %s; %s=onednn|torch overrides)",
                "oneDNN" if faster else "torch", vendor, "yes" if torch.backends.mkl.is_available() else "no", ENV)
    return faster


class OneDNNLinear(torch.autograd.Function):
    """``y = x Wᵀ + b`` with its backward ``∂x = g W``, ``∂W = gᵀ x``, ``∂b = Σ g``, all three products on oneDNN.

    Shapes: ``x (..., in)``, ``weight (out, in)``, ``bias (out,)`` or None, all float32 on CPU; ``y (..., out)``.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        # the product's own new buffer in x's leading shape, not as a view of it: as torch's matmul does
        # (aten::_unsafe_view). A view output makes FSDP2 warn "returned a view tensor" once per process for the
        # module whose output it is (the LM head's logits: the whole model's), since an in-place op on a view of a
        # module output would drop FSDP's pre-backward hook; nothing else refers to this buffer.
        return torch.ops.aten._unsafe_view(onednn_product(x2, weight, bias), (*x.shape[:-1], weight.shape[0]))

    @staticmethod
    @torch.autograd.function.once_differentiable  # its products have no derivative: a grad of a grad must fail
    def backward(ctx, grad: torch.Tensor):
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = onednn_product(g2, weight.t()).view(*grad.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:  # (xᵀ g)ᵀ: with x as oneDNN's input, faster than gᵀ x
            gw = onednn_product(x2.t(), g2.t()).t().contiguous()
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


class OneDNNLinearLayer(nn.Linear):
    """An ``nn.Linear`` whose float32 CPU calls run :class:`OneDNNLinear`; other calls (bf16 under FSDP2's mixed
    precision or CPU autocast, GPU, sharded ``DTensor`` weights, an empty input) run ``nn.functional.linear`` as
    ``nn.Linear`` does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if (x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu" and x.dim() >= 2 and x.numel() > 0
                and not torch.is_autocast_enabled("cpu") and type(weight) in (torch.Tensor, nn.Parameter)
                and (bias is None or bias.dtype == torch.float32)):
            return OneDNNLinear.apply(x, weight, bias)
        return nn.functional.linear(x, weight, bias)


def use_onednn_linears(model: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` of ``model`` (LoRA's base layers included) into a :class:`OneDNNLinearLayer`
    (same parameters and state-dict keys) when the workers compute on the CPU (no CUDA device: the rule of
    ``workers.fsdp_utils.device``) and :func:`onednn_is_faster`. Call it before FSDP2 wraps the model.

    Returns the number of layers changed (0 when torch's own product is kept)."""
    if torch.cuda.is_available() or not onednn_is_faster():
        return 0
    changed = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = OneDNNLinearLayer
            changed += 1
    return changed
