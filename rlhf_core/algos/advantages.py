"""Advantage estimators, keyed by ``algorithm.adv_estimator`` (verl ``core_algos.register_adv_est``).

Every estimator is called with keywords only, takes what it needs and ignores the rest::

    advantages, returns = get_adv_estimator("grpo")(
        token_level_rewards=r, response_mask=m, index=uid, values=v, gamma=1.0, lam=1.0,
        epsilon=1e-6, norm_adv_by_std_in_grpo=True, reward_baselines=None)

Inputs: ``token_level_rewards (B, T)`` float, ``response_mask (B, T)`` 0/1, ``index (B,)`` group keys
(numpy object/str array, list or tensor; verl's ``uid``), ``values (B, T)`` float (gae),
``reward_baselines (B,)`` float (remax). Outputs: ``advantages (B, T)`` and ``returns (B, T)``,
float32, exactly 0 at masked positions, computed without gradient. Semantics: ``docs/SEMANTICS.md``.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import numpy as np
import torch

from rlhf_core.algos.groups import group_ids, group_stats_loop, group_stats_vectorized
from rlhf_core.algos.utils import masked_whiten
from rlhf_core.registry import Registry

AdvEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]
_ADV_ESTIMATORS: Registry[AdvEstimator] = Registry("adv_estimator")


# verl's names: ``@register_adv_est(name)`` adds an estimator under ``algorithm.adv_estimator`` (ValueError on a
# taken name); ``get_adv_estimator(name)`` returns it (ValueError naming the registered ones for an unknown name)
register_adv_est = _ADV_ESTIMATORS.register
get_adv_estimator = _ADV_ESTIMATORS.get
get_adv_estimator_fn = get_adv_estimator


def registered_adv_estimators() -> list[str]:
    """Names of all registered estimators, sorted."""
    return _ADV_ESTIMATORS.names()


def _finish(adv: torch.Tensor, ret: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    valid = mask != 0
    zero = torch.zeros((), dtype=torch.float32, device=adv.device)
    return torch.where(valid, adv.float(), zero), torch.where(valid, ret.float(), zero)


def _masked_carry_scan(rewards, mask, gamma, values=None, lam=1.0):
    """Backward scan over valid tokens only: masked positions are skipped, not reset (see gae)."""
    b, t_len = rewards.shape
    valid = (mask != 0).to(torch.float32)
    r = rewards.float()
    v = values.float() if values is not None else None
    next_value = torch.zeros(b, dtype=torch.float32, device=r.device)
    carry = torch.zeros(b, dtype=torch.float32, device=r.device)
    out = torch.zeros(b, t_len, dtype=torch.float32, device=r.device)
    for t in reversed(range(t_len)):
        m = valid[:, t]
        v_t = v[:, t] if v is not None else torch.zeros_like(next_value)
        v_t = torch.where(m != 0, v_t, torch.zeros_like(v_t))  # a masked value is never read
        step = r[:, t] + gamma * next_value - v_t + gamma * lam * carry
        carry = torch.where(m != 0, step, carry)
        if v is not None:
            next_value = torch.where(m != 0, v_t, next_value)
        out[:, t] = carry
    return out


@register_adv_est("gae")
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, values: torch.Tensor | None = None,
    gamma: float = 1.0, lam: float = 1.0, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438, eq. 16).

    δ_t = r_t + γ·V_{t+1} − V_t; A_t = δ_t + γλ·A_{t+1}, backward over the *valid* tokens: a masked
    position neither reads its own value/reward nor breaks the recursion (the next value and the running
    A carry across it, verl's multi-turn behaviour). returns = A + V (before whitening); then A is
    whitened over all valid tokens of the batch (unbiased var, mean shifted).

    Args: ``token_level_rewards, values, response_mask``: ``(B, T)``; ``gamma``, ``lam``: floats.
    Returns: ``(advantages, returns)`` ``(B, T)`` float32, 0 at masked positions.
    Raises: ValueError when ``values`` is None.
    """
    if values is None:
        raise ValueError("adv_estimator 'gae' needs critic values (values=None); enable the critic")
    adv = _masked_carry_scan(token_level_rewards, response_mask, gamma, values=values, lam=lam)
    returns = adv + values.float()
    return _finish(masked_whiten(adv, response_mask), returns, response_mask)


def _broadcast(seq_adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return seq_adv.float().unsqueeze(-1) * (mask != 0).float()


def _group_outcome(rewards, mask, index, stats_fn, advantage):
    """Outcome advantage from group statistics: ``s = Σ_t rewards (B,)``, ``advantage(s, mean, std, size)`` in
    float64 (each ``(B,)``, the statistics of the row's group), exactly 0 in a group of equal scores, broadcast to
    the valid tokens; returns = advantages."""
    scores = rewards.float().sum(dim=-1)
    mean, std, size, const = stats_fn(scores, index)
    adv = advantage(scores.double(), mean, std, size)
    adv = torch.where(const, torch.zeros_like(adv), adv)
    a = _broadcast(adv, mask)
    return _finish(a, a, mask)


def _vectorized(estimator: AdvEstimator, name: str) -> AdvEstimator:
    """Register ``estimator`` again under ``name`` with its group statistics by bincount/scatter
    (:func:`group_stats_vectorized`) instead of a loop over groups: the same numbers, tested against each other."""
    fast = functools.partial(estimator, group_stats=group_stats_vectorized)
    fast.__doc__ = f"{estimator.__name__} with group statistics by bincount/scatter; same numbers."
    return register_adv_est(name)(fast)


@register_adv_est("grpo")
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
    epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, group_stats: Callable = group_stats_loop,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, arXiv:2402.03300, §4.1.2): A_i = (s_i − mean_g)/(std_g + ε).

    s_i = Σ_t rewards; std is unbiased; ``norm_adv_by_std_in_grpo=False`` gives A = s − mean_g (Dr. GRPO).
    A group of one has mean 0, std 1. A group whose scores are equal up to float rounding gets A = 0
    exactly (verl would divide rounding noise by ε). A is broadcast to valid tokens; returns = A.
    ``group_stats``: how the per-group statistics are computed (``grpo_vectorized`` passes the vectorized one).

    Returns: ``(advantages, returns)`` ``(B, T)`` float32.
    """
    def advantage(scores, mean, std, _size):
        centered = scores - mean
        return centered / (std + epsilon) if norm_adv_by_std_in_grpo else centered

    return _group_outcome(token_level_rewards, response_mask, index, group_stats, advantage)


compute_grpo_vectorized_outcome_advantage = _vectorized(compute_grpo_outcome_advantage, "grpo_vectorized")


def _rloo_advantage(scores, mean, _std, size):
    if bool((size < 2).any()):
        raise ValueError("rloo needs at least 2 samples per prompt (actor_rollout_ref.rollout.n >= 2); "
                         "a group has only 1")
    n = size.double()
    return n / (n - 1) * (scores - mean)


@register_adv_est("rloo")
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
    group_stats: Callable = group_stats_loop, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740, eq. 6): A_i = s_i − mean of the other samples of the group
    = n/(n−1)·(s_i − mean_g). Broadcast to valid tokens; returns = A. ``group_stats`` as for ``grpo``.

    Raises: ValueError when a group has a single sample (n = 1 is a config error).
    Returns: ``(advantages, returns)`` ``(B, T)`` float32.
    """
    return _group_outcome(token_level_rewards, response_mask, index, group_stats, _rloo_advantage)


compute_rloo_vectorized_outcome_advantage = _vectorized(compute_rloo_outcome_advantage, "rloo_vectorized")


@register_adv_est("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262, §3): G_t = r_t + γ·G_{t+1} over valid tokens, whitened over the batch.

    Masked positions are skipped by the recursion (like gae), not reset. verl resets the running return
    at masked tokens, which differs only for a mask with holes (multi-turn).
    Returns: ``(advantages = whiten(G), returns = G)`` ``(B, T)`` float32.
    """
    g = _masked_carry_scan(token_level_rewards, response_mask, gamma)
    return _finish(masked_whiten(g, response_mask), g, response_mask)


@register_adv_est("reinforce_plus_plus_baseline")
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (arXiv:2501.03262 v2): (s − mean_g) broadcast to valid tokens, whitened over the batch.

    A group of one has mean 0 (verl). Returns: ``(advantages, returns)``, both the whitened value, ``(B, T)`` float32.
    """
    scores = token_level_rewards.float().sum(dim=-1)
    mean, _, _, const = group_stats_vectorized(scores, index)
    centered = torch.where(const, torch.zeros_like(mean), scores.double() - mean)
    a = masked_whiten(_broadcast(centered, response_mask), response_mask)
    return _finish(a, a, response_mask)


@register_adv_est("remax")
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, reward_baselines: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505, Alg. 1): G_t = Σ_{t'≥t} r_{t'} (valid tokens), A_t = G_t − b.

    ``reward_baselines (B,)`` is the greedy response's score b. Returns ``(A, G)`` ``(B, T)`` float32.
    Raises: ValueError when ``reward_baselines`` is None.
    """
    if reward_baselines is None:
        raise ValueError("adv_estimator 'remax' needs reward_baselines (B,): the greedy response's score")
    valid = (response_mask != 0).float()
    r = torch.where(valid != 0, token_level_rewards.float(), torch.zeros((), device=valid.device))
    returns = r.flip(-1).cumsum(-1).flip(-1)
    adv = returns - reward_baselines.float().reshape(-1, 1)
    return _finish(adv, returns, response_mask)


def _takes_groups(estimator: AdvEstimator) -> bool:
    """Whether ``estimator`` reads group keys (declares an ``index`` parameter): GRPO, RLOO, OPO, GPG, ..."""
    try:
        return "index" in inspect.signature(estimator).parameters
    except (TypeError, ValueError):  # a callable without a signature: treat it as group-free
        return False


def _rows(x: Any, keep: torch.Tensor) -> Any:
    """The rows ``keep`` ((K,) int64 indices) of a tensor, numpy array or list (of each value of a dict); None
    stays None."""
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: _rows(v, keep) for k, v in x.items()}
    if isinstance(x, torch.Tensor):
        return x[keep.to(x.device)]
    return np.asarray(x, dtype=object)[keep.numpy()]


@torch.no_grad()
def compute_advantage_without_aborted(
    estimator: AdvEstimator, aborted: torch.Tensor, *, token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor, index: Any = None, values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None, row_inputs: dict[str, Any] | None = None, **scalars: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``estimator`` on the rows that were not aborted by ``rollout.over_sample_rate``; aborted rows get
    advantages = returns = 0.

    An aborted response (the rollout stopped it before it finished: no response token) is not a sample of its
    prompt: its score would pull its group's mean and standard deviation, so the kept responses' advantages would be
    wrong (a group of 4 with one aborted: GRPO's statistics are those of the other 3). The estimator therefore sees
    only the kept rows, for group statistics, batch whitening (gae, REINFORCE++) and GPG's batch factor alike.

    A group that aborting left with one response (of ≥ 2 generated) has no baseline to compare it with; for an
    estimator that reads groups (one with an ``index`` parameter) that response also gets advantage 0 (a group of
    one by configuration, ``rollout.n = 1``, keeps the estimator's own rule).

    Args:
        estimator: an advantage estimator (:func:`get_adv_estimator`).
        aborted: ``(B,)`` bool, True for an aborted row.
        token_level_rewards, response_mask, values: ``(B, T)``; index: ``(B,)`` group keys; reward_baselines
            ``(B,)``; row_inputs: more per-row inputs by name (``old_log_probs``, ``sum_pi_squared``, a dict of
            ``(B,)`` tensors...), cut to the kept rows like the others; scalars: passed to the estimator unchanged
            (``gamma``, ``lam``, ``epsilon``, ...).
    Returns:
        ``(advantages, returns)`` ``(B, T)`` float32, exactly 0 on aborted rows (and on masked positions); with no
        row aborted, the estimator's own output.
    Raises:
        ValueError: when ``aborted`` does not have one entry per row; whatever the estimator raises.
    """
    b = token_level_rewards.shape[0]
    dropped = aborted.detach().cpu().bool().reshape(-1).clone()
    if dropped.shape[0] != b:
        raise ValueError(f"aborted has {dropped.shape[0]} entries but the batch has {b} sequences")
    if bool(dropped.any()) and index is not None and _takes_groups(estimator):
        ids, n_groups = group_ids(index, b)
        generated = torch.bincount(ids, minlength=n_groups)
        kept = torch.bincount(ids[~dropped], minlength=n_groups)
        dropped |= ((kept == 1) & (generated >= 2))[ids]  # lone survivors: no baseline
    inputs = dict(token_level_rewards=token_level_rewards, response_mask=response_mask, index=index, values=values,
                  reward_baselines=reward_baselines, **(row_inputs or {}))
    if not bool(dropped.any()):
        return estimator(**inputs, **scalars)
    keep = torch.nonzero(~dropped).reshape(-1)
    advantages = torch.zeros(token_level_rewards.shape, dtype=torch.float32, device=token_level_rewards.device)
    returns = torch.zeros_like(advantages)
    if keep.numel() == 0:
        return advantages, returns
    adv, ret = estimator(**{k: _rows(v, keep) for k, v in inputs.items()}, **scalars)
    rows = keep.to(advantages.device)
    advantages[rows], returns[rows] = adv.float(), ret.float()
    return advantages, returns
