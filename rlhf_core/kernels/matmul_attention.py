"""bf16 attention on CPU as two matrix products and a softmax, where torch's CPU flash-attention kernel is slow.

On CPU, ``scaled_dot_product_attention`` runs a flash-attention kernel. In float32 it is as fast as the
alternatives. In bfloat16 it runs its own tiled loops with conversions, while bf16 matrix products use the CPU's
``avx512_bf16`` instructions through oneDNN: on an AVX512-BF16 CPU without AMX the matrix products and a bf16
softmax below take less time over the update's shapes (``bench/bench_kernels.py --only attention``; figures in
BENCHMARKS.md, "Kernels").

:func:`matmul_attention` computes transformers' SDPA attention (``sdpa_attention_forward``: the same inputs, output
layout, GQA and ``is_causal`` rules) as

    scores = (q · Kᵀ) · scaling, masked with the dtype's minimum;  p = softmax(scores);  out = p · V

with the query heads of one key/value head stacked into one matrix product, so keys and values are never
repeated. Scores and probabilities are bf16 tensors (the products accumulate in float32): the rounding of
transformers' ``eager`` attention in bf16 and of the rollout's grouped decode attention
(``kernels/grouped_attention.py``), which rounds its scores to bf16 too. Against a float32 copy of the model the
response log-probs are as close as with SDPA (the same benchmark measures both; BENCHMARKS.md, "Kernels").

Cost: it keeps one bf16 ``(b, H, q, k)`` probability tensor per layer for the backward, where flash attention keeps
``(b, H, q)``; :func:`prefers_matmul_attention` takes the path only while that tensor is at most
:data:`MAX_SCORE_BYTES`, and only for bf16 on CPU without dropout, a position bias, softcapping or sinks.
"""
from __future__ import annotations

import torch
from torch import nn

# the largest (b, H, q, k) bf16 score tensor one call may build (the backward keeps one per layer); larger calls
# keep SDPA's flash attention, whose memory is linear in k
MAX_SCORE_BYTES = 64 * 2**20
# keywords of transformers' attention calls that change the arithmetic; with any of them set, SDPA runs
_UNSUPPORTED_KWARGS = ("position_bias", "softcap", "s_aux", "output_attentions")


def prefers_matmul_attention(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
                             dropout: float, kwargs: dict) -> bool:
    """Whether :func:`matmul_attention` serves this call: bf16 on CPU, no dropout, none of the keywords in
    ``_UNSUPPORTED_KWARGS`` set, whole key/value groups (``H % KV == 0``), the query's batch the keys' (SDPA would
    broadcast one of them), a mask (if any) shared by all heads (``(b or 1, 1, q, k)``), and a score tensor of at
    most :data:`MAX_SCORE_BYTES`."""
    if query.device.type != "cpu" or query.dtype != torch.bfloat16 or dropout:
        return False
    if any(kwargs.get(k) is not None and kwargs.get(k) is not False for k in _UNSUPPORTED_KWARGS):
        return False
    if query.shape[1] % key.shape[1] or query.shape[0] != key.shape[0]:  # whole groups; no batch broadcast
        return False
    if attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1] != 1):
        return False
    b, H, q, _ = query.shape
    return b * H * q * key.shape[2] * query.element_size() <= MAX_SCORE_BYTES


def matmul_attention(module: nn.Module | None, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Transformers' SDPA attention computed by matrix products (call where :func:`prefers_matmul_attention` holds).

    Args:
        query: ``(b, H, q, d)``. key: ``(b, KV, k, d)`` with ``H % KV == 0``. value: ``(b, KV, k, dv)`` (``dv``
            may differ from ``d``, as in DeepSeek's multi-head latent attention).
        attention_mask: ``None``, or ``(b or 1, 1, q, k)``: bool (True = attend) or additive float.
        scaling: the score scale, ``d ** -0.5`` when ``None``.
        is_causal: as in ``sdpa_attention_forward``: causal (top-left, keys cropped to the first ``q``) only when
            ``q > 1`` and no mask is given; ``None`` reads ``module.is_causal`` (True without a module).
    Returns:
        ``((b, q, H, dv) contiguous, None)``, the layout of transformers' attention functions.

    A query row with every key masked gets a uniform average of the values (finite, as in ``eager`` attention);
    transformers' masks give such rows only at padding positions, whose outputs nothing reads.
    """
    b, H, q, d = query.shape
    KV = key.shape[1]
    rep = H // KV
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    causal = q > 1 and attention_mask is None and is_causal
    if causal and key.shape[2] > q:
        key, value = key[:, :, :q], value[:, :, :q]
    k = key.shape[2]
    scale = d ** -0.5 if scaling is None else scaling
    # (b, KV, rep·q, d) · (b, KV, d, k): one product per key/value head for all the query heads that share it
    scores = torch.matmul(query.reshape(b, KV, rep * q, d), key.transpose(-1, -2)).view(b, KV, rep, q, k)
    scores = scores * scale
    lowest = torch.finfo(scores.dtype).min
    if causal:
        keep = torch.ones(q, k, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, lowest)
    elif attention_mask is not None:
        mask = attention_mask[:, :, None]  # (b, 1, 1, q, k) against (b, KV, rep, q, k)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, lowest)
        else:
            scores = scores + mask.clamp(min=lowest).to(scores.dtype)  # float32's minimum would overflow to -inf
    probs = torch.softmax(scores, -1).view(b, KV, rep * q, k)
    out = torch.matmul(probs, value).view(b, H, q, value.shape[-1])
    return out.transpose(1, 2).contiguous(), None
