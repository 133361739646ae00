"""Rollout correction (verl 0.9.1 ``algorithm.rollout_correction``): IS weights, rejection sampling, bypass loss.

ρ_t = π_old(y_t)/π_rollout(y_t) with ℓ_t = log ρ_t (π_old: the trainer's recomputed log-probs, or π_θ in bypass
mode). Truncated IS per Espeholt et al. 2018 (IMPALA, arXiv:1802.01561, eq. 1); IcePop token masking and the
k1/k2/k3 divergence rejection per Liu et al. 2025 ("When Speed Kills Stability", https://richardli.xyz/rl-collapse)
and Schulman's KL estimators (k1 = −ℓ, k2 = ℓ²/2, k3 = e^ℓ − 1 − ℓ). Numerics match verl 0.9.1
``trainer/ppo/rollout_corr_helper.py`` (``compute_rollout_correction_weights``, ``compute_rollout_rejection_mask``,
``compute_rollout_correction_and_rejection_mask``) and ``core_algos.compute_policy_loss_bypass_mode``; metrics are
in :mod:`rlhf_core.algos.rollout_corr_metrics`. The value grammar is rlhf_core/config/rollout_corr.py.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from rlhf_core.algos.loss_agg import agg_loss
from rlhf_core.algos.rollout_corr_metrics import is_metrics, offpolicy_metrics, rs_metrics
from rlhf_core.algos.utils import masked_mean, masked_sum
from rlhf_core.config.rollout_corr import parse_is_threshold, parse_rs

SAFETY_BOUND = 20.0


@dataclasses.dataclass(frozen=True)
class LegacyIS:
    """verl 0.6 ``algorithm.rollout_is*`` behaviour with no 0.9 key, kept for configs translated from 0.6:
    ``level`` ``geometric`` (w = e^{mean_t ℓ_t}) and the veto (a sequence with a valid token ρ_t <
    ``veto_threshold`` gets weight 0; None = off). With a LegacyIS, ℓ_t is clamped to ±20 per token before any sum,
    as 0.6 did."""

    level: str = "token"
    veto_threshold: float | None = None


def _log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, rollout_is: str, legacy: LegacyIS | None) -> torch.Tensor:
    """``(B, T)`` log IS weight before bounds: ℓ_t (token) or the row's Σ ℓ (sequence) / mean ℓ (legacy geometric)."""
    if legacy is not None:
        log_ratio = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
        if legacy.level == "geometric":
            return masked_mean(log_ratio, mask, axis=-1).unsqueeze(-1).expand_as(log_ratio)
    if rollout_is == "token":
        return log_ratio
    return masked_sum(log_ratio, mask, axis=-1).unsqueeze(-1).expand_as(log_ratio)


@torch.no_grad()
def compute_rollout_correction_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_is: str = "token",
    rollout_is_threshold: Any = 2.0, rollout_is_batch_normalize: bool = False, legacy: LegacyIS | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """IS weights from ℓ = log π_old − log π_rollout (verl 0.9.1 ``compute_rollout_correction_weights``).

    raw w = e^{clamp(ℓ_t, ±20)} (``token``) or e^{clamp(Σ_t ℓ_t, ±20)} broadcast over the row (``sequence``), × mask.
    Threshold U (number): w ← min(w, U) (TIS). Threshold ``"L_U"``: w ← w·1[L ≤ w ≤ U] (IcePop). Batch normalise:
    w ← w / m where m = mean of w over valid tokens (token) or mean over non-empty rows of the row's weight
    (sequence), when m > 1e-8. ``legacy`` (:class:`LegacyIS`) reproduces verl 0.6's weights (see there).

    Args:
        log_ratio, response_mask: ``(B, T)`` float / 0-1. rollout_is: ``token`` | ``sequence``.
    Returns:
        ``(weights (B, T) detached, metrics)``: metrics are python floats named as verl's, without the
        ``rollout_corr/`` prefix (``rollout_is_mean`` ...; ``rollout_is_oob_ratio`` with IcePop,
        ``rollout_is_batch_norm_factor`` with batch normalisation).
    Raises:
        ValueError: an unknown ``rollout_is`` or a bad threshold (:func:`parse_is_threshold`).
    """
    if rollout_is not in ("token", "sequence"):
        raise ValueError(f"algorithm.rollout_correction.rollout_is={rollout_is!r}: expected token or sequence")
    upper, lower = parse_is_threshold(rollout_is_threshold)
    mask = response_mask.to(log_ratio.dtype)
    log_w = _log_ratio(log_ratio, mask, rollout_is, legacy)
    raw = torch.exp(torch.clamp(log_w, -SAFETY_BOUND, SAFETY_BOUND)) * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    if legacy is not None and legacy.veto_threshold is not None:
        clamped = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
        vetoed = ((clamped < math.log(legacy.veto_threshold)) & (mask != 0)).any(dim=-1, keepdim=True)
        weights = weights * (~vetoed).to(weights.dtype)
    seq_log = log_w[:, :1] if rollout_is == "sequence" or (legacy and legacy.level == "geometric") else None
    metrics = is_metrics(weights, raw, seq_log, mask, upper, lower)
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = masked_mean(weights, mask)
        else:
            rows = (mask.sum(dim=-1) > 0).to(weights.dtype)
            mean = (masked_mean(weights, mask, axis=-1) * rows).sum() / rows.sum().clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
        metrics["rollout_is_batch_norm_factor"] = float(mean) if mean > 1e-8 else 1.0
    return weights.detach(), metrics


def _k_stats(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    lr = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -lr, "k2": 0.5 * lr * lr, "k3": torch.exp(lr) - 1.0 - lr}


@torch.no_grad()
def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str, rollout_rs_threshold: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The response mask with rejected tokens/sequences set to 0 (verl 0.9.1 ``compute_rollout_rejection_mask``).

    Per option (all must pass): the statistic s is k1 = −ℓ, k2 = ℓ²/2 or k3 = e^ℓ − 1 − ℓ (ℓ clamped to ±20) per
    token (``token_*``), or its masked sum / mean / max over the row (``seq_sum_*`` / ``seq_mean_*`` /
    ``seq_max_*``, applied to every token of the row). k1 keeps log L ≤ s ≤ log U; k2/k3 keep s ≤ U.

    Args:
        log_ratio, response_mask: ``(B, T)``. rollout_rs, rollout_rs_threshold: as the config keys.
    Returns:
        ``(mask (B, T) of response_mask's dtype, metrics)``: ``rollout_rs_masked_fraction`` (valid tokens
        rejected), ``rollout_rs_seq_masked_fraction`` (rows with a rejected token, over all rows), and per option
        ``rollout_rs_<opt>_{mean,max,min,masked_fraction,seq_masked_fraction}``.
    Raises:
        ValueError: bad options or thresholds (:func:`parse_rs`).
    """
    options = parse_rs(rollout_rs, rollout_rs_threshold)
    mask = response_mask.to(log_ratio.dtype)
    valid = mask != 0
    rows = valid.any(dim=-1)
    stats = _k_stats(log_ratio)
    keep_all = torch.ones_like(valid)
    metrics: dict[str, float] = {}
    for option, lower, upper in options:
        tok = stats[option[-2:]]
        if option.startswith("token_"):
            stat, row_stat = tok, None
        else:
            if option.startswith("seq_sum"):
                row_stat = masked_sum(tok, mask, axis=-1)
            elif option.startswith("seq_mean"):
                row_stat = masked_mean(tok, mask, axis=-1)
            else:
                row_max = tok.masked_fill(~valid, float("-inf")).max(dim=-1).values
                row_stat = torch.where(rows, row_max, torch.zeros_like(row_max))
            stat = row_stat.unsqueeze(-1).expand_as(tok)
        if lower is not None:
            keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            keep = stat <= upper
        keep_all &= keep
        rejected_rows = (~keep & valid).any(dim=-1)
        bounds = (math.log(upper), math.log(lower)) if lower is not None else (upper, None)
        metrics.update(rs_metrics(option, stat, row_stat, mask, *bounds))
        metrics[f"rollout_rs_{option}_masked_fraction"] = float(masked_mean((~keep).to(mask.dtype), mask))
        metrics[f"rollout_rs_{option}_seq_masked_fraction"] = (float(rejected_rows[rows].float().mean())
                                                                if rows.any() else 0.0)
    metrics["rollout_rs_masked_fraction"] = float(masked_mean((~keep_all).to(mask.dtype), mask))
    metrics["rollout_rs_seq_masked_fraction"] = float((~keep_all & valid).any(dim=-1).float().mean())
    return (response_mask * keep_all.to(response_mask.dtype)).to(response_mask.dtype), metrics


@torch.no_grad()
def compute_rollout_correction(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor, settings: Any,
    legacy: LegacyIS | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights, rejection mask and off-policy metrics (verl 0.9.1
    ``compute_rollout_correction_and_rejection_mask``). ``settings``: anything with the
    ``algorithm.rollout_correction`` attributes (the typed config node).

    Returns:
        ``(weights (B, T) or None when rollout_is is null, response_mask after rejection, metrics)``; metric names
        carry verl's ``rollout_corr/`` prefix.
    Raises:
        ValueError: no valid token, shapes that differ, or a bad setting.
    """
    if not bool((response_mask != 0).any()):
        raise ValueError("rollout correction: response_mask has no valid token")
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(f"rollout correction: shapes differ: old_log_prob {tuple(old_log_prob.shape)}, "
                         f"rollout_log_prob {tuple(rollout_log_prob.shape)}, response_mask {tuple(response_mask.shape)}")
    log_ratio = old_log_prob.float() - rollout_log_prob.float()
    metrics: dict[str, float] = {}
    weights = None
    if settings.rollout_is is not None and settings.rollout_is_threshold is not None:
        weights, m = compute_rollout_correction_weights(log_ratio, response_mask, settings.rollout_is,
                                                        settings.rollout_is_threshold,
                                                        bool(settings.rollout_is_batch_normalize), legacy)
        metrics.update(m)
    new_mask = response_mask.clone()
    if settings.rollout_rs is not None:
        new_mask, m = compute_rollout_rejection_mask(log_ratio, response_mask, settings.rollout_rs,
                                                     settings.rollout_rs_threshold)
        metrics.update(m)
    metrics.update(offpolicy_metrics(old_log_prob.float(), rollout_log_prob.float(), response_mask))
    return weights, new_mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def compute_policy_loss_bypass_mode(inputs: Any, config: Any, settings: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Bypass-mode policy loss (verl 0.9.1 ``core_algos.compute_policy_loss_bypass_mode``): ``inputs.old_log_prob``
    is the rollout's log-prob. IS weights and the rejection mask are computed (no grad) from log π_θ − log
    π_rollout; then ``settings.loss_type``:

    * ``ppo_clip``: the registered ``vanilla`` PPO loss on the rejected mask, ratio π_θ/π_rollout, *no* IS weights
      (the ratio already is the correction; the weights only give metrics);
    * ``reinforce``: L_t = −A_t · log π_θ(y_t) · sg(w_t) (w = 1 when rollout_is is null), aggregated by
      ``config.loss_agg_mode`` on the rejected mask; ∂L_t/∂log π_θ = −A_t·w_t.

    Args:
        inputs: :class:`rlhf_core.algos.policy_loss.PolicyLossInputs`; config: its PolicyLossConfig; settings: the
            ``algorithm.rollout_correction`` node.
    Returns:
        ``(pg_loss scalar, metrics)``: the loss's metrics (``ppo_kl`` = masked mean of log π_rollout − log π_θ for
        reinforce), plus the ``rollout_corr/*`` floats.
    Raises:
        ValueError: an unknown ``loss_type``.
    """
    from rlhf_core.algos.policy_loss import get_policy_loss_fn

    if settings.loss_type not in ("ppo_clip", "reinforce"):
        raise ValueError(f"algorithm.rollout_correction.loss_type={settings.loss_type!r}: expected ppo_clip or reinforce")
    weights, mask, rc_metrics = compute_rollout_correction(inputs.log_prob.detach(), inputs.old_log_prob,
                                                           inputs.response_mask, settings)
    inputs = dataclasses.replace(inputs, response_mask=mask, rollout_is_weights=None)
    if settings.loss_type == "ppo_clip":
        pg_loss, metrics = get_policy_loss_fn("vanilla")(inputs, config)
    else:
        pg_losses = -inputs.advantages * inputs.log_prob
        if weights is not None:
            pg_losses = pg_losses * weights.detach()
        pg_loss = agg_loss(pg_losses, mask, config.loss_agg_mode, global_tokens=inputs.global_tokens,
                           global_seqs=inputs.global_seqs, loss_scale_factor=inputs.loss_scale_factor)
        kl = masked_mean(inputs.old_log_prob - inputs.log_prob.detach(), mask)
        zero = torch.zeros((), dtype=torch.float32)
        metrics = {"ppo_kl": kl.detach().float(), "pg_clipfrac": zero, "pg_clipfrac_lower": zero}
    return pg_loss, {**metrics, **rc_metrics}
