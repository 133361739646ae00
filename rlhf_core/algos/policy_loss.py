"""PPO policy loss (clipped, dual-clip) and clipped value loss, with a policy-loss registry.

The registry is keyed by verl's ``actor_rollout_ref.actor.policy_loss.loss_mode`` (``vanilla`` here; ``gspo``,
``gpg``, ``geo_mean`` in ``policy_loss_seq``, ``clip_cov``, ``kl_cov`` in ``policy_loss_cov``). Every entry takes
the four ``(B, T)`` tensors ``old_log_prob, log_prob, advantages, response_mask`` positionally and everything else
by keyword (``loss_agg_mode``, the clip ratios, the ``policy_loss.*`` scalars, ``rollout_is_weights``,
``global_tokens``, ``global_seqs``), ignoring keywords it does not use: :func:`policy_loss_scalars` gives the
scalars from the actor config, so the actor calls every loss the same way. Metrics are returned as 0-d *detached* float32
tensors (no device sync inside the micro-batch loop); call ``float()`` / ``.item()`` when logging.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from rlhf_core.algos.loss_agg import agg_loss
from rlhf_core.algos.utils import masked_mean
from rlhf_core.registry import Registry

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
_POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss_mode")


# ``@register_policy_loss(name)`` adds a loss under ``policy_loss.loss_mode`` (ValueError on a taken name);
# ``get_policy_loss_fn(name)`` returns it (ValueError naming the registered ones for an unknown name)
register_policy_loss = _POLICY_LOSSES.register
get_policy_loss_fn = _POLICY_LOSSES.get


def pg_metrics(pg_clipfrac: torch.Tensor, ppo_kl: torch.Tensor, pg_clipfrac_lower: torch.Tensor) -> dict:
    """The three policy-loss metrics as 0-d detached float32 tensors (what every loss returns)."""
    return {"pg_clipfrac": pg_clipfrac.detach().float(), "ppo_kl": ppo_kl.detach().float(),
            "pg_clipfrac_lower": pg_clipfrac_lower.detach().float()}


def clipped_surrogate(advantages: torch.Tensor, ratio: torch.Tensor, clip_ratio_low: float,
                      clip_ratio_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's two surrogate terms (arXiv:1707.06347, eq. 7), ``(B, T)`` float each: ``(−A·r, −A·clip(r, 1−ε_low,
    1+ε_high))``; their elementwise max is the clipped loss."""
    return -advantages * ratio, -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)


def weighted_agg(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    rollout_is_weights: torch.Tensor | None = None,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """The scalar of a per-token policy loss: ``(B, T)`` ``pg_losses`` × the detached ``(B, T)``
    ``rollout_is_weights`` when given, then ``agg_loss(·, response_mask, loss_agg_mode, global_tokens,
    global_seqs)`` (see ``loss_agg`` for micro-batch contributions). Other keywords (the scalars a loss does not
    use) are ignored, so every loss can pass its remaining keywords through."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach()
    return agg_loss(pg_losses, response_mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)


def policy_loss_scalars(actor_config: Any) -> dict[str, float]:
    """The scalar keywords every policy loss is called with, read from ``actor_rollout_ref.actor``:
    ``clip_ratio_low`` / ``clip_ratio_high`` (null → ``clip_ratio``, as verl), ``clip_ratio_c`` and the
    ``policy_loss`` block's ``clip_cov_ratio``, ``clip_cov_lb``, ``clip_cov_ub``, ``kl_cov_ratio``, ``ppo_kl_coef``."""
    clip, low, high = actor_config.clip_ratio, actor_config.clip_ratio_low, actor_config.clip_ratio_high
    pl = actor_config.policy_loss
    return {"clip_ratio_low": float(clip if low is None else low), "clip_ratio_high": float(clip if high is None else high),
            "clip_ratio_c": float(actor_config.clip_ratio_c), "clip_cov_ratio": float(pl.clip_cov_ratio),
            "clip_cov_lb": float(pl.clip_cov_lb), "clip_cov_ub": float(pl.clip_cov_ub),
            "kl_cov_ratio": float(pl.kl_cov_ratio), "ppo_kl_coef": float(pl.ppo_kl_coef)}


@register_policy_loss("vanilla")
def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
    **agg_kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7) with dual clip (Ye et al. 2020,
    arXiv:1912.09729, eq. 5); verl ``compute_policy_loss_vanilla``.

    r = exp(clamp(logπ − logπ_old, −20, 20)); L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high));
    for A < 0: L = min(L, −A·c) with c = ``clip_ratio_c`` (> 1). When given, the detached
    ``rollout_is_weights`` multiply L per token. The scalar is ``agg_loss(L, response_mask, loss_agg_mode,
    global_tokens, global_seqs)`` (see ``loss_agg`` for micro-batch contributions).

    Args:
        old_log_prob, log_prob, advantages: ``(B, T)`` float (gradient flows through ``log_prob`` only).
        response_mask: ``(B, T)`` 0/1.
        agg_kwargs: ``rollout_is_weights`` (``(B, T)`` float or ``None``), ``global_tokens``, ``global_seqs``
            (see :func:`weighted_agg`); other keywords are ignored.
    Returns:
        ``(pg_loss 0-d tensor, metrics)`` with metrics (0-d detached float32, masked means over this batch):
        ``pg_clipfrac`` (fraction of tokens where the clipped term is active), ``ppo_kl`` = mean(logπ_old − logπ),
        ``pg_clipfrac_lower`` (fraction of A<0 tokens where the dual clip is active).
    Raises:
        ValueError: when ``clip_ratio_c <= 1``.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped, loss_clipped = clipped_surrogate(advantages, ratio, clip_ratio_low, clip_ratio_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = torch.minimum(loss_ppo, -advantages * clip_ratio_c)
    negative = advantages < 0
    pg_losses = torch.where(negative, loss_dual, loss_ppo)
    pg_loss = weighted_agg(pg_losses, response_mask, loss_agg_mode, **agg_kwargs)
    with torch.no_grad():
        metrics = pg_metrics(masked_mean((loss_clipped > loss_unclipped).float(), response_mask),
                             masked_mean(-log_ratio, response_mask),
                             masked_mean(((loss_ppo > -advantages * clip_ratio_c) & negative).float(), response_mask))
    return pg_loss, metrics


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None,
    loss_agg_mode: str,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss (PPO2 baseline, verl ``compute_value_loss``): ½·agg(max((V−R)², (V_clip−R)²)).

    V_clip = V_old + clip(V − V_old, −``cliprange_value``, +``cliprange_value``); ``None`` disables clipping.

    Args:
        vpreds: ``(B, T)`` float, current critic values V (gradient flows through these).
        returns: ``(B, T)`` float targets R. values: ``(B, T)`` float V_old at rollout.
        response_mask: ``(B, T)`` 0/1.
    Returns:
        ``(vf_loss 0-d tensor, vf_clipfrac 0-d detached float32)``; vf_clipfrac = masked mean of
        1[(V_clip−R)² > (V−R)²].
    """
    if cliprange_value is None:
        vclipped = vpreds
    else:
        vclipped = values + torch.clamp(vpreds - values, -cliprange_value, cliprange_value)
    loss1 = (vpreds - returns) ** 2
    loss2 = (vclipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(loss1, loss2), response_mask, loss_agg_mode,
                             global_tokens=global_tokens, global_seqs=global_seqs)
    with torch.no_grad():
        clipfrac = masked_mean((loss2 > loss1).float(), response_mask)
    return vf_loss, clipfrac.detach().float()
