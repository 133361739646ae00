"""Policy losses ``gspo``, ``gpg`` and ``geo_mean`` (``actor_rollout_ref.actor.policy_loss.loss_mode``).

Same contract as every registered loss (``rlhf_core.algos.policy_loss``): ``loss_fn(inputs: PolicyLossInputs,
config: PolicyLossConfig) -> (pg_loss 0-d tensor, metrics)`` with metrics ``pg_clipfrac``, ``ppo_kl``,
``pg_clipfrac_lower`` as 0-d detached float32 tensors. Gradient flows through ``inputs.log_prob`` only.
``inputs.global_tokens`` / ``global_seqs`` make the scalar one micro-batch's contribution to the mini-batch loss
(see ``rlhf_core.algos.loss_agg``).
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
from rlhf_core.algos.utils import masked_mean, masked_sum


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=torch.float32, device=like.device)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """GSPO-token (Zheng et al. 2025, arXiv:2507.18071, eqs. 5–7 and §4.3); verl ``compute_policy_loss_gspo``.

    Sequence ratio s_i = exp((1/|y_i|)·Σ_t (logπ − logπ_old)) (|y_i| = valid tokens, at least 1); token ratio
    s_{i,t} = sg[s_i]·π_t/sg[π_t], i.e. log s_{i,t} = logπ_t − sg[logπ_t] + sg[log s_i], clamped above at 10. Its
    value is s_i on every token of the sequence and ∂s_{i,t}/∂logπ_t = s_{i,t}. L_{i,t} = max(−A·s_{i,t},
    −A·clip(s_{i,t}, 1−ε_low, 1+ε_high)) (no dual clip), × ``rollout_is_weights`` when given, aggregated
    ``seq-mean-token-mean`` whatever ``config.loss_agg_mode`` says (as verl: the paper's objective is a mean over
    sequences of per-token means). Reads ``config.clip_ratio_low`` / ``clip_ratio_high`` (ε_low, ε_high).

    Returns:
        ``(pg_loss, metrics)``: ``pg_clipfrac`` = masked mean of 1[clipped term larger], ``ppo_kl`` = masked mean
        of logπ_old − logπ, ``pg_clipfrac_lower`` = 0 (no dual clip).
    """
    log_prob, mask = inputs.log_prob, inputs.response_mask
    log_ratio = log_prob - inputs.old_log_prob
    lengths = mask.to(log_prob.dtype).sum(dim=-1).clamp_min(1.0)
    seq_log_ratio = masked_sum(log_ratio, mask, axis=-1) / lengths
    log_token_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    token_ratio = torch.exp(torch.clamp(log_token_ratio, max=10.0))
    loss_unclipped, loss_clipped = clipped_surrogate(inputs.advantages, token_ratio, config.clip_ratio_low,
                                                     config.clip_ratio_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    pg_loss = inputs.aggregate(pg_losses, "seq-mean-token-mean")
    with torch.no_grad():
        metrics = pg_metrics(masked_mean((loss_clipped > loss_unclipped).float(), mask),
                             masked_mean(-log_ratio, mask), _zero(pg_loss))
    return pg_loss, metrics


@register_policy_loss("gpg")
def compute_policy_loss_gpg(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """GPG, the plain policy gradient (Chu et al. 2025, arXiv:2504.02546, eq. 6); verl ``compute_policy_loss_gpg``.

    L_{i,t} = −A_{i,t}·logπ_t (no ratio, no clipping), × ``rollout_is_weights`` when given, aggregated by
    ``config.loss_agg_mode``. ∂L/∂logπ_t = −A_{i,t}.

    Returns:
        ``(pg_loss, metrics)``: ``pg_clipfrac`` = ``pg_clipfrac_lower`` = 0; ``ppo_kl`` = masked mean of
        logπ_old − logπ (verl reports 0 here; the real value is logged so a drifting policy is visible).
    """
    pg_losses = -inputs.advantages * inputs.log_prob
    pg_loss = inputs.aggregate(pg_losses, config.loss_agg_mode)
    with torch.no_grad():
        ppo_kl = masked_mean(inputs.old_log_prob - inputs.log_prob, inputs.response_mask)
        metrics = pg_metrics(_zero(pg_loss), ppo_kl, _zero(pg_loss))
    return pg_loss, metrics


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """GMPO, geometric-mean policy optimisation (Zhao et al. 2025, arXiv:2507.20673, eq. 4 with token-level
    clipping in log space, §3); verl ``compute_policy_loss_geo_mean``.

    δ_t = logπ_t − logπ_old,t; δ̃_t = clip(δ_t, −ε_low, ε_high); with σ = sign(A_t) the kept log-ratio is
    σ·min(σ·δ_t, σ·δ̃_t) (pessimistic, as PPO's clip). Per sequence (|y| = valid tokens):
    r_i = exp(Σ_t kept_t / (|y| + 1e-8)), Â_i = Σ_t A_t / (|y| + 1e-8), L_i = −Â_i·r_i (the sequence-level
    advantage is the token mean, as verl: the method assumes one advantage per sequence). With
    ``rollout_is_weights`` w, L_i is multiplied by the geometric mean exp(Σ_t log(w_t + 1e-10)/(|y| + 1e-8)).
    The scalar is the mean of L_i over sequences with at least one valid token (÷ ``inputs.global_seqs`` when
    given); ``config.loss_agg_mode`` and ``inputs.global_tokens`` are ignored, as in verl. verl's ``torch.mean``
    also counts fully masked rows (L = 0), which makes its loss depend on padding rows; they are left out here, as
    ``agg_loss``'s seq-mean modes do.

    Returns:
        ``(pg_loss, metrics)``: ``pg_clipfrac`` / ``pg_clipfrac_lower`` = masked mean of 1[δ clipped and A > 0] /
        1[δ clipped and A < 0]; ``ppo_kl`` = masked mean of −δ.
    """
    advantages, mask = inputs.advantages, inputs.response_mask
    log_ratio = inputs.log_prob - inputs.old_log_prob
    sign = torch.sign(advantages)
    clipped_log_ratio = torch.clamp(log_ratio, -config.clip_ratio_low, config.clip_ratio_high)
    kept = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    lengths = mask.to(inputs.log_prob.dtype).sum(dim=-1)
    seq_ratio = torch.exp(masked_sum(kept, mask, axis=-1) / (lengths + 1e-8))
    seq_adv = masked_sum(advantages, mask, axis=-1) / (lengths + 1e-8)
    seq_losses = -seq_adv * seq_ratio
    if inputs.rollout_is_weights is not None:
        log_w = torch.log(inputs.rollout_is_weights.detach() + 1e-10)
        seq_losses = seq_losses * torch.exp(masked_sum(log_w, mask, axis=-1) / (lengths + 1e-8))
    rows = (mask != 0).any(dim=-1)
    global_seqs = inputs.global_seqs
    denom = max(float(global_seqs), 1e-8) if global_seqs is not None else rows.sum().clamp_min(1).to(seq_losses.dtype)
    pg_loss = torch.where(rows, seq_losses, torch.zeros_like(seq_losses)).sum() / denom
    with torch.no_grad():
        clipped = log_ratio != clipped_log_ratio
        metrics = pg_metrics(masked_mean((clipped & (advantages > 0)).float(), mask),
                             masked_mean(-log_ratio, mask),
                             masked_mean((clipped & (advantages < 0)).float(), mask))
    return pg_loss, metrics
