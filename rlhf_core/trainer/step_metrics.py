"""The metrics of a finished PPO step that no single stage logs (verl ``RayPPOTrainer.fit``'s tail): data, multi-turn,
timing, throughput, the actor update's MFU and the step counters."""
from __future__ import annotations

import time
from typing import Any

from omegaconf import DictConfig

from rlhf_core.agent.layout import multiturn_metrics
from rlhf_core.metrics.training import compute_data_metrics, compute_throughput_metrics, compute_timing_metrics
from rlhf_core.protocol import Batch
from rlhf_core.trainer.mfu import ActorMFU


class StepMetrics:
    """Computes a step's closing metrics; holds the actor's :class:`~rlhf_core.trainer.mfu.ActorMFU`, built at the
    first step that updates the actor (its peak FLOP/s is asked of the actor group once per run).

    Args:
        config: the full ``ppo_trainer`` config (reads ``actor_rollout_ref.model`` and ``.actor.ppo_epochs``).
        use_critic: whether the batch has ``values``/``returns`` (the critic metrics of ``compute_data_metrics``).
    """

    def __init__(self, config: DictConfig, use_critic: bool) -> None:
        self.config = config
        self.use_critic = use_critic
        self._mfu: ActorMFU | None = None

    def __call__(self, batch: Batch, timing: dict[str, float], actor_wg: Any, global_step: int, epoch: int,
                 train_started: float | None) -> dict[str, float]:
        """The metrics of the step that produced ``batch`` with stage times ``timing`` (seconds):
        ``compute_data_metrics``, ``num_turns/*``/``tool_calls/*`` (multi-turn rollouts only), ``timing_s/*``,
        ``perf/*`` (``perf/mfu/actor`` when the actor updated and its peak is known: left out, never a false 0),
        ``training/global_step``, ``training/epoch`` and ``timing_s/training_elapsed`` (seconds since
        ``train_started``, a ``time.monotonic()`` value; left out when None)."""
        metrics: dict[str, float] = {}
        metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
        metrics.update(multiturn_metrics(batch))  # num_turns/*, tool_calls/*; {} for single-turn rollouts
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing, actor_wg.world_size))
        if "update_actor" in timing:
            if self._mfu is None:
                self._mfu = ActorMFU(self.config.actor_rollout_ref.model, actor_wg,
                                     self.config.actor_rollout_ref.actor.ppo_epochs)
            mfu = self._mfu(batch["attention_mask"].sum(-1).tolist(), timing["update_actor"])
            if mfu is not None:
                metrics["perf/mfu/actor"] = mfu
        metrics.update({"training/global_step": global_step, "training/epoch": epoch})
        if train_started is not None:
            metrics["timing_s/training_elapsed"] = time.monotonic() - train_started
        return metrics
