"""``use_remove_padding``: run a micro-batch's valid tokens as one packed sequence (verl's rmpad path).

The padded micro-batch ``input_ids (b, L)`` with ``attention_mask (b, L)`` holds ``n = attention_mask.sum()``
valid tokens; the packed forward runs one row ``(1, n)`` whose ``position_ids`` restart at 0 at each sequence, and
attends within each sequence only. The outputs are scattered back to ``(b, L, ·)`` (zeros at pads), so callers
slice them exactly like the padded path.

Cost: the projections, MLP and head run on ``n`` instead of ``b·L`` positions (the padding share is saved).
Attention:

* SDPA models of the Llama form (:func:`supports_varlen_attention`): :func:`varlen_sdpa` lays each sequence's
  queries, keys and values out from slot 0 of its own row, ``(b, H, max len, d)``, and runs torch's causal SDPA
  over them: Σ len · max len;
* ``flash_attention_2`` (GPU): its cu_seqlens varlen kernels, Σ len²;
* other models, and checkpointed layers while gradients are on (their recompute in the backward would run outside
  :func:`varlen_attention`): transformers' packed path (≥ 4.56, ``masking_utils.find_packed_sequence_indices``
  detects the restarts when ``attention_mask`` is ``None``), which for ``sdpa``/``eager`` masks the whole pack,
  ``n × n``: on CPU that cost more than the padding it removed (BENCHMARKS.md sections 3 and 11).
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rlhf_core.workers.rollout.grouped_attention import supports_grouped_decode

VARLEN_ATTN = "rlhf_varlen_sdpa"


def pack_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor):
    """``(packed_ids (1, n), packed_position_ids (1, n), flat_index (n,))`` of the valid tokens, row-major.

    ``position_ids`` must count each row's valid tokens from 0 (``clamp(cumsum(mask) − 1, 0)``, as the rollout and
    the datasets build them); the restarts mark the sequence boundaries.

    Raises:
        ValueError: when a row's first valid token does not have position 0 (the boundary would be lost).
    """
    mask = attention_mask.reshape(-1).bool()
    index = mask.nonzero(as_tuple=True)[0]
    ids, pos = input_ids.reshape(-1)[index], position_ids.reshape(-1)[index]
    first = attention_mask.long().cumsum(-1).eq(1) & attention_mask.bool()
    if (position_ids[first] != 0).any():
        raise ValueError("use_remove_padding needs position_ids that restart at 0 at each row's first valid token")
    return ids[None], pos[None], index


def unpack_output(packed: torch.Tensor, index: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Scatter ``packed (1, n, ...)`` back to ``(b, L, ...)``; pad positions get 0."""
    out = packed.new_zeros((shape[0] * shape[1], *packed.shape[2:]))
    out[index] = packed[0]
    return out.view(*shape, *packed.shape[2:])


@dataclass(frozen=True)
class VarlenLayout:
    """Where each packed token sits in a ``(b, max_len)`` grid with every sequence starting at slot 0.

    ``dst (n,)`` int64: packed token ``i`` → grid slot ``row · max_len + position``; ``src (b · max_len,)`` int64:
    grid slot → packed token (slots past a sequence's end point at token 0: causal attention never lets a real
    query read them, and the gradient they send back is exactly 0)."""
    src: torch.Tensor
    dst: torch.Tensor
    rows: int
    max_len: int


_LAYOUT: ContextVar[VarlenLayout | None] = ContextVar("rlhf_varlen_layout", default=None)


def varlen_layout(attention_mask: torch.Tensor, position_ids: torch.Tensor,
                  index: torch.Tensor) -> VarlenLayout | None:
    """The :class:`VarlenLayout` of a micro-batch packed by :func:`pack_inputs` (``index`` its flat positions in
    the ``(b, L)`` grid), or ``None`` when a valid token's position is not the count of valid tokens before it in
    its row (then slot = position would not keep the row's order; transformers' packed path runs instead)."""
    b, L = attention_mask.shape
    mask = attention_mask.long()
    pos = position_ids.reshape(-1)[index]
    if not torch.equal(pos, (mask.cumsum(-1) - 1).reshape(-1)[index]):
        return None
    max_len = int(pos.max()) + 1 if pos.numel() else 1
    dst = torch.div(index, L, rounding_mode="floor") * max_len + pos
    src = torch.zeros(b * max_len, dtype=torch.long, device=index.device)
    src[dst] = torch.arange(index.numel(), device=index.device)
    return VarlenLayout(src, dst, b, max_len)


def varlen_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                **kwargs) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` function of a packed forward inside :func:`varlen_attention`: causal attention
    within each sequence of the pack.

    ``query (1, H, n, d)``, ``key``/``value (1, KV, n, d)`` in packed order → ``(1, n, H, d)``. Each is gathered
    into ``(b, ·, max_len, d)`` by the active layout and run through transformers' SDPA call with
    ``is_causal=True`` (GQA, scaling and dropout as the model's own SDPA attention); the outputs are gathered back
    to packed order. ``attention_mask`` is unused (transformers builds none for this implementation).

    Raises:
        RuntimeError: outside :func:`varlen_attention`, or for a query that is not the active pack."""
    layout = _LAYOUT.get()
    if layout is None or query.shape[0] != 1 or query.shape[2] != layout.dst.numel():
        raise RuntimeError(f"{VARLEN_ATTN} attention serves packed forwards inside varlen_attention only "
                           f"(query {tuple(query.shape)})")

    def grid(x: torch.Tensor) -> torch.Tensor:  # (1, h, n, d) -> (b, h, max_len, d)
        h, d = x.shape[1], x.shape[3]
        return x[0].transpose(0, 1).index_select(0, layout.src).view(layout.rows, layout.max_len, h, d).transpose(1, 2)

    out, _ = sdpa_attention_forward(module, grid(query), grid(key), grid(value), None, dropout=dropout,
                                    scaling=scaling, is_causal=True)  # (b, max_len, H, d)
    H, d = out.shape[2], out.shape[3]
    return out.reshape(-1, H, d).index_select(0, layout.dst).unsqueeze(0), None


AttentionInterface.register(VARLEN_ATTN, varlen_sdpa)


def supports_varlen_attention(model: nn.Module) -> bool:
    """Whether :func:`varlen_sdpa` may replace ``model``'s attention in a packed forward: the models the grouped
    decode serves (a Llama-form decoder on SDPA, every layer full attention:
    :func:`~rlhf_core.workers.rollout.grouped_attention.supports_grouped_decode`) that can switch their attention
    implementation, and not while checkpointed layers record gradients (their recompute in the backward runs after
    the switch is undone)."""
    if not (hasattr(model, "set_attn_implementation") and supports_grouped_decode(model)):
        return False
    checkpointing = getattr(model, "is_activation_checkpointing", False)
    return not (checkpointing and model.training and torch.is_grad_enabled())


@contextlib.contextmanager
def varlen_attention(model: nn.Module, layout: VarlenLayout):
    """``model`` runs :func:`varlen_sdpa` with ``layout`` inside, its own attention implementation again on exit
    (an exception included)."""
    previous = model.config._attn_implementation
    token = _LAYOUT.set(layout)
    model.set_attn_implementation(VARLEN_ATTN)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
        _LAYOUT.reset(token)


def _packed_forward(model: nn.Module, grid_mask: torch.Tensor, grid_positions: torch.Tensor, index: torch.Tensor,
                    **inputs):
    """``model(**inputs, attention_mask=None, use_cache=False)`` of a pack (``grid_*``: the padded ``(b, L)`` mask
    and positions it came from), per sequence through :func:`varlen_sdpa` where
    :func:`supports_varlen_attention` holds, else through transformers' packed path."""
    layout = varlen_layout(grid_mask, grid_positions, index) if supports_varlen_attention(model) else None
    context = varlen_attention(model, layout) if layout is not None else contextlib.nullcontext()
    with context:
        return model(attention_mask=None, use_cache=False, **inputs)


def packed_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  position_ids: torch.Tensor, keep_last: int | None = None) -> torch.Tensor:
    """``model(...).logits`` of a padded micro-batch computed packed: ``(b, L, V)`` (``V`` = 1 for a value head),
    equal to the padded forward at every valid position (to float tolerance), 0 at pads.

    ``keep_last``: only the last ``keep_last`` columns are wanted; the model (it must accept ``logits_to_keep``)
    runs its head on the packed positions of those columns only and the result is ``(b, keep_last, V)``."""
    ids, pos, index = pack_inputs(input_ids, attention_mask, position_ids)
    if keep_last is None:
        out = _packed_forward(model, attention_mask, position_ids, index, input_ids=ids, position_ids=pos)
        return unpack_output(out.logits, index, tuple(input_ids.shape))
    b, L = input_ids.shape
    start = L - keep_last
    kept = (index % L >= start).nonzero(as_tuple=True)[0]  # packed positions in the kept columns
    out = _packed_forward(model, attention_mask, position_ids, index, input_ids=ids, position_ids=pos,
                          logits_to_keep=kept)
    flat = index[kept]
    logits = out.logits.new_zeros((b * keep_last, out.logits.shape[-1]))
    logits[(flat // L) * keep_last + flat % L - start] = out.logits[0]
    return logits.view(b, keep_last, -1)


def packed_next_token_ce(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``Σ CE(logits[:, c], input_ids[:, c+1]) · loss_mask[:, c]`` over ``c < L-1`` (SFT's loss sum, verl's
    ``fsdp_sft_trainer``), computed packed: a 0-d float32 tensor with grad, equal to the padded forward's sum to
    float tolerance. The cross-entropy runs on the ``n`` valid positions only, never on a ``(b, L, V)`` grid.

    Args:
        input_ids, attention_mask, position_ids, loss_mask: ``(b, L)``; ``loss_mask`` may be nonzero only where
            ``attention_mask`` is 1 and the next column is a token of the same row (true of SFT batches).
    Raises:
        ValueError: from :func:`pack_inputs` (positions that do not restart at 0)."""
    ids, pos, index = pack_inputs(input_ids, attention_mask, position_ids)
    logits = _packed_forward(model, attention_mask, position_ids, index, input_ids=ids, position_ids=pos).logits[0]
    L = input_ids.shape[1]
    weight = loss_mask.float().reshape(-1)[index] * (index % L < L - 1).float()  # the last column predicts nothing
    labels = input_ids.reshape(-1)[(index + 1).clamp(max=input_ids.numel() - 1)]
    ce = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")
    return (ce * weight).sum()
