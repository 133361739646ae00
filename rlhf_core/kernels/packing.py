"""``use_remove_padding``: run a micro-batch's valid tokens as one packed sequence (verl's rmpad path).

The padded micro-batch ``input_ids (b, L)`` with ``attention_mask (b, L)`` holds ``n = attention_mask.sum()``
valid tokens; the packed forward runs one row ``(1, n)`` whose ``position_ids`` restart at 0 at each sequence, and
attends within each sequence only. The outputs are scattered back to ``(b, L, ·)`` (zeros at pads), so callers
slice them exactly like the padded path. Used by the actor and reference (:func:`packed_logits`), the critic, the
reward model (:func:`packed_forward`, its score read at each sequence's last token) and SFT
(:func:`packed_next_token_ce`). Where the CPU path runs each repeated prompt once (``shared_prefix.py``) and in
the HF rollout's prefill, :func:`packed_prompt_pass` packs the distinct prompts and lays their keys and values out
as the padded cache the response tokens attend to.

Cost: the projections, MLP and head run on ``n`` instead of ``b·L`` positions (the padding share is saved).
Attention:

* SDPA models of the Llama form (:func:`supports_varlen_attention`): :func:`varlen_sdpa` lays each sequence's
  queries, keys and values out from slot 0 of its own row, ``(b, H, max len, d)``, and runs causal SDPA over them
  (bf16 on CPU by matrix products, :func:`sdpa`): about b · max len² / 2 scores (every row runs to the longest
  sequence's length; the padded forward's attention is over its full width). Its layout travels as a forward keyword, so activation checkpointing's
  recompute attends the same way;
* ``flash_attention_2`` (GPU): its cu_seqlens varlen kernels, Σ len²;
* other models: transformers' packed path (≥ 4.56, ``masking_utils.find_packed_sequence_indices`` detects the
  restarts when ``attention_mask`` is ``None``), which for ``sdpa``/``eager`` masks the whole pack, ``n × n``: on CPU
  that cost more than the padding it removed (BENCHMARKS.md, "`use_remove_padding`").

Only models whose packed forward was checked against the padded one are packed (:func:`check_packing_support`;
verl's ``check_model_support_rmpad`` refuses unlisted models too): OPT and Bloom derive positions from the attention
mask (learned positions, ALiBi), and a forward without ``position_ids`` (``FalconForSequenceClassification``)
drops the restarts; their packed tokens would attend across sequences and give other numbers silently.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward as _SDPA

from rlhf_core.kernels.matmul_attention import matmul_attention, prefers_matmul_attention
from rlhf_core.kernels.model_support import PACKED_MODEL_TYPES, support  # noqa: F401 - PACKED_MODEL_TYPES re-exported

LAYOUT_KWARG = "rlhf_varlen_layout"  # the forward keyword that carries a pack's layout down to the attention
ULYSSES_KWARG = "rlhf_ulysses"  # ... and a sequence-parallel group's (rlhf_core/workers/ulysses.py)


def pack_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor):
    """``(packed_ids (1, n), packed_position_ids (1, n), flat_index (n,))`` of the valid tokens, row-major.

    ``position_ids`` must count each row's valid tokens from 0 (``clamp(cumsum(mask) − 1, 0)``, as the rollout and
    the datasets build them): the packed forward attends within each row, in that order, and a padded forward with
    other positions (a gap, a restart inside a row) is not one it can reproduce.

    Raises:
        ValueError: when ``position_ids`` is not shaped like ``attention_mask``, when a valid token's position is
            not the count of valid tokens before it in its row, or when no row holds a valid token.
    """
    if position_ids.shape != attention_mask.shape:
        raise ValueError(f"use_remove_padding needs 2-D position_ids shaped like attention_mask "
                         f"{tuple(attention_mask.shape)}, got {tuple(position_ids.shape)} (multi-axis rotary "
                         "positions are not supported packed)")
    mask = attention_mask.reshape(-1).bool()
    index = mask.nonzero(as_tuple=True)[0]
    if index.numel() == 0:
        raise ValueError("use_remove_padding: the micro-batch holds no valid token (attention_mask is all 0)")
    ids, pos = input_ids.reshape(-1)[index], position_ids.reshape(-1)[index]
    counts = (attention_mask.long().cumsum(-1) - 1).reshape(-1)[index].to(pos.dtype)
    if not torch.equal(pos, counts):
        i = int((pos != counts).nonzero()[0, 0])
        row, col = divmod(int(index[i]), attention_mask.shape[-1])
        raise ValueError(f"use_remove_padding needs position_ids that count each row's valid tokens from 0 "
                         f"(clamp(cumsum(attention_mask) - 1, 0)); row {row}, column {col} has position "
                         f"{int(pos[i])}, the count there is {int(counts[i])}")
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


def varlen_layout(attention_mask: torch.Tensor, index: torch.Tensor, packed_positions: torch.Tensor) -> VarlenLayout:
    """The :class:`VarlenLayout` of a micro-batch packed by :func:`pack_inputs`: ``index (n,)`` its tokens' flat
    positions in the ``(b, L)`` grid, ``packed_positions (1, n)`` their positions (counts, so slot = position)."""
    b, L = attention_mask.shape
    pos = packed_positions[0].long()
    max_len = int(pos.max()) + 1
    dst = torch.div(index, L, rounding_mode="floor") * max_len + pos
    src = torch.zeros(b * max_len, dtype=torch.long, device=index.device)
    src[dst] = torch.arange(index.numel(), device=index.device)
    return VarlenLayout(src, dst, b, max_len)


def sdpa(module: nn.Module | None, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         attention_mask: torch.Tensor | None, dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """Transformers' SDPA attention (``sdpa_attention_forward``), computed by
    :func:`~rlhf_core.kernels.matmul_attention.matmul_attention` where that is faster (bf16 on CPU, bounded score
    size: :func:`~rlhf_core.kernels.matmul_attention.prefers_matmul_attention`). Same arguments and result."""
    if prefers_matmul_attention(query, key, attention_mask, dropout, kwargs):
        return matmul_attention(module, query, key, value, attention_mask, dropout, **kwargs)
    return _SDPA(module, query, key, value, attention_mask, dropout, **kwargs)


def varlen_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, *args, **kwargs) -> tuple[torch.Tensor, None]:
    """The ``sdpa`` entry of transformers' ``AttentionInterface``: transformers' own SDPA attention (through
    :func:`sdpa`, bf16 on CPU by matrix products), except for a packed forward that carries its
    :class:`VarlenLayout` as the ``rlhf_varlen_layout`` keyword (transformers passes a forward's extra keywords down
    to the attention, and activation checkpointing replays them in its recompute): then causal attention within
    each sequence of the pack.

    Packed: ``query (1, H, n, d)``, ``key``/``value (1, KV, n, d)`` in packed order → ``(1, n, H, d)``. Each is
    gathered into ``(b, ·, max_len, d)`` by the layout and run through :func:`sdpa` with ``is_causal=True`` and
    no mask (GQA, scaling and dropout as the model's own); the outputs are gathered back to packed order.
    ``attention_mask`` is then the empty placeholder :func:`packed_forward` passes and is not read. With the
    ``rlhf_ulysses`` keyword (a :class:`~rlhf_core.workers.ulysses.SequenceParallel`) the query, key and value
    hold this rank's slice of the pack and go through :func:`~rlhf_core.workers.ulysses.ulysses_attention`.

    Raises:
        RuntimeError: a layout whose token count is not the query's (a layout passed to another forward)."""
    sp = kwargs.pop(ULYSSES_KWARG, None)
    if sp is not None:  # a sequence-parallel slice: all-to-all to every token, this rank's heads, and back
        return sp.attend(varlen_sdpa, module, query, key, value, attention_mask, *args, **kwargs)
    layout = kwargs.pop(LAYOUT_KWARG, None)
    if layout is None:
        return sdpa(module, query, key, value, attention_mask, *args, **kwargs)
    if query.shape[0] != 1 or query.shape[2] != layout.dst.numel():
        raise RuntimeError(f"{LAYOUT_KWARG}: a layout of {layout.dst.numel()} tokens for query {tuple(query.shape)}")

    def grid(x: torch.Tensor) -> torch.Tensor:  # (1, h, n, d) -> (b, h, max_len, d)
        h, d = x.shape[1], x.shape[3]
        return x[0].transpose(0, 1).index_select(0, layout.src).view(layout.rows, layout.max_len, h, d).transpose(1, 2)

    out, _ = sdpa(module, grid(query), grid(key), grid(value), None, *args, **{**kwargs, "is_causal": True})
    H, d = out.shape[2], out.shape[3]  # (b, max_len, H, d)
    return out.reshape(-1, H, d).index_select(0, layout.dst).unsqueeze(0), None


def supports_varlen_attention(model: nn.Module) -> bool:
    """Whether a packed forward of ``model`` may attend through :func:`varlen_sdpa` (``support(model)
    .varlen_attention``: a Llama-form decoder on SDPA, every layer full attention, whose forward passes extra
    keywords down to the attention)."""
    return support(model).varlen_attention


def packing_unsupported(model: nn.Module) -> str | None:
    """Why a packed forward of ``model`` could differ from its padded one, or ``None`` when it may pack: its
    ``model_type`` must be in :data:`PACKED_MODEL_TYPES` and its forward (a peft wrapper's base model's) must take
    ``position_ids``, which carry the pack's sequence starts (``support(model).packing_refusal``)."""
    return support(model).packing_refusal


def check_packing_support(model: nn.Module, key: str) -> None:
    """Refuse ``use_remove_padding`` for a model :func:`packing_unsupported` names, before any data is run.

    Raises:
        ValueError: naming ``key`` (the config key that asked for packing), the reason and the remedy."""
    reason = packing_unsupported(model)
    if reason is not None:
        raise ValueError(f"{key}=True: {reason}, so its packed forward could silently give other numbers than the "
                         f"padded one (as OPT's and Bloom's do). Set {key}=False.")


def packed_forward(model: nn.Module, attention_mask: torch.Tensor, index: torch.Tensor, ids: torch.Tensor,
                   pos: torch.Tensor, cache=None, **inputs):
    """``model(...)`` of a pack (``ids``/``pos`` ``(1, n)`` from :func:`pack_inputs` of the ``(b, L)``
    ``attention_mask``, ``index (n,)`` their flat positions): per sequence through :func:`varlen_sdpa` where
    :func:`supports_varlen_attention` holds, else through transformers' packed path (``attention_mask=None``: it
    detects the restarts of ``pos``). Returns the model's output, its per-token tensors ``(1, n, ·)``; with
    ``cache`` (an empty ``DynamicCache``) the keys and values are kept there, ``(1, KV, n, d)`` per layer.

    Raises:
        ValueError: a model :func:`packing_unsupported` names (the workers refuse it at start-up already).
        RuntimeError: a model that attends per sequence while :func:`rlhf_core.kernels.install` has not run (the
            ``sdpa`` entry that reads the layout is not in place)."""
    check_packing_support(model, "use_remove_padding")
    if supports_varlen_attention(model):
        from rlhf_core.kernels import require_installed

        require_installed("a packed forward")
        # an empty 4-D mask: transformers passes a 4-D mask through as built, so it builds none; SDPA would refuse
        # it loudly if the layout ever failed to reach the attention
        placeholder = torch.ones((1, 1, 0, 0), dtype=torch.bool, device=ids.device)
        layout = varlen_layout(attention_mask, index, pos)
        return model(input_ids=ids, position_ids=pos, attention_mask=placeholder, cache=cache,
                     use_cache=cache is not None, **{LAYOUT_KWARG: layout}, **inputs)
    return model(input_ids=ids, position_ids=pos, attention_mask=None, cache=cache, use_cache=cache is not None,
                 **inputs)


def packed_prompt_pass(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       position_ids: torch.Tensor, cache) -> torch.Tensor:
    """The prompt pass of a shared prefix or a prefill, run packed: each left-padded prompt's valid tokens only.

    Runs ``model`` on the pack of ``(u, P)`` prompts (:func:`pack_inputs`) with per-sequence attention
    (:func:`varlen_sdpa`) and ``cache`` (an empty ``DynamicCache``) on, then lays each layer's keys and values out
    as the padded forward's cache, ``(u, KV, P, d)``: the same values at valid columns (to float rounding), zeros at
    pads, which every later query masks. Returns the logits at each prompt's last column, ``(u, 1, V)``.
    Differentiable: the scatter sends each key's gradient back to its packed position. Saves the projections and
    MLP of the prompts' padding (``u·P − n`` positions); the attention runs over ``(u, max len)`` as padded.

    Call only where :func:`supports_varlen_attention` holds (its cache layers are plain key/value layers).

    Raises:
        ValueError: a model that does not attend per sequence (:func:`supports_varlen_attention`), a prompt whose
            last column is padding (an empty prompt: left padding puts every prompt's last token there), a model
            :func:`packing_unsupported` names, and from :func:`pack_inputs`."""
    if not supports_varlen_attention(model):
        raise ValueError(f"packed prompt pass: {type(model).__name__} does not attend per sequence in a pack "
                         "(a Llama-form decoder on SDPA with full attention in every layer)")
    u, P = input_ids.shape
    if not bool(attention_mask[:, -1].all()):
        row = int((attention_mask[:, -1] == 0).nonzero()[0, 0])
        raise ValueError(f"packed prompt pass: prompt {row} has padding in its last column (an empty or "
                         "right-padded prompt)")
    ids, pos, index = pack_inputs(input_ids, attention_mask, position_ids)
    rows, cols = torch.div(index, P, rounding_mode="floor"), index % P
    last = (cols == P - 1).nonzero(as_tuple=True)[0]  # each prompt's last token in the pack, in row order
    out = packed_forward(model, attention_mask, index, ids, pos, cache=cache, logits_to_keep=last)

    def padded(x: torch.Tensor) -> torch.Tensor:  # (1, KV, n, d) in pack order -> (u, KV, P, d), zeros at pads
        grid = x.new_zeros((u, x.shape[1], P, x.shape[3]))
        grid[rows, :, cols] = x[0].transpose(0, 1)
        return grid

    for layer in out.cache.layers:
        layer.keys, layer.values = padded(layer.keys), padded(layer.values)
    return out.logits[0][:, None]


def packed_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  position_ids: torch.Tensor, keep_last: int | None = None) -> torch.Tensor:
    """``model(...).logits`` of a padded micro-batch computed packed: ``(b, L, V)`` (``V`` = 1 for a value head),
    equal to the padded forward at every valid position (to float tolerance), 0 at pads.

    ``keep_last``: only the last ``keep_last`` columns are wanted; the model (it must accept ``logits_to_keep``)
    runs its head on the packed positions of those columns only and the result is ``(b, keep_last, V)``.

    Raises:
        ValueError: ``keep_last`` < 1, and from :func:`pack_inputs`."""
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"packed_logits: keep_last={keep_last} must be at least 1 (or None for every column)")
    ids, pos, index = pack_inputs(input_ids, attention_mask, position_ids)
    if keep_last is None:
        out = packed_forward(model, attention_mask, index, ids, pos)
        return unpack_output(out.logits, index, tuple(input_ids.shape))
    b, L = input_ids.shape
    start = L - keep_last
    kept = (index % L >= start).nonzero(as_tuple=True)[0]  # packed positions in the kept columns
    out = packed_forward(model, attention_mask, index, ids, pos, logits_to_keep=kept)
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
        input_ids, attention_mask, position_ids, loss_mask: ``(b, L)``.
    Raises:
        ValueError: ``loss_mask`` weights a padding position (the packed forward has no logits there; SFT datasets
            never do this), and from :func:`pack_inputs`."""
    stray = (loss_mask[:, :-1] != 0) & (attention_mask[:, :-1] == 0)
    if stray.any():
        row, col = (int(v) for v in stray.nonzero()[0])
        raise ValueError(f"use_remove_padding: loss_mask is {loss_mask[row, col].item()} at row {row}, column {col}, "
                         "where attention_mask is 0 (a padding position has no logits to train)")
    ids, pos, index = pack_inputs(input_ids, attention_mask, position_ids)
    logits = packed_forward(model, attention_mask, index, ids, pos).logits[0]
    L = input_ids.shape[1]
    weight = loss_mask.float().reshape(-1)[index] * (index % L < L - 1).float()  # the last column predicts nothing
    labels = input_ids.reshape(-1)[(index + 1).clamp(max=input_ids.numel() - 1)]
    ce = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")
    return (ce * weight).sum()
