"""Policy losses ``sapo`` and ``dro`` (``actor_rollout_ref.actor.policy_loss.loss_mode``): no hard clip; the step
away from π_old is damped smoothly (SAPO: a sigmoid gate on the ratio; DRO: a quadratic penalty on the log-ratio).

Same contract as every registered loss (``rlhf_core.algos.policy_loss``): ``loss_fn(inputs: PolicyLossInputs,
config: PolicyLossConfig) -> (pg_loss 0-d tensor, metrics)``, metrics as 0-d detached float32 tensors (the actor
logs them as ``actor/<name>``). ``inputs.global_tokens`` / ``global_seqs`` make the scalar one micro-batch's
contribution to the mini-batch loss (``rlhf_core.algos.loss_agg``).
"""
from __future__ import annotations

import torch

from rlhf_core.algos.policy_loss import PolicyLossConfig, PolicyLossInputs, pg_metrics, register_policy_loss
from rlhf_core.algos.utils import masked_mean


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """SAPO's soft gate f(r) = σ(τ·(r − 1))·4/τ, elementwise (``ratio``, ``tau`` broadcastable float tensors).

    f(1) = 2/τ and f'(r) = 4·σ(1 − σ), so f'(1) = 1: at r = 1 the gradient is exactly the policy gradient's, and it
    decays smoothly as r leaves 1 (faster for larger τ) instead of being cut at a clip boundary.
    """
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """SAPO, soft adaptive policy optimisation (Gao et al. 2025, arXiv:2511.20347: the token-level objective with the
    soft gate f_{i,t}(r) = σ(τ_{i,t}(r − 1))·4/τ_{i,t}); verl ``compute_policy_loss_sapo``.

    r = exp(clamp(logπ − logπ_old, −20, 20)); τ_t = ``tau_pos`` where A_t > 0, else ``tau_neg`` (a larger τ for
    negative advantages damps those updates faster, the paper's asymmetry); L_t = −:func:`sapo_gate`(r_t, τ_t)·A_t,
    so ∂L_t/∂logπ_t = −4·σ_t(1 − σ_t)·r_t·A_t with σ_t = σ(τ_t(r_t − 1)). × ``rollout_is_weights`` when given,
    aggregated ``seq-mean-token-mean`` whatever ``config.loss_agg_mode`` says (as verl: the paper averages per
    sequence, then over sequences). Reads ``config.tau_pos`` / ``config.tau_neg`` (``actor.tau_pos`` = 1.0,
    ``actor.tau_neg`` = 1.05 by default).

    Returns:
        ``(pg_loss, metrics)``: ``pg_clipfrac`` = ``pg_clipfrac_lower`` = 0 (nothing is clipped), ``ppo_kl`` =
        masked mean of logπ_old − logπ (clamped).
    Raises:
        ValueError: when ``tau_pos`` or ``tau_neg`` is not > 0 (the gate divides by τ).
    """
    if not (config.tau_pos > 0 and config.tau_neg > 0):
        raise ValueError(f"sapo needs actor.tau_pos and actor.tau_neg > 0, got tau_pos={config.tau_pos}, "
                         f"tau_neg={config.tau_neg}")
    advantages, mask = inputs.advantages, inputs.response_mask
    log_ratio = torch.clamp(inputs.log_prob - inputs.old_log_prob, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(advantages, config.tau_pos),
                      torch.full_like(advantages, config.tau_neg))
    pg_losses = -sapo_gate(ratio, tau) * advantages
    pg_loss = inputs.aggregate(pg_losses, "seq-mean-token-mean")
    with torch.no_grad():
        zero = torch.zeros((), dtype=torch.float32, device=pg_loss.device)
        metrics = pg_metrics(zero, masked_mean(-log_ratio, mask), zero)
    return pg_loss, metrics


@register_policy_loss("dro")
def compute_policy_loss_dro(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """DRO, direct reward optimisation (Richemond et al. 2024, arXiv:2405.19107: the squared loss
    ½(A − β·log(π/π_anchor))², here with π_old as the anchor); verl ``compute_policy_loss_dro``.

    δ_t = logπ_t − logπ_old,t (not clamped); L_t = −(A_t·logπ_t − ½·β·δ_t²), so ∂L_t/∂logπ_t = −A_t + β·δ_t, which
    is (1/β)·∂/∂logπ_t of ½(A_t − β·δ_t)²: the policy gradient pulled back towards π_old in proportion to how far it
    moved. × ``rollout_is_weights`` when given, aggregated by ``config.loss_agg_mode``. Reads ``config.dro_beta`` β
    (``actor.policy_loss.dro_beta``; null by default, so it must be set with this mode).

    Returns:
        ``(pg_loss, metrics)``: ``ppo_kl`` = masked mean of −δ (verl returns only this metric; ``pg_clipfrac`` and
        ``pg_clipfrac_lower`` are 0 here so every loss logs the same names).
    Raises:
        ValueError: when ``dro_beta`` is ``None`` or not > 0.
    """
    beta = config.dro_beta
    if beta is None or not beta > 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.dro_beta must be > 0 with loss_mode=dro, got {beta}")
    log_prob = inputs.log_prob
    log_ratio = log_prob - inputs.old_log_prob
    pg_losses = -(log_prob * inputs.advantages - 0.5 * beta * log_ratio.square())
    pg_loss = inputs.aggregate(pg_losses, config.loss_agg_mode)
    with torch.no_grad():
        zero = torch.zeros((), dtype=torch.float32, device=pg_loss.device)
        metrics = pg_metrics(zero, masked_mean(-log_ratio, inputs.response_mask), zero)
    return pg_loss, metrics
