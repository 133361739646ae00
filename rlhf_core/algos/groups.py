"""Per-group score statistics for the outcome-reward estimators (GRPO, RLOO, REINFORCE++-baseline).

A *group* is the set of sequences sharing a prompt id (``index``, verl's ``uid``). Two
implementations compute the same numbers: a dict-and-loop one that reads like the paper
(``group_stats_loop``) and a scatter/bincount one (``group_stats_vectorized``); tests hold them equal.
Statistics are computed in float64 so that the two agree to float32 rounding.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

# A group whose scores differ by no more than this (relative to max(1, |score|)) is "constant":
# its spread is float rounding, not signal, and its advantages are exactly 0 (SEMANTICS: never explode).
CONSTANT_GROUP_RTOL = 1e-6


def group_ids(index: Any, batch_size: int) -> tuple[torch.Tensor, int]:
    """Dense group ids ``0..G-1`` (in order of first appearance) for per-sequence group keys.

    Args:
        index: ``(B,)`` numpy array (object/str/int), list, or tensor of hashable group keys.
    Returns:
        ``(ids (B,) int64 tensor on CPU, G)``.
    Raises:
        ValueError: when ``index`` does not have ``batch_size`` entries.
    """
    if isinstance(index, torch.Tensor):
        keys = index.detach().cpu().reshape(-1).tolist()
    else:
        keys = list(np.asarray(index, dtype=object).reshape(-1))
    if len(keys) != batch_size:
        raise ValueError(f"index has {len(keys)} entries but the batch has {batch_size} sequences")
    first: dict[Any, int] = {}
    ids = [first.setdefault(k, len(first)) for k in keys]
    return torch.tensor(ids, dtype=torch.long), len(first)


def _is_constant(spread: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return spread <= CONSTANT_GROUP_RTOL * torch.clamp(scale, min=1.0)


def group_stats_loop(scores: torch.Tensor, index: Any) -> tuple[torch.Tensor, ...]:
    """Per-sequence (group mean, unbiased group std, group size, group-is-constant) by a plain loop.

    Args:
        scores: ``(B,)`` float, the sequence scores s_i.
        index: ``(B,)`` group keys.
    Returns:
        ``mean (B,) float64, std (B,) float64, size (B,) int64, constant (B,) bool`` — each sequence gets
        its group's value. A group of one has mean 0, std 1 (verl) and is not "constant".
    """
    b = scores.shape[0]
    ids, _ = group_ids(index, b)
    s = scores.detach().cpu().double()
    members: dict[int, list[int]] = {}
    for i, g in enumerate(ids.tolist()):
        members.setdefault(g, []).append(i)
    mean = torch.zeros(b, dtype=torch.float64)
    std = torch.ones(b, dtype=torch.float64)
    size = torch.ones(b, dtype=torch.long)
    const = torch.zeros(b, dtype=torch.bool)
    for rows in members.values():
        vals = s[rows]
        size[rows] = len(rows)
        if len(rows) == 1:
            continue  # mean 0, std 1
        mean[rows] = vals.mean()
        std[rows] = vals.std(unbiased=True)
        const[rows] = bool(_is_constant(vals.max() - vals.min(), vals.abs().max()))
    dev = scores.device
    return mean.to(dev), std.to(dev), size.to(dev), const.to(dev)


def group_stats_vectorized(scores: torch.Tensor, index: Any) -> tuple[torch.Tensor, ...]:
    """Same outputs as :func:`group_stats_loop`, computed with bincount / scatter_reduce (no Python loop over groups)."""
    b = scores.shape[0]
    ids, n_groups = group_ids(index, b)
    ids = ids.to(scores.device)
    s = scores.detach().double()
    count = torch.bincount(ids, minlength=n_groups).to(torch.float64)
    g_mean = torch.zeros(n_groups, dtype=torch.float64, device=s.device).index_add_(0, ids, s) / count
    centered = s - g_mean[ids]
    sq = torch.zeros(n_groups, dtype=torch.float64, device=s.device).index_add_(0, ids, centered * centered)
    g_std = torch.sqrt(sq / (count - 1).clamp_min(1.0))
    g_max = torch.full((n_groups,), -torch.inf, dtype=torch.float64, device=s.device).scatter_reduce(0, ids, s, "amax")
    g_min = torch.full((n_groups,), torch.inf, dtype=torch.float64, device=s.device).scatter_reduce(0, ids, s, "amin")
    g_scale = torch.zeros(n_groups, dtype=torch.float64, device=s.device).scatter_reduce(0, ids, s.abs(), "amax")
    single = count == 1
    g_mean = torch.where(single, torch.zeros_like(g_mean), g_mean)
    g_std = torch.where(single, torch.ones_like(g_std), g_std)
    g_const = _is_constant(g_max - g_min, g_scale) & ~single
    return g_mean[ids], g_std[ids], count.long()[ids], g_const[ids]
