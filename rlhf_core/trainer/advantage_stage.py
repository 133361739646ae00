"""The [adv] stage: rewards from scores (KL in reward, :func:`rewards_from_scores`) and the call of
``algorithm.adv_estimator`` (which batch columns each estimator reads).

Every estimator gets ``token_level_rewards``, ``response_mask``, ``index`` (``uid``), ``values`` and
``reward_baselines`` when present, and the scalars ``gamma``, ``lam``, ``epsilon``, ``norm_adv_by_std_in_grpo``.
Some read more (as verl 0.9's ``compute_advantage``):

* ``optimal_token_baseline`` / ``tir_optimal_token_baseline``: ``old_log_probs``, ``sum_pi_squared`` (the
  [old_log_prob] stage adds it, see ``rlhf_core.algos.advantages_token_baseline.needs_sum_pi_squared``) and
  ``rollout_is_weights`` when the batch has them;
* ``gdpo``: ``reward_components``, the ``algorithm.gdpo_reward_keys`` columns of the reward extra info, and
  ``reward_weights`` = ``algorithm.gdpo_reward_weights``; logs ``gdpo/<key>/{mean,std,max,min}`` (as verl).
"""
from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from rlhf_core.algos.advantages import compute_advantage_without_aborted, get_adv_estimator
from rlhf_core.algos.kl_controller import apply_kl_penalty
from rlhf_core.algos.advantages_gdpo import reward_components_from
from rlhf_core.algos.advantages_token_baseline import SUM_PI_SQUARED_ESTIMATORS
from rlhf_core.metrics.training import aborted_mask
from rlhf_core.protocol import Batch


def estimator_extra_inputs(algo: DictConfig, batch: Batch, metrics: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(row_inputs, scalars)`` that ``algo.adv_estimator`` reads beyond the common ones (module docstring).

    Raises:
        ValueError: naming the missing column (``sum_pi_squared`` when the [old_log_prob] stage did not run) or the
            bad ``algorithm.gdpo_reward_keys`` entry.
    """
    name = algo.adv_estimator
    rows: dict[str, Any] = {}
    scalars: dict[str, Any] = {}
    if name in SUM_PI_SQUARED_ESTIMATORS:
        for key in ("old_log_probs", "sum_pi_squared"):
            if key not in batch:
                raise ValueError(f"algorithm.adv_estimator={name} needs {key!r} from the actor's log-prob pass "
                                 f"(actor_rollout_ref.actor.calculate_sum_pi_squared); the batch has {batch.keys()}")
        rows.update(old_log_probs=batch["old_log_probs"], sum_pi_squared=batch["sum_pi_squared"],
                    rollout_is_weights=batch["rollout_is_weights"] if "rollout_is_weights" in batch else None)
    if name == "gdpo":
        comps = reward_components_from(batch.non_tensors, algo.gdpo_reward_keys, len(batch))
        rows["reward_components"] = comps
        weights = algo.gdpo_reward_weights
        scalars["reward_weights"] = None if weights is None else [float(w) for w in weights]
        for key, v in comps.items():
            metrics.update({f"gdpo/{key}/mean": float(v.mean()), f"gdpo/{key}/std": float(v.std(unbiased=False)),
                            f"gdpo/{key}/max": float(v.max()), f"gdpo/{key}/min": float(v.min())})
    return rows, scalars


def rewards_from_scores(algo: DictConfig, batch: Batch, kl_ctrl: Any, metrics: dict) -> torch.Tensor:
    """``token_level_rewards (B, T)``: with ``algorithm.use_kl_in_reward``, ``token_level_scores`` minus the
    ``kl_ctrl`` coefficient × the ``algorithm.kl_penalty`` estimate of KL(π_old ‖ π_ref) per response token
    (:func:`~rlhf_core.algos.kl_controller.apply_kl_penalty`, which also updates an adaptive ``kl_ctrl`` and adds its
    metrics); ``kl_penalty: full`` uses the [ref] stage's exact per-token KL ``ref_kl_full``, penalised as k1 of
    (kl − 0). Without ``use_kl_in_reward``, the scores themselves."""
    scores, mask = batch["token_level_scores"], batch["response_mask"]
    if not algo.use_kl_in_reward:
        return scores
    log_prob, ref_log_prob, kind = batch["old_log_probs"], batch["ref_log_prob"], algo.kl_penalty
    if kind == "full":
        log_prob, ref_log_prob, kind = batch["ref_kl_full"], torch.zeros_like(batch["ref_kl_full"]), "kl"
    rewards, kl_metrics = apply_kl_penalty(scores, log_prob, ref_log_prob, mask, kl_ctrl, kind)
    metrics.update(kl_metrics)
    return rewards


def run_adv_estimator(algo: DictConfig, batch: Batch, rewards: torch.Tensor,
                      metrics: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` ``(B, T)`` float32 of ``algo.adv_estimator`` on ``rewards (B, T)`` over the rows
    that ``rollout.over_sample_rate`` did not abort (``compute_advantage_without_aborted``)."""
    rows, scalars = estimator_extra_inputs(algo, batch, metrics)
    return compute_advantage_without_aborted(
        get_adv_estimator(algo.adv_estimator), aborted_mask(batch),
        token_level_rewards=rewards, response_mask=batch["response_mask"], index=batch["uid"],
        values=batch["values"] if "values" in batch else None, gamma=float(algo.gamma), lam=float(algo.lam),
        epsilon=1e-6, norm_adv_by_std_in_grpo=bool(algo.norm_adv_by_std_in_grpo),
        reward_baselines=batch["reward_baselines"] if "reward_baselines" in batch else None,
        row_inputs=rows, **scalars)
