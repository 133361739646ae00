"""``use_remove_padding``: run a micro-batch's valid tokens as one packed sequence (verl's rmpad path).

The padded micro-batch ``input_ids (b, L)`` with ``attention_mask (b, L)`` holds ``n = attention_mask.sum()``
valid tokens; the packed forward runs one row ``(1, n)`` whose ``position_ids`` restart at 0 at each sequence.
Hugging Face models (transformers ≥ 4.56, ``masking_utils.find_packed_sequence_indices``) detect the restarts
when ``attention_mask`` is ``None`` and attend within each sequence only: a block-diagonal causal mask for
``sdpa``/``eager`` on CPU, cu_seqlens varlen kernels for ``flash_attention_2`` on GPU. The outputs are scattered
back to ``(b, L, ·)`` (zeros at pads), so callers slice them exactly like the padded path.

Cost: the projections and MLP run on ``n`` instead of ``b·L`` positions (the padding share is saved). Attention
differs by backend: ``flash_attention_2`` (GPU) attends per sequence, Σ len², while ``sdpa``/``eager`` on CPU
compute the whole ``n × n`` block-diagonal mask, O(n²), which for small models with long micro-batches costs more
than the padding it removes (BENCHMARKS.md) — keep it off on CPU.
"""
from __future__ import annotations

import torch
from torch import nn


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


def packed_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  position_ids: torch.Tensor, keep_last: int | None = None) -> torch.Tensor:
    """``model(...).logits`` of a padded micro-batch computed packed: ``(b, L, V)`` (``V`` = 1 for a value head),
    equal to the padded forward at every valid position (to float tolerance), 0 at pads.

    ``keep_last``: only the last ``keep_last`` columns are wanted; the model (it must accept ``logits_to_keep``)
    runs its head on the packed positions of those columns only and the result is ``(b, keep_last, V)``."""
    ids, pos, index = pack_inputs(input_ids, attention_mask, position_ids)
    if keep_last is None:
        out = model(input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False)
        return unpack_output(out.logits, index, tuple(input_ids.shape))
    b, L = input_ids.shape
    start = L - keep_last
    kept = (index % L >= start).nonzero(as_tuple=True)[0]  # packed positions in the kept columns
    out = model(input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False, logits_to_keep=kept)
    flat = index[kept]
    logits = out.logits.new_zeros((b * keep_last, out.logits.shape[-1]))
    logits[(flat // L) * keep_last + flat % L - start] = out.logits[0]
    return logits.view(b, keep_last, -1)
