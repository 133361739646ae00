"""``actor_rollout_ref.actor.use_rollout_log_probs`` (verl 0.9.1 ``FSDPActorConfig``; its fully-async config sets it
True): the update's ``old_log_probs`` are the rollout engine's log-probs, as rollout-correction bypass mode sets them,
instead of the actor's recompute (issue 35's trial: the key was unknown)."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from rlhf_core.config import ConfigError, load_config
from rlhf_core.protocol import Batch
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer

A = "actor_rollout_ref."


class _ActorGroup:
    """The actor group's one call here: ``compute_log_prob`` gives its own log-probs (all -1.0), counted."""

    def __init__(self) -> None:
        self.calls = 0

    def execute_dp(self, method: str, batch: Batch) -> Batch:
        assert method == "compute_log_prob"
        self.calls += 1
        return Batch({"old_log_probs": torch.full_like(batch["rollout_log_probs"], -1.0)})


def _old(use: bool) -> tuple[torch.Tensor, int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config("ppo_trainer", [A + "rollout.name=hf", A + "rollout.calculate_log_probs=True",
                                          f"{A}actor.use_rollout_log_probs={use}"])
    group = _ActorGroup()
    trainer = SimpleNamespace(config=cfg, global_steps=1, actor_wg=group)
    rollout = torch.tensor([[-0.5, -2.0, -0.25]])
    batch = Batch({"rollout_log_probs": rollout, "response_mask": torch.ones(1, 3)})
    out = RayPPOTrainer.compute_old_log_prob(trainer, batch, {})
    return out["old_log_probs"], group.calls


def test_old_log_probs_are_the_rollouts_with_the_key_and_the_actors_without():
    old, calls = _old(True)
    assert old.tolist() == [[-0.5, -2.0, -0.25]] and calls == 0  # π_old = π_rollout, no actor pass
    old, calls = _old(False)
    assert old.tolist() == [[-1.0, -1.0, -1.0]] and calls == 1  # the actor's recompute


def test_it_needs_the_rollout_log_probs():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.actor.use_rollout_log_probs=True needs "
                                          r"actor_rollout_ref.rollout.calculate_log_probs=True"):
        load_config("ppo_trainer", [A + "rollout.name=hf", A + "actor.use_rollout_log_probs=True"])
