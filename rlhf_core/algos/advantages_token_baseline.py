"""Optimal Token Baseline advantages ``optimal_token_baseline`` and ``tir_optimal_token_baseline``
(``algorithm.adv_estimator``; verl 0.9 ``compute_optimal_token_baseline_advantage`` and
``compute_multi_turn_optimal_token_baseline_advantage``), and the per-token Σ_v π(v)² they need from the actor.

Source: Yingru Li et al., "The Optimal Token Baseline" (2025,
https://yingru.notion.site/The-Optimal-Token-Baseline-399211a558b782cfa936014c0d42dfb8). For the policy gradient
g = Σ_t ∇log π(y_t)·(G_t − B_t), the baseline that minimises its variance at step t is
``B_t* = E[G_t·W_t] / E[W_t]``, with W_t the squared norm of the score accumulated up to t. At the logits, the score of
one token is e_{y_t} − π, whose squared norm is ``w_t = ‖e_{y_t} − π‖² = 1 − 2·π(y_t) + Σ_v π(v)²`` (≥ 0); the
estimator uses the proxy ``W_t = Σ_{j≤t} w_j`` and replaces the expectation by the prompt's group of samples.

Same contract as ``rlhf_core.algos.advantages`` (keyword arguments, unused ones ignored, float32 outputs exactly 0
at masked positions), with two more inputs read from the batch: ``old_log_probs (B, T)`` and ``sum_pi_squared (B, T)``
(the [old_log_prob] stage adds the latter when :func:`needs_sum_pi_squared`).
"""
from __future__ import annotations

from typing import Any

import torch

from rlhf_core.algos.advantages import _finish, register_adv_est
from rlhf_core.algos.groups import group_ids

#: estimators that read ``sum_pi_squared`` (and ``old_log_probs``) from the batch
SUM_PI_SQUARED_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")


def needs_sum_pi_squared(adv_estimator: str, calculate_sum_pi_squared: bool) -> bool:
    """Whether the actor's log-prob pass must return ``sum_pi_squared``: ``actor_rollout_ref.actor.
    calculate_sum_pi_squared`` is on, or ``algorithm.adv_estimator`` is one of :data:`SUM_PI_SQUARED_ESTIMATORS`
    (verl asserts the key is on for them; here the estimator turns it on)."""
    return bool(calculate_sum_pi_squared) or adv_estimator in SUM_PI_SQUARED_ESTIMATORS


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Σ_v softmax(logits)_v² per position, as exp(logsumexp(2z) − 2·logsumexp(z)) in float32 with z = logits −
    max(logits) (the same value; shifting keeps both log-sum-exps small, so large logits lose no precision).
    verl ``calculate_sum_pi_squared_from_logits``.

    Args:
        logits: ``(..., V)`` any float dtype (the temperature-scaled logits that give the log-probs).
    Returns:
        ``(...)`` float32 in [1/V, 1].
    """
    z = logits.float()
    z = z - z.amax(dim=-1, keepdim=True).detach()
    return torch.exp(torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1))


def _check(name: str, old_log_probs: Any, sum_pi_squared: Any, shape: torch.Size) -> None:
    for key, t in (("old_log_probs", old_log_probs), ("sum_pi_squared", sum_pi_squared)):
        if t is None:
            raise ValueError(f"adv_estimator {name!r} needs {key} (B, T) from the actor's log-prob pass "
                             f"(actor_rollout_ref.actor.calculate_sum_pi_squared)")
        if t.shape != shape:
            raise ValueError(f"adv_estimator {name!r}: {key} has shape {tuple(t.shape)}, rewards {tuple(shape)}")


def _group_baseline(returns: torch.Tensor, w_cum: torch.Tensor, valid: torch.Tensor, ids: torch.Tensor,
                    n_groups: int, epsilon: float, handle_zero_tail: bool) -> torch.Tensor:
    """B[i, k] = Σ_{j∈g(i)} G[j,k]·W[j,k]·m[j,k] / (Σ_{j∈g(i)} W[j,k]·m[j,k] + ε), float64 ``(B, K)``; 0 for a row
    alone in its group (counting only rows with a valid token). With ``handle_zero_tail``, the one longest row of
    a group (when strictly longer than all others) gets B = 0 from the second-longest row's length on, where it
    would otherwise be its own baseline (A ≈ 0)."""
    g, w, m = returns.double(), w_cum.double(), valid.double()
    dev = g.device
    num = torch.zeros(n_groups, g.shape[1], dtype=torch.float64, device=dev).index_add_(0, ids, g * w * m)
    den = torch.zeros(n_groups, g.shape[1], dtype=torch.float64, device=dev).index_add_(0, ids, w * m) + epsilon
    lengths = m.sum(-1)
    nonempty = (lengths > 0).double()
    size = torch.zeros(n_groups, dtype=torch.float64, device=dev).index_add_(0, ids, nonempty)
    baseline = (num / den)[ids] * (size[ids] > 1).double().unsqueeze(-1)
    if handle_zero_tail:
        neg = torch.full((n_groups,), -1.0, dtype=torch.float64, device=dev)
        longest = neg.clone().scatter_reduce(0, ids, lengths, "amax")
        is_max = lengths == longest[ids]
        n_max = torch.zeros(n_groups, dtype=torch.float64, device=dev).index_add_(0, ids, is_max.double())
        second = neg.clone().scatter_reduce(0, ids, torch.where(is_max, neg[ids], lengths), "amax")
        zero_tail = is_max & (n_max[ids] == 1) & (size[ids] > 1)
        cols = torch.arange(g.shape[1], device=dev).unsqueeze(0)
        baseline = torch.where(zero_tail.unsqueeze(-1) & (cols >= second[ids].unsqueeze(-1)),
                               torch.zeros_like(baseline), baseline)
    return baseline


def _inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights):
    """(valid (B,T) bool, G (B,T) reward-to-go over valid tokens, W (B,T) cumulative w over valid tokens), float64."""
    valid = response_mask != 0
    r = torch.where(valid, token_level_rewards.double(), torch.zeros((), dtype=torch.float64, device=valid.device))
    returns = r.flip(-1).cumsum(-1).flip(-1)
    w = 1.0 - 2.0 * old_log_probs.double().exp() + sum_pi_squared.double()
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.double() ** 2
    w_cum = torch.where(valid, w, torch.zeros_like(w)).cumsum(-1)
    return valid, returns, w_cum


@register_adv_est("optimal_token_baseline")
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
    old_log_probs: torch.Tensor | None = None, sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None, handle_zero_tail: bool = True, otb_epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline (module docstring): per response position t, over the rows of a prompt's group,

        G_t = Σ_{t'≥t} r_{t'}·m_{t'},   w_t = (1 − 2·exp(old_log_prob_t) + Σπ²_t)·ρ_t²,   W_t = Σ_{j≤t} w_j·m_j,
        B_t = Σ_g G_t·W_t·m_t / (Σ_g W_t·m_t + ε),   A_t = (G_t − B_t)·m_t,   returns = G.

    ρ_t = ``rollout_is_weights`` (1 when None: the baseline minimising the variance of the IS-weighted gradient).
    Positions are aligned by their index in the response (for right-padded single-turn responses); see
    ``tir_optimal_token_baseline`` for masks with holes. A group with one non-empty row has B = 0 (A = G).
    ``handle_zero_tail`` (verl's default True): see :func:`_group_baseline`.

    Args:
        token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights: ``(B, T)`` float.
        index: ``(B,)`` group keys (``uid``). otb_epsilon: ε above (verl's 1e-8; the trainer's ``epsilon`` is
            GRPO's and is not used here).
    Returns:
        ``(advantages, returns)`` ``(B, T)`` float32, 0 at masked positions.
    Raises:
        ValueError: when ``old_log_probs`` or ``sum_pi_squared`` is missing or has another shape.
    """
    _check("optimal_token_baseline", old_log_probs, sum_pi_squared, token_level_rewards.shape)
    valid, returns, w_cum = _inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared,
                                    rollout_is_weights)
    ids, n_groups = group_ids(index, valid.shape[0])
    baseline = _group_baseline(returns, w_cum, valid, ids.to(valid.device), n_groups, otb_epsilon, handle_zero_tail)
    return _finish(returns - baseline, returns, response_mask)


@register_adv_est("tir_optimal_token_baseline")
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
    old_log_probs: torch.Tensor | None = None, sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None, handle_zero_tail: bool = True, otb_epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline for tool-integrated (multi-turn) responses, whose ``response_mask`` has holes (tool
    output tokens are 0): the same B_t = Σ_g G·W / (Σ_g W + ε) as ``optimal_token_baseline``, but rows are aligned
    by the k-th *valid* token (the k-th generated token of each row), not by position; G and W are those of
    ``optimal_token_baseline`` (over valid tokens) and A is written back to the valid positions. Equal to
    ``optimal_token_baseline`` when every mask is a prefix. Rows without a valid token take no part.

    Args/Returns/Raises: as :func:`compute_optimal_token_baseline_advantage`.
    """
    _check("tir_optimal_token_baseline", old_log_probs, sum_pi_squared, token_level_rewards.shape)
    valid, returns, w_cum = _inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared,
                                    rollout_is_weights)
    # compact: the k-th valid token of row i goes to column k (a stable sort puts valid positions first, in order)
    order = torch.sort((~valid).to(torch.int8), dim=-1, stable=True).indices
    lengths = valid.sum(-1)
    k_valid = torch.arange(valid.shape[1], device=valid.device).unsqueeze(0) < lengths.unsqueeze(-1)
    g_c, w_c = returns.gather(-1, order), w_cum.gather(-1, order)
    ids, n_groups = group_ids(index, valid.shape[0])
    baseline_c = _group_baseline(g_c, w_c, k_valid, ids.to(valid.device), n_groups, otb_epsilon, handle_zero_tail)
    baseline = torch.zeros_like(baseline_c).scatter_(-1, order, baseline_c)
    return _finish(returns - baseline, returns, response_mask)
