"""Policy losses ``cispo``, ``dppo_tv`` and ``dppo_kl`` (``actor_rollout_ref.actor.policy_loss.loss_mode``).

All three are REINFORCE on log π with a *detached* per-token weight: L_t = −w_t·A_t·logπ_t, so ∂L_t/∂logπ_t =
−w_t·A_t. They differ in w: CISPO clips the importance ratio into the weight; DPPO keeps the (truncated) ratio and
zeroes tokens that left a trust region measured by a divergence of the token's probability, not by the ratio.

Same contract as every registered loss (``rlhf_core.algos.policy_loss``): ``loss_fn(inputs: PolicyLossInputs,
config: PolicyLossConfig) -> (pg_loss 0-d tensor, metrics)`` with metrics ``pg_clipfrac``, ``ppo_kl``,
``pg_clipfrac_lower`` as 0-d detached float32 tensors (the actor logs them as ``actor/pg_clipfrac`` ...).
``inputs.global_tokens`` / ``global_seqs`` make the scalar one micro-batch's contribution to the mini-batch loss
(``rlhf_core.algos.loss_agg``). Numerics follow verl 0.9.1's ``core_algos``: the log-ratio is clamped to
[−20, 20] before ``exp``; the probabilities of the trust-region tests are exp of the unclamped log-probs.
"""
from __future__ import annotations

import torch

from rlhf_core.algos.policy_loss import PolicyLossConfig, PolicyLossInputs, pg_metrics, register_policy_loss
from rlhf_core.algos.utils import masked_mean

_LOG_RATIO_BOUND = 20.0
_BINARY_KL_EPS = 1e-8  # keeps log((1 − p_old)/(1 − p)) finite when a probability reaches 1 (verl's constant)


def _log_ratio(inputs: PolicyLossInputs) -> torch.Tensor:
    """logπ − logπ_old clamped to [−20, 20], ``(B, T)``."""
    return torch.clamp(inputs.log_prob - inputs.old_log_prob, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """CISPO, clipped IS-weight policy optimisation (MiniMax-M1, arXiv:2506.13585: the objective J_CISPO =
    E[Σ sg(r̂)·Â·logπ / Σ|o_i|] with the clipped weight r̂ = clip(r, 1 − ε_low^IS, 1 + ε_high^IS)); verl
    ``compute_policy_loss_cispo``.

    r = exp(clamp(logπ − logπ_old, −20, 20)); L_t = −sg[clip(r_t, 1 − ε_low, 1 + ε_high)]·A_t·logπ_t. Unlike PPO no
    token loses its gradient: ∂L_t/∂logπ_t = −clip(r_t, ·)·A_t. × ``rollout_is_weights`` when given, aggregated by
    ``config.loss_agg_mode``. Reads ``config.clip_ratio_low`` / ``clip_ratio_high`` (ε_low, ε_high; verl reuses
    ``actor.clip_ratio_low/high``).

    Args:
        inputs: ``(B, T)`` float32 tensors; gradient through ``inputs.log_prob`` only.
    Returns:
        ``(pg_loss, metrics)``: ``pg_clipfrac`` = masked mean of 1[r outside [1 − ε_low, 1 + ε_high]], ``ppo_kl`` =
        masked mean of logπ_old − logπ (clamped), ``pg_clipfrac_lower`` = 0 (no dual clip).
    """
    mask = inputs.response_mask
    log_ratio = _log_ratio(inputs)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high).detach()
    pg_losses = -weight * inputs.advantages * inputs.log_prob
    pg_loss = inputs.aggregate(pg_losses, config.loss_agg_mode)
    with torch.no_grad():
        metrics = pg_metrics(masked_mean((ratio != weight).float(), mask), masked_mean(-log_ratio, mask),
                             torch.zeros((), dtype=torch.float32, device=pg_loss.device))
    return pg_loss, metrics


def _dppo(inputs: PolicyLossInputs, config: PolicyLossConfig, valid: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The DPPO loss given the trust-region mask ``valid`` ``(B, T)`` bool: L_t = −A_t·sg[min(r_t, c)]·logπ_t·1[valid],
    c = ``config.clip_ratio_c``; metrics: ``pg_clipfrac`` = masked mean of 1[not valid], ``ppo_kl`` = masked mean of
    logπ_old − logπ (clamped), ``pg_clipfrac_lower`` = masked mean of 1[valid and r > c] (tokens truncated)."""
    mask, c = inputs.response_mask, config.clip_ratio_c
    log_ratio = _log_ratio(inputs)
    ratio = torch.exp(log_ratio)
    keep = valid.detach().to(inputs.log_prob.dtype)
    pg_losses = -inputs.advantages * torch.clamp(ratio, max=c).detach() * inputs.log_prob * keep
    pg_loss = inputs.aggregate(pg_losses, config.loss_agg_mode)
    with torch.no_grad():
        metrics = pg_metrics(masked_mean(1.0 - keep, mask), masked_mean(-log_ratio, mask),
                             masked_mean((ratio > c).to(keep.dtype) * keep, mask))
    return pg_loss, metrics


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning",
    arXiv:2602.04879: the binary total-variation trust region; ratio truncation as its §5.4); verl
    ``compute_policy_loss_dppo_tv``.

    With p = exp(logπ_t), p_old = exp(logπ_old,t) of the sampled token, the binary TV distance of the two
    Bernoulli(p) is |p − p_old|. A token is *valid* when the update moved it towards its advantage by at most δ:
    A > 0: p − p_old ≤ δ_high; A ≤ 0: p − p_old ≥ −δ_low (moves against the advantage are always valid).
    L_t = −A_t·sg[min(r_t, c)]·logπ_t·1[valid] (r = exp(clamp(logπ − logπ_old, −20, 20)); c truncates the IS
    weight instead of PPO's dual clip), so ∂L_t/∂logπ_t = −A_t·min(r_t, c) on valid tokens and 0 outside.
    × ``rollout_is_weights`` when given, aggregated by ``config.loss_agg_mode``.

    Reads ``config.clip_ratio_low`` / ``clip_ratio_high`` as δ_low / δ_high (verl reuses ``actor.clip_ratio_low/
    high`` as TV thresholds, default 0.2) and ``config.clip_ratio_c`` as c (``actor.clip_ratio_c``, default 3.0).

    Returns:
        ``(pg_loss, metrics)``: ``pg_clipfrac`` = fraction of tokens outside the trust region, ``ppo_kl`` = masked
        mean of logπ_old − logπ, ``pg_clipfrac_lower`` = fraction of valid tokens whose ratio was truncated at c.
    """
    moved = torch.exp(inputs.log_prob) - torch.exp(inputs.old_log_prob)
    valid = torch.where(inputs.advantages > 0, moved <= config.clip_ratio_high, moved >= -config.clip_ratio_low)
    return _dppo(inputs, config, valid)


def binary_kl(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(p_old) ‖ Bernoulli(p)) per token, ``(B, T)`` float, nats: p_old·(logπ_old − logπ) +
    (1 − p_old)·log((1 − p_old + 1e-8)/(1 − p + 1e-8)), p = exp(logπ) (DPPO's binary KL approximation)."""
    old_p, p = torch.exp(old_log_prob), torch.exp(log_prob)
    return old_p * (old_log_prob - log_prob) + (1.0 - old_p) * torch.log(
        (1.0 - old_p + _BINARY_KL_EPS) / (1.0 - p + _BINARY_KL_EPS))


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """DPPO-Binary-KL (Qi et al. 2026, arXiv:2602.04879: the binary KL trust region); verl
    ``compute_policy_loss_dppo_kl``.

    As ``dppo_tv`` with the divergence D = :func:`binary_kl` (π_old ‖ π) of the sampled token's probability. Valid:
    A > 0: D ≤ δ_high or p ≤ p_old; A ≤ 0: D ≤ δ_low or p ≥ p_old (only a move towards the advantage can leave
    the region). L_t = −A_t·sg[min(r_t, c)]·logπ_t·1[valid]. Reads the same keys as ``dppo_tv`` (δ_low, δ_high =
    ``actor.clip_ratio_low/high``; c = ``actor.clip_ratio_c``); same metrics.
    """
    p, old_p = torch.exp(inputs.log_prob), torch.exp(inputs.old_log_prob)  # compared as probabilities, as verl
    p_up, p_down = p >= old_p, p <= old_p
    kl = binary_kl(inputs.old_log_prob, inputs.log_prob)
    valid = torch.where(inputs.advantages > 0, (kl <= config.clip_ratio_high) | p_down,
                        (kl <= config.clip_ratio_low) | p_up)
    return _dppo(inputs, config, valid)
