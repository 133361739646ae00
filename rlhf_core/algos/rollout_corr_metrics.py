"""Metrics of rollout correction, under verl 0.9.1's names (``rollout_corr/`` is added by the caller).

Match verl 0.9.1 ``trainer/ppo/rollout_corr_helper.compute_is_metrics`` and ``compute_offpolicy_metrics``.
All values are python floats.
"""
from __future__ import annotations

import math

import torch

from rlhf_core.algos.utils import masked_mean, masked_sum

_BOUND = 20.0


def is_metrics(weights: torch.Tensor, raw: torch.Tensor, seq_log: torch.Tensor | None, mask: torch.Tensor,
               upper: float, lower: float | None) -> dict[str, float]:
    """Statistics of IS weights.

    Args:
        weights: ``(B, T)`` the applied weights (after TIS/IcePop, before batch normalisation); raw: ``(B, T)`` the
            weights before bounds (× mask). seq_log: ``(B, 1)`` the row's log weight for sequence-level weights
            (unclamped), else None. mask: ``(B, T)`` float 0/1. upper, lower: bounds (lower None = 1/upper here).
    Returns:
        ``rollout_is_mean`` (masked mean of weights), ``rollout_is_max|min`` (token: over valid weights;
        sequence: e^{min(max ℓ_seq, 20)}, e^{min ℓ_seq} over all rows), ``rollout_is_ratio_fraction_high|low``
        (raw above U / below L: token over valid tokens, sequence over rows), ``rollout_is_std`` (of weights clamped
        to [0, U]), ``rollout_is_eff_sample_size`` (1/mean(ŵ²), ŵ = clamped w / (its mean + 1e-8); 0 when every weight is 0),
        ``rollout_is_seq_{mean,std,max,min,max_deviation}`` (of each row's mean weight; deviation from 1),
        ``rollout_is_seq_fraction_high|low`` (row mean of raw above U / below L), ``rollout_is_oob_ratio`` (IcePop:
        valid tokens with raw outside [L, U]).
    Raises:
        ValueError: no valid token.
    """
    if not bool((mask != 0).any()):
        raise ValueError("rollout correction: response_mask has no valid token")
    low = 1.0 / upper if lower is None else lower
    valid = mask != 0
    out: dict[str, float] = {"rollout_is_mean": float(masked_mean(weights, mask))}
    if seq_log is not None:
        out["rollout_is_max"] = math.exp(min(float(seq_log.max()), _BOUND))
        out["rollout_is_min"] = math.exp(float(seq_log.min()))
        out["rollout_is_ratio_fraction_high"] = float((seq_log > math.log(upper)).float().mean())
        out["rollout_is_ratio_fraction_low"] = float((seq_log < math.log(low)).float().mean())
    else:
        out["rollout_is_ratio_fraction_high"] = float(masked_mean((raw > upper).to(mask.dtype), mask))
        out["rollout_is_ratio_fraction_low"] = float(masked_mean((raw < low).to(mask.dtype), mask))
        out["rollout_is_max"] = float(weights[valid].max())
        out["rollout_is_min"] = float(weights[valid].min())
    clamped = weights.clamp(min=0.0, max=upper)
    mean_c = masked_mean(clamped, mask)
    if mask.sum() > 1:
        out["rollout_is_std"] = float(torch.sqrt(torch.clamp(masked_mean(clamped.square(), mask) - mean_c ** 2, min=0)))
    else:
        out["rollout_is_std"] = 0.0
    second = float(masked_mean((clamped / (mean_c + 1e-8)).square(), mask))
    out["rollout_is_eff_sample_size"] = 1.0 / second if second > 0 else 0.0  # all weights 0 (verl divides by 0)
    row_mean = masked_mean(weights, mask, axis=-1)
    out["rollout_is_seq_mean"] = float(row_mean.mean())
    out["rollout_is_seq_std"] = float(row_mean.std()) if row_mean.numel() > 1 else 0.0
    out["rollout_is_seq_max"] = float(row_mean.max())
    out["rollout_is_seq_min"] = float(row_mean.min())
    out["rollout_is_seq_max_deviation"] = float((row_mean - 1.0).abs().max())
    raw_row = masked_mean(raw, mask, axis=-1)
    out["rollout_is_seq_fraction_high"] = float((raw_row > upper).float().mean())
    out["rollout_is_seq_fraction_low"] = float((raw_row < low).float().mean())
    if lower is not None:
        out["rollout_is_oob_ratio"] = float(masked_mean(((raw < lower) | (raw > upper)).to(mask.dtype), mask))
    return out


def offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                      response_mask: torch.Tensor) -> dict[str, float]:
    """Off-policy diagnostics of π_old (trainer) vs π_rollout.

    Args:
        old_log_prob, rollout_log_prob: ``(B, T)`` float; response_mask: ``(B, T)`` 0/1.
    Returns:
        ``training_ppl`` / ``rollout_ppl`` (batch mean of per-row e^{−mean log π}), ``training_log_ppl`` /
        ``rollout_log_ppl`` (batch mean of −mean log π), ``kl`` (masked mean of log π_rollout − log π_old),
        ``k3_kl`` (masked mean of e^ℓ − ℓ − 1, ℓ = log π_old − log π_rollout), ``log_ppl_diff`` (+ ``_abs_diff``,
        ``_max``, ``_min``; per row mean log π_rollout − mean log π_old), ``ppl_ratio`` (batch mean of e^{that}),
        ``chi2_token`` (masked mean of e^{2·clamp(ℓ, ±20)} − 1), ``chi2_seq`` (row mean of e^{2·clamp(Σℓ, ±20)} − 1).
    """
    mask = response_mask.to(old_log_prob.dtype)
    train_row = masked_mean(old_log_prob, mask, axis=-1)
    roll_row = masked_mean(rollout_log_prob, mask, axis=-1)
    log_ratio = old_log_prob - rollout_log_prob
    diff = roll_row - train_row
    seq_sum = torch.clamp(masked_sum(log_ratio, mask, axis=-1), -_BOUND, _BOUND)
    return {
        "training_ppl": float(torch.exp(-train_row).mean()),
        "training_log_ppl": float((-train_row).mean()),
        "kl": float(masked_mean(rollout_log_prob - old_log_prob, mask)),
        "k3_kl": float(masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)),
        "rollout_ppl": float(torch.exp(-roll_row).mean()),
        "rollout_log_ppl": float((-roll_row).mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "log_ppl_diff_max": float(diff.max()),
        "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(torch.exp(diff).mean()),
        "chi2_token": float(masked_mean(torch.exp(torch.clamp(log_ratio, -_BOUND, _BOUND)).square(), mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq_sum).mean() - 1.0),
    }


def rs_metrics(option: str, stat: torch.Tensor, row_stat: torch.Tensor | None, mask: torch.Tensor,
               upper: float, lower: float | None) -> dict[str, float]:
    """Statistics of one rejection-sampling option's statistic (verl 0.9.1 ``compute_rs_metrics``), named
    ``rollout_rs_<option>_*``.

    Args:
        stat: ``(B, T)`` the statistic per token (a sequence option's row value broadcast over the row); row_stat:
            ``(B,)`` the row values of a sequence option, else None (rows then use the masked mean of ``stat``).
            mask: ``(B, T)`` float 0/1. upper, lower: the bounds on the statistic's scale (k1: log U and log L;
            k2/k3: U and None).
    Returns:
        ``_mean`` (over valid tokens), ``_max|_min`` (rows for sequence options, valid tokens otherwise),
        ``_fraction_high|_low`` (of those above upper / below lower; low is 0 without a lower bound), ``_std`` (of the
        statistic clamped to [lower or 0, upper]), ``_seq_{mean,std,max,min,max_deviation,fraction_high}`` over
        non-empty rows (+ ``_seq_fraction_low`` with a lower bound).
    """
    p = f"rollout_rs_{option}"
    valid, rows = mask != 0, (mask != 0).any(dim=-1)
    seq = (row_stat if row_stat is not None else masked_mean(stat, mask, axis=-1))[rows]
    out = {f"{p}_mean": float(masked_mean(stat, mask))}
    values = seq if row_stat is not None and seq.numel() else stat[valid]
    out[f"{p}_max"], out[f"{p}_min"] = float(values.max()), float(values.min())
    if row_stat is not None and seq.numel():
        out[f"{p}_fraction_high"] = float((seq > upper).float().mean())
        out[f"{p}_fraction_low"] = float((seq < lower).float().mean()) if lower is not None else 0.0
    else:
        out[f"{p}_fraction_high"] = float(masked_mean((stat > upper).to(mask.dtype), mask))
        out[f"{p}_fraction_low"] = float(masked_mean((stat < lower).to(mask.dtype), mask)) if lower is not None else 0.0
    if mask.sum() > 1:
        c = stat.clamp(min=0.0 if lower is None else lower, max=upper)
        out[f"{p}_std"] = float(torch.sqrt(torch.clamp(masked_mean(c.square(), mask) - masked_mean(c, mask) ** 2, min=0)))
    else:
        out[f"{p}_std"] = 0.0
    empty = not seq.numel()
    out[f"{p}_seq_mean"] = 0.0 if empty else float(seq.mean())
    out[f"{p}_seq_std"] = float(seq.std()) if seq.numel() > 1 else 0.0
    out[f"{p}_seq_max"] = 0.0 if empty else float(seq.max())
    out[f"{p}_seq_min"] = 0.0 if empty else float(seq.min())
    out[f"{p}_seq_max_deviation"] = 0.0 if empty else float(seq.abs().max())
    out[f"{p}_seq_fraction_high"] = 0.0 if empty else float((seq > upper).float().mean())
    if lower is not None:
        out[f"{p}_seq_fraction_low"] = 0.0 if empty else float((seq < lower).float().mean())
    return out
