"""Covariance-based policy losses ``clip_cov`` and ``kl_cov`` (Cui et al. 2025, "The Entropy Mechanism of
Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617, §4 eqs. 12–14).

Both compute, per valid token, the centred product Cov_t = (A_t − mean A)·(logπ_t − mean logπ) (means over the
valid tokens of the batch given, ``log_prob`` detached) and treat the tokens with large covariance specially:
``clip_cov`` drops a random few of the tokens whose covariance lies in (``clip_cov_lb``, ``clip_cov_ub``) from the
gradient; ``kl_cov`` adds ``ppo_kl_coef``·|logπ − logπ_old| to the tokens with the largest covariance. As in verl
the selection is made on the tensors given (with micro-batches, per micro-batch). Contract: see
``rlhf_core.algos.policy_loss`` (``loss_fn(inputs: PolicyLossInputs, config: PolicyLossConfig)``).
"""
from __future__ import annotations

import torch

from rlhf_core.algos.policy_loss import (
    PolicyLossConfig,
    PolicyLossInputs,
    clipped_surrogate,
    pg_metrics,
    register_policy_loss,
)
from rlhf_core.algos.utils import masked_mean


@torch.no_grad()
def clip_cov_selection(
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clipped_by_ratio: torch.Tensor,
    clip_cov_ratio: float,
    clip_cov_lb: float,
    clip_cov_ub: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The tokens Clip-Cov detaches: ``(B, T)`` bool.

    Candidates: valid tokens not already clipped by the ratio clip (``clipped_by_ratio``) with
    ``clip_cov_lb < Cov_t < clip_cov_ub``, Cov_t = (A_t − masked_mean(A))·(logπ_t − masked_mean(logπ)). Of these,
    n = max(⌊``clip_cov_ratio``·Σ mask⌋, 1) are drawn uniformly without replacement (all of them when fewer), with
    ``torch.randperm(generator=generator)`` (the global RNG when ``None``, as verl).
    """
    valid = response_mask != 0
    lp = log_prob.detach()
    cov = (advantages - masked_mean(advantages, response_mask)) * (lp - masked_mean(lp, response_mask))
    candidates = valid & ~clipped_by_ratio & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    n_clip = max(int(clip_cov_ratio * float(response_mask.sum())), 1)
    where = torch.nonzero(candidates)
    selected = torch.zeros_like(valid)
    if len(where) > 0:
        pick = torch.randperm(len(where), generator=generator)[: min(n_clip, len(where))].to(where.device)
        chosen = where[pick]
        selected[chosen[:, 0], chosen[:, 1]] = True
    return selected


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """Clip-Cov (arXiv:2505.22617, eq. 13); verl ``compute_policy_loss_clip_cov``.

    r = exp(logπ − logπ_old) (not clamped, as verl); L_t = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)) (no dual
    clip), multiplied by 0 on the tokens :func:`clip_cov_selection` picks (their gradient is cut; verl zeroes the
    loss there too; the draw uses the global RNG, as verl), × ``rollout_is_weights`` when given, aggregated by
    ``config.loss_agg_mode``. Reads ``config.clip_cov_ratio`` (fraction of valid tokens to detach, > 0) and
    ``config.clip_cov_lb`` / ``clip_cov_ub`` (the open covariance interval of candidates).

    Returns:
        ``(pg_loss, metrics)``: ``pg_clipfrac`` = fraction of valid tokens detached, ``ppo_kl`` = masked mean of
        logπ_old − logπ, ``pg_clipfrac_lower`` = 0.
    Raises:
        ValueError: when ``clip_cov_ratio <= 0``.
    """
    if config.clip_cov_ratio <= 0:
        raise ValueError("actor_rollout_ref.actor.policy_loss.clip_cov_ratio must be > 0, "
                         f"got {config.clip_cov_ratio}")
    log_prob, advantages, mask = inputs.log_prob, inputs.advantages, inputs.response_mask
    log_ratio = log_prob - inputs.old_log_prob
    ratio = torch.exp(log_ratio)
    loss_unclipped, loss_clipped = clipped_surrogate(advantages, ratio, config.clip_ratio_low, config.clip_ratio_high)
    clipped_by_ratio = (loss_clipped > loss_unclipped) & (mask != 0)
    detached = clip_cov_selection(log_prob, advantages, mask, clipped_by_ratio, config.clip_cov_ratio,
                                  config.clip_cov_lb, config.clip_cov_ub)
    keep = (~detached).to(log_prob.dtype)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * keep
    pg_loss = inputs.aggregate(pg_losses, config.loss_agg_mode)
    with torch.no_grad():
        metrics = pg_metrics(masked_mean(detached.float(), mask), masked_mean(-log_ratio, mask),
                             torch.zeros((), device=pg_loss.device))
    return pg_loss, metrics


@torch.no_grad()
def kl_cov_selection(log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
                     kl_cov_ratio: float) -> torch.Tensor:
    """The tokens KL-Cov penalises: ``(B, T)`` bool, the k = max(⌊N·``kl_cov_ratio``⌋, 1) valid tokens (N of them)
    with the largest Cov_t = (A_t − mean A)·(logπ_t − mean logπ), means over the valid tokens (``torch.topk`` on
    CPU, as verl). No valid token → none selected."""
    valid = response_mask != 0
    flat_valid = torch.nonzero(valid.reshape(-1)).squeeze(-1)
    selected = torch.zeros_like(valid)
    n = int(flat_valid.numel())
    if n == 0:
        return selected
    adv = advantages.detach().reshape(-1)[flat_valid].cpu()
    lp = log_prob.detach().reshape(-1)[flat_valid].cpu()
    cov = (adv - adv.mean()) * (lp - lp.mean())
    top = torch.topk(cov, max(1, int(n * kl_cov_ratio)), largest=True).indices
    selected.view(-1)[flat_valid[top.to(flat_valid.device)]] = True
    return selected


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """KL-Cov (arXiv:2505.22617, eq. 14); verl ``compute_policy_loss_kl_cov``.

    r = exp(logπ − logπ_old) (no clipping at all); L_t = −A·r, plus ``config.ppo_kl_coef``·|logπ − logπ_old| on
    the tokens :func:`kl_cov_selection` picks (a fraction ``config.kl_cov_ratio`` > 0 of the valid tokens);
    × ``rollout_is_weights`` when given; aggregated by ``config.loss_agg_mode``.

    Returns:
        ``(pg_loss, metrics)``: ``ppo_kl`` = masked mean of |logπ − logπ_old| (the absolute value, as verl logs
        for this loss), ``pg_clipfrac`` = ``pg_clipfrac_lower`` = 0.
    Raises:
        ValueError: when ``kl_cov_ratio <= 0``.
    """
    if config.kl_cov_ratio <= 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.kl_cov_ratio must be > 0, got {config.kl_cov_ratio}")
    log_prob, advantages, mask = inputs.log_prob, inputs.advantages, inputs.response_mask
    log_ratio = log_prob - inputs.old_log_prob
    abs_kl = log_ratio.abs()
    loss_pg = -advantages * torch.exp(log_ratio)
    selected = kl_cov_selection(log_prob, advantages, mask, config.kl_cov_ratio)
    pg_losses = torch.where(selected, loss_pg + config.ppo_kl_coef * abs_kl, loss_pg)
    pg_loss = inputs.aggregate(pg_losses, config.loss_agg_mode)
    zero = torch.zeros((), device=pg_loss.device)
    with torch.no_grad():
        metrics = pg_metrics(zero, masked_mean(abs_kl, mask), zero)
    return pg_loss, metrics
