"""On-policy distillation losses (verl 0.9.1 ``verl/trainer/distillation/losses.py`` and ``fsdp/losses.py``).

The student samples responses; a teacher scores them; the student is trained towards the teacher on its own
samples (Agarwal et al., "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes",
GKD, arXiv:2306.13649; Thinking Machines, "On-Policy Distillation", 2025). Two families of ``loss_mode``:

* single-sample estimators of the reverse KL(π_student ‖ π_teacher) from the sampled token's log-probs,
  ``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3`` (Schulman, "Approximating KL divergence", 2020;
  :func:`rlhf_core.algos.kl.kl_penalty` with the student as ``log_prob`` and the teacher as ``ref_log_prob``, as
  verl calls its ``kl_penalty``);
* ``forward_kl_topk``: the forward KL(π_teacher ‖ π_student) restricted to the teacher's top-k tokens at each
  position, Σ_{v∈topk} p_T(v)·(log p_T(v) − log p_S(v)), clamped at 0 (over k tokens the masses do not sum to 1,
  so the sum can be negative).

:func:`distillation_loss` turns the per-token losses into the scalar the student minimises (``loss_max_clamp``;
supervised: ``agg_loss``; ``use_policy_gradient``: the vanilla PPO loss with advantages −loss, detached), and
:func:`combine_with_policy_loss` adds it to the PPO loss as verl's ``distillation_ppo_loss`` does. No I/O.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from rlhf_core.algos.kl import kl_penalty
from rlhf_core.algos.loss_agg import agg_loss
from rlhf_core.algos.policy_loss import PolicyLossConfig, PolicyLossInputs, get_policy_loss_fn

ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
TOPK_MODES = ("forward_kl_topk",)
LOSS_MODES = TOPK_MODES + ESTIMATOR_MODES  # verl 0.9.1's DISTILLATION_LOSS_REGISTRY, in its registration order
# metrics reduced by min / max over micro-batches, ranks and mini-batches (verl AggregationType.MIN / MAX); every
# other distillation metric is a contribution summed to the mini-batch's value (rlhf_core.workers.update_loop)
EXTREMA = {"distillation/loss_min": min, "distillation/loss_max": max,
           "distillation/student_mass_min": min, "distillation/student_mass_max": max,
           "distillation/teacher_mass_min": min, "distillation/teacher_mass_max": max}


def uses_topk(loss_mode: str) -> bool:
    """Whether ``loss_mode`` needs the teacher's top-k log-probs and ids (verl ``DistillationLossSettings.use_topk``);
    else the teacher's log-prob of the sampled token.

    Raises:
        ValueError: for a mode verl 0.9.1 does not register, naming the registered ones.
    """
    if loss_mode not in LOSS_MODES:
        raise ValueError(f"distillation.distillation_loss.loss_mode={loss_mode!r} is not a distillation loss; "
                         f"registered: {list(LOSS_MODES)}")
    return loss_mode in TOPK_MODES


def estimator_losses(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, loss_mode: str) -> torch.Tensor:
    """Per-token reverse-KL estimate from the sampled tokens' log-probs (verl
    ``compute_distillation_loss_reverse_kl_estimator``): with d = log π_S − log π_T, ``k1``: d, ``abs``: |d|,
    ``k2``: ½d², ``k3``: e^{−d} + d − 1 (x = −d clamped to ±20 first, the result to ±10).

    Args:
        student_log_probs: ``(B, T)`` float, with grad.
        teacher_log_probs: ``(B, T)`` float (no grad).
    Returns:
        ``(B, T)``, not masked.
    """
    if loss_mode not in ESTIMATOR_MODES:
        raise ValueError(f"estimator_losses: {loss_mode!r} is not one of {list(ESTIMATOR_MODES)}")
    return kl_penalty(student_log_probs, teacher_log_probs, loss_mode)


def forward_kl_topk(student_logits: torch.Tensor, teacher_topk_log_probs: torch.Tensor,
                    teacher_topk_ids: torch.Tensor, log_prob_min_clamp: float | None = None) -> dict[str, torch.Tensor]:
    """Forward KL over the teacher's top-k tokens (verl ``fsdp/losses.py`` ``compute_forward_kl_topk``; the
    overlap diagnostics follow arXiv:2604.13016 as verl's do).

    log p_S = log_softmax(student_logits) gathered at the teacher's ids; with ``log_prob_min_clamp`` both log-prob
    sets are floored at it (after the masses are taken); loss = Σ_k p_T·(log p_T − log p_S), in float32.

    Args:
        student_logits: ``(B, T, V)`` float, temperature-scaled as for the student's log-probs, with grad.
        teacher_topk_log_probs: ``(B, T, K)`` float, the teacher's log-probs of its K most likely tokens.
        teacher_topk_ids: ``(B, T, K)`` int64, their token ids (< V).
        log_prob_min_clamp: floor of both log-prob sets, or None.
    Returns:
        ``distillation_losses`` (not yet clamped at 0), ``student_mass`` (Σ_k p_S at the teacher's ids),
        ``teacher_mass`` (Σ_k p_T), ``overlap_count`` (how many of the teacher's K ids are among the student's K
        most likely), ``overlap_token_advantage`` (mean of −p_T·(log p_T − log p_S) over the overlapping ids, 0
        without any): each ``(B, T)``.
    """
    log_p_s_all = torch.log_softmax(student_logits.float(), dim=-1)
    k = teacher_topk_ids.shape[-1]
    student_topk_ids = torch.topk(log_p_s_all, k=k, dim=-1).indices
    log_p_s = torch.gather(log_p_s_all, -1, teacher_topk_ids.long())
    log_p_t = teacher_topk_log_probs.float()
    student_mass, teacher_mass = log_p_s.exp().sum(-1), log_p_t.exp().sum(-1)
    if log_prob_min_clamp is not None:
        log_p_s = log_p_s.clamp_min(log_prob_min_clamp)
        log_p_t = log_p_t.clamp_min(log_prob_min_clamp)
    token_kl = log_p_t.exp() * (log_p_t - log_p_s)
    overlap = (teacher_topk_ids.unsqueeze(-1) == student_topk_ids.unsqueeze(-2)).any(-1)
    count = overlap.sum(-1)
    adv = (-token_kl * overlap).sum(-1) / count.clamp_min(1)
    return {"distillation_losses": token_kl.sum(-1), "student_mass": student_mass, "teacher_mass": teacher_mass,
            "overlap_count": count, "overlap_token_advantage": torch.where(count > 0, adv, torch.zeros_like(adv))}


@dataclass
class DistillationInputs:
    """One (micro-)batch's tensors for :func:`distillation_loss` (shapes ``(B, T)`` unless said).

    Attributes:
        log_prob: log π_S of the sampled tokens (with grad).
        old_log_prob: log π_S at rollout (the PPO ratio's denominator; ``log_prob.detach()`` on-policy).
        response_mask: the valid response tokens.
        teacher_log_probs: log π_T of the sampled tokens (estimator modes), or None.
        logits: ``(B, T, V)`` the student's temperature-scaled logits (``forward_kl_topk``), or None.
        teacher_topk_log_probs, teacher_topk_ids: ``(B, T, K)`` (``forward_kl_topk``), or None.
        rollout_is_weights: the policy loss's rollout importance weights, or None.
        global_tokens, global_seqs, loss_scale_factor: the mini-batch's counts (see ``PolicyLossInputs``).
    """

    log_prob: torch.Tensor
    old_log_prob: torch.Tensor
    response_mask: torch.Tensor
    teacher_log_probs: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    teacher_topk_log_probs: torch.Tensor | None = None
    teacher_topk_ids: torch.Tensor | None = None
    rollout_is_weights: torch.Tensor | None = None
    global_tokens: float | None = None
    global_seqs: float | None = None
    loss_scale_factor: float | None = None


def per_token_losses(inputs: DistillationInputs, loss_cfg: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """The per-token distillation losses ``(B, T)`` of ``loss_cfg.loss_mode`` and their metrics (shares of the
    mini-batch mean: multiplied by this micro-batch's share of the mini-batch's tokens; the ``EXTREMA`` ones raw).

    ``forward_kl_topk``: :func:`forward_kl_topk` clamped at 0, metrics ``distillation/student_mass``,
    ``teacher_mass`` (+ ``_min``/``_max``), ``overlap_ratio`` (mean overlap_count ÷ k), ``overlap_token_advantage``.
    Estimators: :func:`estimator_losses`, metric ``distillation/abs_loss`` (mean |loss|: k1 can be negative).
    """
    mask = inputs.response_mask.bool()
    share = float(mask.sum()) / max(inputs.global_tokens or float(mask.sum()), 1e-8)
    if uses_topk(loss_cfg.loss_mode):
        out = forward_kl_topk(inputs.logits, inputs.teacher_topk_log_probs, inputs.teacher_topk_ids,
                              loss_cfg.log_prob_min_clamp)
        s, t = out["student_mass"][mask].detach(), out["teacher_mass"][mask].detach()
        k = inputs.teacher_topk_ids.shape[-1]
        overlap_at = mask & (out["overlap_count"] > 0)
        adv = out["overlap_token_advantage"][overlap_at].detach()
        metrics = {"distillation/student_mass": _mean(s) * share, "distillation/teacher_mass": _mean(t) * share,
                   "distillation/overlap_ratio": _mean(out["overlap_count"][mask].float()) / k * share,
                   "distillation/overlap_token_advantage": _mean(adv) * share}
        metrics.update({"distillation/student_mass_min": _ext(s, min), "distillation/student_mass_max": _ext(s, max),
                        "distillation/teacher_mass_min": _ext(t, min), "distillation/teacher_mass_max": _ext(t, max)})
        return out["distillation_losses"].clamp_min(0.0), metrics
    losses = estimator_losses(inputs.log_prob, inputs.teacher_log_probs, loss_cfg.loss_mode)
    return losses, {"distillation/abs_loss": _mean(losses[mask].detach().abs()) * share}


def _mean(x: torch.Tensor) -> float:
    return float(x.mean()) if x.numel() else 0.0


def _ext(x: torch.Tensor, red) -> float:
    """min or max of ``x``; of no element, the identity of that reduction (+inf for min, −inf for max), so every
    rank reports the key and the reduction over ranks ignores an empty micro-batch."""
    if not x.numel():
        return math.inf if red is min else -math.inf
    return float(x.min() if red is min else x.max())


def distillation_loss(inputs: DistillationInputs, loss_cfg: Any, actor_cfg: Any) -> tuple[torch.Tensor, dict]:
    """The distillation term and its metrics (verl ``distillation_loss``).

    1. per-token losses (:func:`per_token_losses`); ``distillation/loss_min``/``loss_max`` over the valid tokens,
       before the clamp;
    2. ``loss_max_clamp`` c: losses clamped to [−c, c] (the lower bound for k1, which can be negative);
    3. ``use_policy_gradient``: the ``policy_loss_mode`` (vanilla) PPO loss with advantages = −losses (detached),
       ε_low/ε_high = ``clip_ratio_low``/``clip_ratio_high`` of ``distillation_loss`` and the dual-clip c = 3
       (verl's default when the config has no ``clip_ratio_c``), ``actor.loss_agg_mode``; its metrics renamed
       ``distillation/<name>``. Else the losses aggregated by ``actor.loss_agg_mode`` (a supervised loss).

    Args:
        inputs: :class:`DistillationInputs`.
        loss_cfg: ``distillation.distillation_loss``.
        actor_cfg: ``actor_rollout_ref.actor`` (``loss_agg_mode`` and the other policy-loss settings).
    Returns:
        (0-d loss with grad, metrics).
    """
    losses, metrics = per_token_losses(inputs, loss_cfg)
    valid = losses[inputs.response_mask.bool()].detach()
    metrics.update({"distillation/loss_min": _ext(valid, min), "distillation/loss_max": _ext(valid, max)})
    if loss_cfg.loss_max_clamp is not None:
        c = float(loss_cfg.loss_max_clamp)
        losses = losses.clamp(min=-c, max=c)
    mode = str(actor_cfg.loss_agg_mode)
    if not loss_cfg.use_policy_gradient:
        return agg_loss(losses, inputs.response_mask, mode, global_tokens=inputs.global_tokens,
                        global_seqs=inputs.global_seqs, loss_scale_factor=inputs.loss_scale_factor), metrics
    pl_cfg = dataclasses.replace(PolicyLossConfig.from_actor_config(actor_cfg),
                                 clip_ratio_low=float(loss_cfg.clip_ratio_low),
                                 clip_ratio_high=float(loss_cfg.clip_ratio_high), clip_ratio_c=3.0)
    pg_inputs = PolicyLossInputs(inputs.old_log_prob, inputs.log_prob, -losses.detach(), inputs.response_mask,
                                 rollout_is_weights=inputs.rollout_is_weights, global_tokens=inputs.global_tokens,
                                 global_seqs=inputs.global_seqs, loss_scale_factor=inputs.loss_scale_factor)
    loss, pg_metrics = get_policy_loss_fn(str(loss_cfg.policy_loss_mode))(pg_inputs, pl_cfg)
    share = float(inputs.response_mask.sum()) / max(inputs.global_tokens or float(inputs.response_mask.sum()), 1e-8)
    metrics.update({f"distillation/{k}": float(v) * share for k, v in pg_metrics.items()})
    return loss, metrics


def needs_policy_loss(loss_cfg: Any) -> bool:
    """Whether the PPO loss is computed at all (verl: not when neither ``use_task_rewards`` nor
    ``use_policy_gradient``; its metrics are then absent)."""
    return bool(loss_cfg.use_task_rewards or loss_cfg.use_policy_gradient)


def combine_with_policy_loss(policy_loss: torch.Tensor | float, distill: torch.Tensor,
                             loss_cfg: Any) -> torch.Tensor:
    """verl ``distillation_ppo_loss``'s total: with ``use_task_rewards``, ``policy_loss +
    distillation_loss_coef · distill``; without, ``distill`` alone (coefficient 1; the PPO loss — its policy,
    entropy and KL-loss terms — is dropped even when computed for its metrics).

    Args:
        policy_loss: the PPO loss (policy − entropy_coeff·entropy + kl_loss_coef·kl), 0-d.
        distill: :func:`distillation_loss`'s loss, 0-d.
        loss_cfg: ``distillation.distillation_loss``.
    """
    if not loss_cfg.use_task_rewards:
        return distill
    return policy_loss + float(loss_cfg.distillation_loss_coef) * distill
