"""Rollout importance sampling: correct for the rollout engine's log-probs differing from the trainer's.

Truncated IS per Espeholt et al. 2018 (IMPALA, arXiv:1802.01561, eq. 1, ρ̄ truncation) and the
"off-policy mismatch" correction of Yao et al. 2025 ("Your efficient RL framework secretly brings you
off-policy RL training"); verl ``trainer/ppo/mismatch_helper.compute_rollout_importance_weights``.
"""
from __future__ import annotations

import math

import torch

from rlhf_core.algos.utils import masked_mean, masked_sum

_SAFETY_BOUND = 20.0
IS_LEVELS = ("token", "sequence", "geometric")
IS_MODES = ("truncate", "mask")


@torch.no_grad()
def compute_rollout_importance_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    mode: str,
    threshold: float | None,
    threshold_lower: float | None,
    veto_threshold: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token IS weights π_old(trainer)/π_rollout, bounded, with a catastrophic-token veto (SEMANTICS).

    ℓ_t = clamp(logπ_old − logπ_rollout, ±20). ``level``: ``token`` w_t = e^{ℓ_t}; ``sequence`` w = e^{clamp(Σ_t ℓ_t, ±20)};
    ``geometric`` w = e^{mean_t ℓ_t} (sums/means over valid tokens; the sequence weight is broadcast to its tokens).
    Bounds: U = ``threshold`` (``None`` disables truncation/masking), L = ``threshold_lower`` or 1/U.
    ``mode``: ``truncate`` w ← min(w, U); ``mask`` w ← w·1[L ≤ w ≤ U]. Veto (``veto_threshold`` not None): a
    sequence with any valid token whose ratio e^{ℓ_t} < veto_threshold gets weight 0 everywhere.
    Masked positions have weight 0.

    Args:
        old_log_prob, rollout_log_prob: ``(B, T)`` float. response_mask: ``(B, T)`` 0/1.
    Returns:
        ``(weights (B, T) float32 detached, metrics)``; metrics are python floats:
        ``mismatch/rollout_is_mean|max|min`` of the raw weights (before bounds and veto; over valid tokens for
        level ``token``, over sequences with a valid token otherwise), ``mismatch/rollout_is_ratio_fraction_high|low``
        (fraction of those raw weights above U / below L), ``mismatch/rollout_is_masked_fraction`` (fraction of
        valid tokens zeroed by ``mask`` mode; 0 for truncate), ``mismatch/rollout_is_veto_fraction`` (fraction of
        sequences vetoed), ``mismatch/rollout_is_eff_sample_size`` ((Σw)²/(N·Σw²) of the final weights, in (0, 1]).
    Raises:
        ValueError: for an unknown level or mode, or a non-positive threshold.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"unknown rollout_is_level {level!r}; expected one of {list(IS_LEVELS)}")
    if mode not in IS_MODES:
        raise ValueError(f"unknown rollout_is_mode {mode!r}; expected one of {list(IS_MODES)}")
    if threshold is not None and threshold <= 0:
        raise ValueError(f"rollout_is_threshold must be > 0, got {threshold}")
    mask = (response_mask != 0).to(torch.float32)
    valid = mask != 0
    has_token = valid.any(dim=-1)
    log_ratio = torch.clamp(old_log_prob.float() - rollout_log_prob.float(), -_SAFETY_BOUND, _SAFETY_BOUND)
    log_ratio = torch.where(valid, log_ratio, torch.zeros((), device=log_ratio.device))

    if level == "token":
        raw = torch.exp(log_ratio)
        stats_values = raw[valid]
    else:
        agg = masked_sum(log_ratio, mask, axis=-1) if level == "sequence" else masked_mean(log_ratio, mask, axis=-1)
        seq_w = torch.exp(torch.clamp(agg, -_SAFETY_BOUND, _SAFETY_BOUND))
        raw = seq_w.unsqueeze(-1).expand_as(log_ratio)
        stats_values = seq_w[has_token]

    weights = raw.clone()
    upper = threshold
    lower = (threshold_lower if threshold_lower is not None else (1.0 / threshold if threshold else None))
    masked_fraction = torch.zeros((), device=weights.device)
    if upper is not None:
        if mode == "truncate":
            weights = torch.clamp(weights, max=upper)
        else:
            keep = ((weights >= lower) & (weights <= upper)).float()
            masked_fraction = masked_mean(1.0 - keep, mask)
            weights = weights * keep

    vetoed = torch.zeros_like(has_token)
    if veto_threshold is not None:
        catastrophic = (log_ratio < math.log(veto_threshold)) & valid
        vetoed = catastrophic.any(dim=-1)
        weights = weights * (~vetoed).float().unsqueeze(-1)
    weights = (weights * mask).detach()

    metrics = _metrics(stats_values, upper, lower, weights[valid])
    metrics["mismatch/rollout_is_masked_fraction"] = float(masked_fraction)
    n_seq = max(int(has_token.sum()), 1)
    metrics["mismatch/rollout_is_veto_fraction"] = float((vetoed & has_token).sum()) / n_seq
    return weights, metrics


def _metrics(raw: torch.Tensor, upper: float | None, lower: float | None, final: torch.Tensor) -> dict[str, float]:
    if raw.numel() == 0:
        return {f"mismatch/rollout_is_{k}": 0.0 for k in
                ("mean", "max", "min", "ratio_fraction_high", "ratio_fraction_low", "eff_sample_size")}
    out = {
        "mismatch/rollout_is_mean": float(raw.mean()),
        "mismatch/rollout_is_max": float(raw.max()),
        "mismatch/rollout_is_min": float(raw.min()),
        "mismatch/rollout_is_ratio_fraction_high": float((raw > upper).float().mean()) if upper is not None else 0.0,
        "mismatch/rollout_is_ratio_fraction_low": float((raw < lower).float().mean()) if lower is not None else 0.0,
    }
    denom = final.numel() * float((final * final).sum())
    out["mismatch/rollout_is_eff_sample_size"] = float(final.sum()) ** 2 / denom if denom > 0 else 0.0
    return out
