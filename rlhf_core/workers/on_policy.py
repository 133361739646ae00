"""The on-policy shortcut: ``old_log_prob`` from the update's first forward (verl's on-policy case).

With one PPO epoch, one mini-batch per batch, no active dropout and unchanged weights, the ``old_log_prob``
forward (eval mode, before the update) and the update's first forward (train mode) run the same model on the
same tokens: their log-probs are equal, so the separate forward is pure waste. The update then takes
``old_log_probs = log_prob.detach()`` from its own forward (ratio exactly 1, as verl's ``on_policy`` branch),
and its ``actor/entropy`` metric is the one the ``old_log_prob`` stage would have logged.

Conditions the driver checks from the config (:func:`skip_old_log_prob`): ``ppo_epochs == 1``;
``ppo_mini_batch_size >= data.train_batch_size`` (one mini-batch); nothing reads ``old_log_probs`` before the
update (``algorithm.use_kl_in_reward``, rollout importance sampling ``algorithm.rollout_is_threshold`` /
``actor.rollout_is``, rollout correction whenever ``rollout.calculate_log_probs`` gives rollout log-probs (verl
0.9.1 computes its metrics then), ``kl_penalty: full``, ``sum_pi_squared`` for the optimal-token-baseline
estimators or ``actor.calculate_sum_pi_squared``); the actor updates this step (``global_steps > critic_warmup``).
The worker checks the rest on its own shard (:func:`first_forward_is_old_log_prob`): one mini-batch, one epoch,
no dropout module or config probability > 0 in train mode; otherwise it runs the ``old_log_prob`` forward itself.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from rlhf_core.algos.advantages_token_baseline import needs_sum_pi_squared
from rlhf_core.kernels.model_support import has_active_dropout  # noqa: F401 - also imported from here
from rlhf_core.protocol import Batch


def skip_old_log_prob(config: Any, global_steps: int) -> bool:
    """Whether the driver may leave ``old_log_probs`` to the actor update (see the module docstring)."""
    actor, algo = config.actor_rollout_ref.actor, config.algorithm
    return (int(actor.ppo_epochs) == 1
            and int(actor.ppo_mini_batch_size) >= int(config.data.train_batch_size)
            and not bool(algo.use_kl_in_reward)
            and algo.rollout_is_threshold is None and not bool(actor.rollout_is)
            and not bool(config.actor_rollout_ref.rollout.calculate_log_probs)  # rollout correction reads π_old
            and not needs_sum_pi_squared(algo.adv_estimator, actor.calculate_sum_pi_squared)
            and int(global_steps) > int(config.trainer.critic_warmup))


def first_forward_is_old_log_prob(model: nn.Module, n_rows: int, mini_batch_size: int | None, ppo_epochs: int) -> bool:
    """Whether this rank's update has exactly one optimizer step whose first forward sees the pre-update weights
    without dropout: ``ppo_epochs == 1``, ``n_rows <= mini_batch_size`` and no active dropout."""
    return int(ppo_epochs) == 1 and (mini_batch_size is None or n_rows <= int(mini_batch_size)) \
        and not has_active_dropout(model)


def merge_old_log_probs(batch: Batch, log_prob_out: Batch) -> Batch:
    """``batch`` with ``old_log_probs (B, T)`` from a ``compute_log_prob`` result (entropies dropped)."""
    return Batch({**batch.tensors, "old_log_probs": log_prob_out["old_log_probs"]}, batch.non_tensors, batch.meta)
