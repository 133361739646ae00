"""Masked reductions and log-prob/entropy helpers shared by the RL math (verl's ``torch_functional``).

Masking rule for every function here: ``mask`` is ``(B, T)`` (any dtype, 0 = padding, non-zero =
valid, used as a weight); values at masked positions are *ignored*, even when they are ``inf`` or
``NaN`` (they are replaced by 0 before multiplying, so neither value nor gradient leaks).
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

_EPS_COUNT = 1e-8


def _masked_values(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values * mask`` with masked positions exactly 0 (no ``0 * inf = NaN``)."""
    mask = mask.to(values.dtype) if mask.dtype == torch.bool else mask
    return torch.where(mask != 0, values * mask, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values·mask over ``axis`` (all elements when ``None``).

    Args:
        values: ``(B, T)`` float.
        mask: ``(B, T)`` 0/1 (or weights), broadcastable to ``values``.
    Returns:
        0-d tensor, or ``values`` reduced over ``axis``.
    """
    v = _masked_values(values, mask)
    return v.sum() if axis is None else v.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values·mask / Σ mask over ``axis`` (verl ``masked_mean``); an all-masked slice gives 0, not NaN.

    Args:
        values: ``(B, T)`` float.
        mask: ``(B, T)`` 0/1 (or weights).
    Returns:
        0-d tensor (``axis=None``) or the reduced tensor, e.g. ``(B,)`` for ``axis=-1``.
    """
    m = mask.to(values.dtype)
    total = m.sum() if axis is None else m.sum(dim=axis)
    return masked_sum(values, m, axis) / total.clamp_min(_EPS_COUNT)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid elements (all of them together), unbiased (Bessel) by default, as verl.

    One valid element has variance 0 here (verl divides by zero); no valid element is an error.

    Returns:
        0-d tensor.
    Raises:
        ValueError: when ``mask`` has no valid element.
    """
    m = mask.to(values.dtype)
    count = m.sum()
    if count <= 0:
        raise ValueError("masked_var: the mask has no valid element")
    mean = masked_mean(values, m)
    var = masked_mean((values - mean) ** 2, m)
    if unbiased:
        var = var * count / (count - 1) if count > 1 else torch.zeros_like(var)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values − mean) / sqrt(var + 1e-8) with mean and unbiased var over the valid elements (verl ``masked_whiten``).

    With ``shift_mean=False`` the mean is added back (only the scale is normalised). All positions
    are transformed; callers multiply by the mask afterwards when masked positions must be 0.

    Args:
        values: ``(B, T)`` float.
        mask: ``(B, T)`` 0/1.
    Returns:
        ``(B, T)``, dtype of ``values``.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    safe = torch.where(mask != 0, values, mean)
    whitened = (safe - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


class _LabelLogProb(torch.autograd.Function):
    """``x[label] − logsumexp(x)`` per row of ``x (N, V)`` (any float dtype) with ``labels (N, 1)`` int64 →
    ``(N,)`` float32, in float32 ``chunk_rows`` rows at a time, forward and backward.

    The gradient ``∂/∂x = g · (onehot(label) − softmax(x))`` is written chunk by chunk into one ``(N, V)`` buffer
    of ``x``'s dtype (for float32 in place: ``−g · exp(x − lse)``, then ``g`` scattered at the labels). Autograd over
    per-chunk slices instead zero-filled a full ``(N, V)`` gradient per chunk and added them up, and its gather
    backward zero-filled another per chunk; here the only ``(N, V)`` buffer above the logits is the gradient itself,
    bitwise equal to autograd's (``bench/bench_kernels.py --only logprob,logprob_memory`` times both forms and their
    memory; figures in BENCHMARKS.md, "Kernels"). Saved for backward: ``x`` itself and the
    ``(N, 1)`` logsumexp. First-order gradients only: a double backward raises (``once_differentiable``), and
    ``torch.func`` transforms and forward-mode AD are not supported (nothing in the PPO step uses them)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, labels: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        n = x.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=x.device)
        lse = torch.empty((n, 1), dtype=torch.float32, device=x.device)
        for s in range(0, n, chunk_rows):
            chunk = x[s:s + chunk_rows].float()
            torch.logsumexp(chunk, dim=-1, keepdim=True, out=lse[s:s + chunk_rows])
            out[s:s + chunk_rows] = (chunk.gather(-1, labels[s:s + chunk_rows]) - lse[s:s + chunk_rows]).squeeze(-1)
        ctx.save_for_backward(x, labels, lse)
        ctx.chunk_rows = chunk_rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        x, labels, lse = ctx.saved_tensors
        g = grad_out.unsqueeze(-1).float()
        grad = torch.empty_like(x)
        in_place = x.dtype == torch.float32  # else each chunk in float32, then cast into the buffer
        for s in range(0, x.shape[0], ctx.chunk_rows):
            rows = slice(s, s + ctx.chunk_rows)
            part = grad[rows] if in_place else torch.empty(grad[rows].shape, dtype=torch.float32, device=x.device)
            torch.sub(x[rows].float(), lse[rows], out=part).exp_().mul_(-g[rows])
            part.scatter_add_(-1, labels[rows], g[rows])
            if not in_place:
                grad[rows] = part
        return grad, None, None


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """log softmax(logits)[label] per position: ``logits[label] − logsumexp(logits)``.

    Computed in float32 ``chunk_rows`` rows at a time, so a bf16 ``(B, T, V)`` tensor is never
    upcast or log-softmaxed whole (verl ``logprobs_from_logits_v2``); the gradient is written into one buffer
    (:class:`_LabelLogProb`).

    Args:
        logits: ``(B, T, V)`` float (any float dtype).
        labels: ``(B, T)`` int64 token ids.
    Returns:
        ``(B, T)`` float32.
    """
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    flat_labels = labels.reshape(-1, 1).to(torch.long)
    return _LabelLogProb.apply(flat, flat_labels, max(1, int(chunk_rows))).reshape(labels.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int = 128) -> torch.Tensor:
    """Entropy of softmax(logits) per position: H = −Σ_v p_v·log p_v (verl ``entropy_from_logits`` computes the
    same value as logsumexp(z) − Σ_v p_v·z_v).

    Stable for large logits (logsumexp) and for ``-inf`` logits: ``log p`` is clamped at −1e4, where ``p`` is
    exactly 0 in float32 (below about −104), so a banned token's term is ``0 · (−1e4) = 0``, not NaN, and the
    gradient stays finite for any finite upstream gradient (a clamp: ``where(isfinite)`` cost more than the rest
    of the pass on CPU). Computed in float32, ``chunk_rows`` rows at a time (128 rows of a 2,000-token
    vocabulary stay in the L2 cache). ``bench/bench_kernels.py --only entropy`` times the old form
    (``where(isfinite)``, chunks of 1,024, under autograd) against this one without autograd (BENCHMARKS.md,
    "Kernels").

    Args:
        logits: ``(B, T, V)`` float.
    Returns:
        ``(B, T)`` float32.
    """
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    parts = []
    # chunks by split: under autograd (entropy_coeff != 0) one concatenation joins their gradients, where a slice
    # per chunk made its backward zero-fill a full (N, V) gradient per chunk and add them up
    for chunk in flat.split(max(1, int(chunk_rows))):
        log_p = chunk.float()
        log_p = log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)
        parts.append(-(torch.exp(log_p) * log_p.clamp(min=-1e4)).sum(-1))
    if not parts:
        return torch.zeros(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    return torch.cat(parts).reshape(logits.shape[:-1])
