"""Decode attention over a shared prompt: each distinct prompt's keys and values are stored and read once per
decode step for all the rows that continue it (``rollout.n`` samples of one prompt), instead of once per row.

A decode step's attention reads the whole KV cache, and with ``n`` samples per prompt the plain cache holds every
prompt ``n`` times: at 20 M parameters (8 prompts × 4 samples of ≤ 184-token prompts) SDPA over that cache was half
of a decode step on CPU, bound by memory traffic. Here a layer keeps the prompt's keys/values ``(u, KV, P, d)``
once per distinct prompt and the responses' ``(u, s, KV, T, d)`` per row (``s`` = the largest number of rows of one
prompt; row ``i`` lives at ``[group[i], slot[i]]``), and a step computes

    scores = [q·K_prompt(group) | q·K_response(row)] · scale, prompt padding masked;  p = softmax(scores)
    out = p_prompt · V_prompt(group) + p_response · V_response(row)

the same softmax attention as SDPA over the concatenated cache, with the prompt part one matrix product per
(prompt, KV head) covering all its rows' query heads (the idea of prefix-sharing "cascade" attention, e.g.
FlashInfer's). Scores and the softmax are float32; the outputs equal SDPA's to float rounding
(tests/rlhf_core/workers/test_hf_decode.py). It plugs into transformers through its documented extension point,
``AttentionInterface.register``, switched on only for the decode steps of :func:`rlhf_core.workers.rollout.hf_decode.decode`.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from rlhf_core.kernels.packed_linear import DecodeWeights
from rlhf_core.kernels.model_support import support

ATTN_NAME = "rlhf_grouped_prefix"  # its name in transformers' AttentionInterface (rlhf_core.kernels.install)


@dataclass
class _Groups:
    """Row ↔ (prompt, slot) layout of one decode: ``group``/``slot`` ``(b,)`` int64, ``u`` prompts, ``s`` slots."""
    group: torch.Tensor
    slot: torch.Tensor
    u: int
    s: int
    prompt_bias: torch.Tensor  # (u, 1, 1, 1, P) float32: 0 at prompt tokens, -inf at left padding


_ACTIVE: ContextVar[tuple[_Groups, list["_GroupedLayer"]] | None] = ContextVar("rlhf_grouped_decode", default=None)


class _GroupedLayer(DynamicLayer):
    """A cache layer holding the prompt's keys/values once per distinct prompt and the response's per row."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        g = _ACTIVE.get()[0]
        self.kr[g.group, g.slot, :, self.n] = key_states[:, :, 0]
        self.vr[g.group, g.slot, :, self.n] = value_states[:, :, 0]
        self.n += 1
        return key_states, value_states  # the grouped attention reads the layer, not these

    def get_seq_length(self) -> int:
        return self.kp.shape[-2] + self.n


def sdpa_full_attention(model: nn.Module) -> bool:
    """Whether ``model`` runs SDPA attention and every layer is full (causal) attention (``support(model)
    .sdpa_full_attention``): then a 4-D boolean mask ``(b, 1, 1, kv_len)`` (True = attend), which transformers
    passes through unchanged (``masking_utils``), means what its 2-D padding mask means. Sliding-window or other
    layer kinds build per-layer masks, and eager/flash attention take other mask formats."""
    return support(model).sdpa_full_attention


def supports_grouped_decode(model: nn.Module) -> bool:
    """Whether :func:`grouped_attention` may replace ``model``'s SDPA attention in decode: a Llama-form decoder
    (``model_type`` in ``support.GROUPED_MODEL_TYPES``) for which :func:`sdpa_full_attention` holds."""
    return support(model).grouped_decode


def group_cache(cache: DynamicCache, inverse: torch.Tensor, prompt_mask: torch.Tensor,
                max_new_tokens: int) -> tuple[_Groups, list[_GroupedLayer]] | None:
    """Turn the prefill cache of the ``u`` distinct prompts into grouped layers for the ``b`` rows.

    Args:
        cache: after the prefill forward of the distinct prompts (keys ``(u, KV, P, d)`` per layer).
        inverse: ``(b,)`` int64, row → its prompt's index in the prefill.
        prompt_mask: ``(u, P)`` the distinct prompts' attention masks (0 at left padding).
    Returns:
        the layout and layers to pass to :func:`grouped_decode`, or ``None`` when a layer is not a plain
        ``DynamicLayer`` (the caller keeps the per-row cache).
    """
    if not all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers):
        return None
    b, u = inverse.numel(), prompt_mask.shape[0]
    order = torch.argsort(inverse, stable=True)
    counts = torch.bincount(inverse, minlength=u)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(inverse)
    slot[order] = torch.arange(b, device=inverse.device) - starts[inverse[order]]
    s = int(counts.max())
    bias = torch.zeros(prompt_mask.shape, dtype=torch.float32, device=prompt_mask.device)
    bias = bias.masked_fill(prompt_mask == 0, float("-inf"))[:, None, None, None, :]
    groups = _Groups(inverse, slot, u, s, bias)
    layers = []
    for layer in cache.layers:
        k, v = layer.keys, layer.values
        grouped = _GroupedLayer()
        grouped.keys, grouped.values, grouped.is_initialized = k, v, True
        grouped.kp, grouped.vp, grouped.n = k, v, 0
        grouped.kr = k.new_zeros((u, s, k.shape[1], max_new_tokens, k.shape[-1]))
        grouped.vr = v.new_zeros((u, s, v.shape[1], max_new_tokens, v.shape[-1]))
        layers.append(grouped)
    cache.layers[:] = layers
    return groups, layers


def grouped_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` function of a decode step: ``query (b, H, 1, d)`` → ``(b, 1, H, d)``.

    ``key``/``value`` (the new token's) are already in the layer (:class:`_GroupedLayer`); ``attention_mask`` is
    unused (the prompt padding is in the layout). Raises ``RuntimeError`` outside :func:`grouped_decode` or for a
    query longer than one token (a prefill must use SDPA)."""
    active = _ACTIVE.get()
    if active is None or query.shape[2] != 1:
        raise RuntimeError(f"{ATTN_NAME} attention serves one-token decode steps inside grouped_decode only "
                           f"(query length {query.shape[2]})")
    g, layers = active
    layer = layers[module.layer_idx]
    b, H, _, d = query.shape
    KV, P, n = layer.kp.shape[1], layer.kp.shape[2], layer.n
    rep = H // KV
    scale = d ** -0.5 if scaling is None else scaling
    q = query.new_zeros((g.u, g.s, KV, rep, d))
    q[g.group, g.slot] = query.view(b, KV, rep, d)
    q_prompt = q.permute(0, 2, 1, 3, 4).reshape(g.u, KV, g.s * rep, d)
    s_prompt = torch.matmul(q_prompt, layer.kp.transpose(-1, -2)).view(g.u, KV, g.s, rep, P).permute(0, 2, 1, 3, 4)
    s_resp = torch.matmul(q, layer.kr[:, :, :, :n].transpose(-1, -2))  # (u, s, KV, rep, n)
    scores = torch.cat([s_prompt.float(), s_resp.float()], -1).mul_(scale)
    scores[..., :P] += g.prompt_bias
    p = torch.softmax(scores, -1).to(query.dtype)
    p_prompt = p[..., :P].permute(0, 2, 1, 3, 4).reshape(g.u, KV, g.s * rep, P)
    out = torch.matmul(p_prompt, layer.vp).view(g.u, KV, g.s, rep, d).permute(0, 2, 1, 3, 4)
    out = out + torch.matmul(p[..., P:], layer.vr[:, :, :, :n])
    return out[g.group, g.slot].reshape(b, 1, H, d), None



def supports_decode_step(model: nn.Module) -> bool:
    """Whether :func:`decode_step` computes ``model``'s forward: a Llama/Qwen2/Mistral causal LM (``model.model``
    with ``embed_tokens``, ``rotary_emb``, ``layers``, ``norm``; ``lm_head``) whose decoder layers are the stock
    ones (pre-norm attention and MLP blocks): ``support(model).decode_step``."""
    return support(model).decode_step


def decode_step(model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                weights: DecodeWeights | None = None) -> torch.Tensor:
    """One decode step of a :func:`supports_decode_step` model inside :func:`grouped_decode`: the operations of
    its ``forward`` (same modules, same order: embedding, rotary cos/sin, per layer norm → q/k/v → rotary →
    cache → attention → o_proj + residual, norm → MLP + residual; final norm, LM head) without transformers' call
    plumbing (output classes, kwarg decorators, mask building, per-layer wrappers), which is a sixth of a step of
    the 1 M-parameter model on CPU. Without ``weights`` the logits are bitwise the model's own
    (tests/rlhf_core/workers/test_grouped_attention.py).

    Args:
        input_ids: ``(b, 1)`` int64, the last sampled tokens. position_ids: ``(b, 1)`` int64.
        weights: the model's linear layers reordered for oneDNN (:class:`~.packed_linear.DecodeWeights`, built from
            this model's current weights): the projections then run as oneDNN products, q/k/v as one and gate/up as
            one; the logits equal the model's to float rounding.
    Returns:
        ``(b, 1, V)`` logits in the model's dtype.
    """
    inner = model.model
    b = input_ids.shape[0]
    x = inner.embed_tokens(input_ids)
    cos, sin = inner.rotary_emb(x, position_ids)
    layers = _ACTIVE.get()[1]
    if weights is not None:
        x = x.view(b, -1)
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        y = layer.input_layernorm(x)
        if weights is None:
            q, k, v = attn.q_proj(y), attn.k_proj(y), attn.v_proj(y)
        else:
            w = weights.layers[i]
            q, k, v = w.qkv.split(w.qkv(y))
        q, k, v = (t.view(b, 1, -1, attn.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        layers[i].update(k, v)
        out, _ = grouped_attention(attn, q, k, v, None, scaling=attn.scaling)
        if weights is None:
            x = x + attn.o_proj(out.reshape(b, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            continue
        x = x + w.o(out.reshape(b, -1))
        gate, up = w.gate_up.split(w.gate_up(layer.post_attention_layernorm(x)))
        x = x + w.down(layer.mlp.act_fn(gate) * up)
    if weights is None:
        return model.lm_head(inner.norm(x))
    return weights.lm_head(inner.norm(x)).view(b, 1, -1)


@contextlib.contextmanager
def grouped_decode(model: nn.Module, active: tuple[_Groups, list[_GroupedLayer]]):
    """Context of the decode steps: ``model`` runs :func:`grouped_attention` with the layout and layers ``active``
    (from :func:`group_cache`), and its own attention implementation again on exit, an exception included
    (``set_attn_implementation``).

    Raises:
        RuntimeError: before :func:`rlhf_core.kernels.install` (the attention is not registered)."""
    from rlhf_core.kernels import require_installed

    require_installed("the grouped decode")
    previous = model.config._attn_implementation
    token = _ACTIVE.set(active)
    model.set_attn_implementation(ATTN_NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
        _ACTIVE.reset(token)
