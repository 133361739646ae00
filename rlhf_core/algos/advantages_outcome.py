"""Outcome-reward advantage estimators ``opo``, ``grpo_passk`` and ``gpg`` (``algorithm.adv_estimator``).

Same contract as ``rlhf_core.algos.advantages``: keyword arguments only (unused ones ignored), the sequence score
s_i = Σ_t ``token_level_rewards`` is turned into one advantage per sequence, broadcast to its valid tokens;
``returns`` = ``advantages``; both ``(B, T)`` float32, exactly 0 at masked positions. Group statistics are computed
in float64 (verl: float32), so results agree with verl to float32 rounding.
"""
from __future__ import annotations

from typing import Any

import torch

from rlhf_core.algos.advantages import _broadcast, _finish, register_adv_est
from rlhf_core.algos.groups import group_ids, group_stats_vectorized


@register_adv_est("opo")
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO, on-policy RL with the optimal reward baseline (Hao et al. 2025, arXiv:2505.23585, eq. 5);
    verl ``compute_opo_outcome_advantage``.

    A_i = s_i − b_g with the length-weighted group baseline b_g = Σ_{j∈g} |y_j|·s_j / Σ_{j∈g} |y_j|
    (|y_j| = valid response tokens). A group of one has b = 0 (A = s, as verl). A group whose responses are all
    empty (Σ|y| = 0) gets the plain group mean as baseline (verl divides 0 by 0 and trains on NaN).

    Args:
        token_level_rewards, response_mask: ``(B, T)``. index: ``(B,)`` group keys (verl's ``uid``).
    Returns:
        ``(advantages, returns)`` ``(B, T)`` float32.
    """
    scores = token_level_rewards.double().sum(dim=-1)
    lengths = response_mask.double().sum(dim=-1)
    ids, n_groups = group_ids(index, scores.shape[0])
    ids = ids.to(scores.device)
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=scores.device)
    size = torch.bincount(ids, minlength=n_groups)
    weighted = zeros.clone().index_add_(0, ids, lengths * scores)
    total_len = zeros.clone().index_add_(0, ids, lengths)
    plain_mean = zeros.clone().index_add_(0, ids, scores) / size.double()
    baseline = torch.where(total_len > 0, weighted / total_len.clamp_min(1e-300), plain_mean)
    baseline = torch.where(size == 1, torch.zeros_like(baseline), baseline)
    a = _broadcast(scores - baseline[ids], response_mask)
    return _finish(a, a, response_mask)


@register_adv_est("grpo_passk")
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
    epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k advantage (Tang et al. 2025, "Optimizing Language Models for Inference Time Objectives using
    Reinforcement Learning", arXiv:2503.19595, §4, the leave-one-out max); verl ``compute_grpo_passk_outcome_advantage``.

    In each group only the best response gets a non-zero advantage, r_max − r_second_max (the gain of the group's
    max from including it), divided by (std_g + ``epsilon``) when ``norm_adv_by_std_in_grpo`` (std unbiased). Ties
    for the max give 0 to everyone; the first of the tied rows is "the best" (verl's ``topk`` picks one of them).

    Returns:
        ``(advantages, returns)`` ``(B, T)`` float32.
    Raises:
        ValueError: when a group has fewer than 2 responses (``actor_rollout_ref.rollout.n`` must be ≥ 2),
            naming the group.
    """
    scores = token_level_rewards.double().sum(dim=-1).cpu()
    keys = list(index.tolist() if isinstance(index, torch.Tensor) else index)
    ids, _ = group_ids(index, scores.shape[0])
    members: dict[int, list[int]] = {}
    for row, g in enumerate(ids.tolist()):
        members.setdefault(g, []).append(row)
    adv = torch.zeros_like(scores)
    for rows in members.values():
        if len(rows) < 2:
            raise ValueError(f"adv_estimator 'grpo_passk' needs at least 2 responses per prompt "
                             f"(actor_rollout_ref.rollout.n >= 2); group {keys[rows[0]]!r} has {len(rows)}")
        vals = scores[rows]
        order = torch.sort(vals, descending=True, stable=True).indices
        gain = vals[order[0]] - vals[order[1]]
        if norm_adv_by_std_in_grpo:
            gain = gain / (vals.std(unbiased=True) + epsilon)
        adv[rows[int(order[0])]] = gain
    a = _broadcast(adv.to(response_mask.device), response_mask)
    return _finish(a, a, response_mask)


@register_adv_est("gpg")
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, f_norm: float = 1.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG advantage (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv:2504.02546, eq. 9–10); verl ``compute_gpg_outcome_advantage``.

    A_i = α·(s_i − mean_g)/``f_norm`` with α = B / max(#{i : s_i ≠ 0}, 1) over the whole batch (verl's numbers;
    the paper's α = B/(B − M) counts the M samples in groups whose rewards are all equal, which equals verl's only
    when exactly the non-zero-score samples are the informative ones). A group of one has mean 0. A group whose
    scores are equal up to float rounding gets A = 0 exactly (as ``grpo`` here).

    Args:
        f_norm: the normaliser F_norm (verl's default 1; the trainer does not set it).
    Returns:
        ``(advantages, returns)`` ``(B, T)`` float32.
    """
    scores = token_level_rewards.double().sum(dim=-1)
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
    mean, _, _, const = group_stats_vectorized(scores, index)
    adv = alpha * (scores - mean) / f_norm
    adv = torch.where(const, torch.zeros_like(adv), adv)
    a = _broadcast(adv, response_mask)
    return _finish(a, a, response_mask)
