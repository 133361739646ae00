"""KL coefficient controllers and the in-reward KL penalty (``algorithm.kl_ctrl``, ``use_kl_in_reward``).

Adaptive controller: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences",
arXiv:1909.08593, §2.2 (verl ``AdaptiveKLController``).
"""
from __future__ import annotations

import torch

from rlhf_core.algos.kl import kl_penalty
from rlhf_core.algos.utils import masked_mean


class FixedKLController:
    """β stays ``kl_coef`` for the whole run; ``update`` does nothing."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept for the common interface)."""


class AdaptiveKLController:
    """β ← β·(1 + e·n/horizon), e = clip(KL/target_kl − 1, −0.2, 0.2) (Ziegler et al. 2019, eq. 2).

    Args:
        init_kl_coef: initial β. target_kl: KL target (> 0). horizon: in samples (> 0).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if horizon is None or horizon <= 0:
            raise ValueError(f"adaptive KL controller needs kl_ctrl.horizon > 0, got {horizon}")
        if target_kl is None or target_kl <= 0:
            raise ValueError(f"adaptive KL controller needs kl_ctrl.target_kl > 0, got {target_kl}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β toward keeping ``current_kl`` (a float) at the target; ``n_steps`` = samples in the batch."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def get_kl_controller(kl_type: str, kl_coef: float, horizon: float, target_kl: float):
    """Build the controller named by ``algorithm.kl_ctrl.type`` (``fixed`` or ``adaptive``).

    Raises:
        ValueError: for another type, or an adaptive controller with horizon/target_kl ≤ 0.
    """
    if kl_type == "fixed":
        return FixedKLController(kl_coef)
    if kl_type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {kl_type!r}; expected 'fixed' or 'adaptive'")


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kl_penalty_kind: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """token_level_rewards = scores − β·kl(old, ref)·mask, then update the controller (verl ``apply_kl_penalty``).

    KL for the controller and the metric = mean over sequences (those with a valid token) of the per-sequence
    masked-mean KL; the controller is updated with that KL and n = batch size B. β reported is the value
    *used* for this batch (before the update).

    Args:
        token_level_scores, old_log_prob, ref_log_prob: ``(B, T)`` float. response_mask: ``(B, T)`` 0/1.
        kl_penalty_kind: a :func:`kl_penalty` kind (not ``full``).
    Returns:
        ``(token_level_rewards (B, T) float32, {"actor/reward_kl_penalty": float, "actor/reward_kl_penalty_coeff": float})``.
    """
    mask = (response_mask != 0).to(torch.float32)
    kld = kl_penalty(old_log_prob.float(), ref_log_prob.float(), kl_penalty_kind)
    kld = torch.where(mask != 0, kld, torch.zeros((), device=kld.device))
    beta = kl_ctrl.value
    rewards = token_level_scores.float() - beta * kld
    per_seq = masked_mean(kld, mask, axis=-1)
    has_token = mask.sum(-1) > 0
    current_kl = float(per_seq[has_token].mean().item()) if bool(has_token.any()) else 0.0
    kl_ctrl.update(current_kl=current_kl, n_steps=int(token_level_scores.shape[0]))
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(beta)}
