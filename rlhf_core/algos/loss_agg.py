"""Loss aggregation over tokens and sequences (``loss_agg_mode``), micro-batch and worker invariant.

``agg_loss(loss_mat, loss_mask, mode)`` alone aggregates the batch it is given (verl ``agg_loss``).
When a mini-batch is split into micro-batches (gradient accumulation) and/or data-parallel workers,
a per-micro-batch mean would weight micro-batches equally rather than tokens/sequences. To get
*exactly* the whole mini-batch's loss and gradient:

1. before the micro-batch loop, count the mini-batch's valid tokens and valid sequences *over all
   micro-batches and all workers* (``global_token_and_seq_counts`` per worker, then all-reduce SUM);
2. call ``agg_loss(..., global_tokens=N_tok, global_seqs=N_seq)`` on each micro-batch: the result is
   that micro-batch's *contribution* (its masked sum ÷ the global count);
3. backpropagate each contribution as is (no ÷ number of micro-batches). The sum of the contributions
   over micro-batches is the mini-batch loss; summing gradients over workers gives its gradient.
   FSDP/DDP *average* gradients over the W workers, so a trainer using them multiplies each
   contribution by W before ``backward`` (and logs the unscaled value).
"""
from __future__ import annotations

import torch

from rlhf_core.algos.utils import masked_sum

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def global_token_and_seq_counts(loss_mask: torch.Tensor) -> tuple[float, float]:
    """(valid tokens, sequences with at least one valid token) of a ``(B, T)`` mask, as floats.

    Sum these over micro-batches and workers to get ``global_tokens`` / ``global_seqs`` for :func:`agg_loss`.
    """
    valid = loss_mask != 0
    return float(loss_mask.float().sum().item()), float(valid.any(dim=-1).sum().item())


def _denominator(global_count: float | None, local_count: torch.Tensor) -> torch.Tensor | float:
    """The global count when given, else the local one; never 0 (an empty batch aggregates to 0, not NaN)."""
    if global_count is not None:
        return max(float(global_count), 1e-8)
    return local_count.clamp_min(1e-8)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss into a scalar (SEMANTICS "Losses"; verl ``core_algos.agg_loss``).

    Modes (m = ``loss_mask``, S = sequences with Σ_t m > 0; fully masked sequences are excluded):

    * ``token-mean``: Σ L·m / Σ m
    * ``token-sum``: Σ L·m (no normaliser; ``global_*`` ignored)
    * ``seq-mean-token-sum``: mean over S of Σ_t L·m
    * ``seq-mean-token-mean``: mean over S of (Σ_t L·m / Σ_t m)
    * ``seq-mean-token-sum-norm``: seq-mean-token-sum ÷ ``loss_scale_factor`` (default ``loss_mask.shape[-1]``,
      the response length; pass a constant when micro-batches are padded to different lengths)

    With ``global_tokens`` (token-mean) or ``global_seqs`` (seq-mean-*) given, the denominator Σ m resp. |S|
    is replaced by that mini-batch-wide count, and the result is this micro-batch's contribution (see the
    module docstring). An empty mask gives 0 (not NaN). Masked positions get zero gradient even if
    ``loss_mat`` is ``inf``/``NaN`` there.

    Args:
        loss_mat: ``(B, T)`` float per-token loss.
        loss_mask: ``(B, T)`` 0/1.
    Returns:
        0-d tensor, dtype of ``loss_mat``.
    Raises:
        ValueError: for an unknown mode.
    """
    if loss_agg_mode == "token-mean":
        denom = _denominator(global_tokens, loss_mask.to(loss_mat.dtype).sum())
        return masked_sum(loss_mat, loss_mask) / denom
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        seq_sum = masked_sum(loss_mat, loss_mask, axis=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_sum = seq_sum / loss_mask.to(loss_mat.dtype).sum(dim=-1).clamp_min(1e-8)
        n_valid = (loss_mask != 0).any(dim=-1)
        denom = _denominator(global_seqs, n_valid.to(loss_mat.dtype).sum())
        loss = torch.where(n_valid, seq_sum, torch.zeros_like(seq_sum)).sum() / denom
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1])
        return loss
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {list(LOSS_AGG_MODES)}")
