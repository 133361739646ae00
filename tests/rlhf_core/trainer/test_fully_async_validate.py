"""``async_training.use_trainer_do_validate`` (verl's trainer-side validation of the fully async trainer): the
fully async driver with fake actor and rollout groups (FakeActor of test_trainer_ppo: responses a function of
its ``theta``), so which group validated, with which weights, is visible."""
from __future__ import annotations

import pytest

from tests.rlhf_core.trainer.test_one_step_off_policy import _config
from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, FakeActor, FakeGroup, make_dataset, reward_fn

FA = ("async_training.mode=fully_async", "async_training.partial_rollout=False",
      "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=2",
      "trainer.total_training_steps=2", "trainer.test_freq=1")


class Engine(FakeActor):
    """FakeActor with the weight push of the off-policy drivers (``theta`` is its weights); records the theta of
    every validation generation."""

    def __init__(self):
        super().__init__([])
        self.validated = []

    def actor_weights(self):
        return {"theta": self.theta}

    def load_rollout_weights(self, weights):
        self.theta = weights["theta"]

    def stream_supported(self):
        return False  # no continuous-batching session: the rollouter takes its sub-batch path

    def generate_sequences(self, batch):
        if batch.meta.get("validate"):
            self.validated.append(round(self.theta, 6))
        return super().generate_sequences(batch)


def _fit(tmp_path, *extra):
    from rlhf_core.trainer.fully_async import FullyAsyncTrainer

    actor, rollout = Engine(), Engine()
    groups = {"actor_rollout": FakeGroup(actor, world_size=1), "rollout": FakeGroup(rollout, world_size=1)}
    thetas = []
    update = actor.update_actor

    def recorded_update(batch):  # the actor's weights after each update
        out = update(batch)
        thetas.append(round(actor.theta, 6))
        return out

    actor.update_actor = recorded_update
    cfg = _config(tmp_path, *FA, *extra)
    cfg.actor_rollout_ref.model.path = str(tmp_path / "no_model")  # a local path: the MFU metric asks no hub
    trainer = FullyAsyncTrainer(cfg, DecodeTok(), lambda c: dict(groups), reward_fn,
                                reward_fn, make_dataset(4), make_dataset(2))
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return actor, rollout, thetas


def test_trainer_side_validation_uses_the_actors_current_weights(tmp_path):
    # trigger_parameter_sync_step=2: after update 1 the rollout group still holds version 0 (theta 0), the actor
    # holds theta_1 = 0.1 × Σ|adv| + 0.01 > 0; validation after steps 1 and 2 (test_freq=1)
    actor, rollout, thetas = _fit(tmp_path / "trainer", "async_training.use_trainer_do_validate=True")
    assert rollout.validated == []  # the rollouter's group never validated
    assert actor.validated == thetas and thetas[0] > 0  # each validation with the weights of the update before it
    # default (False): the rollout group validates with the weights it holds: version 0 after step 1, then the
    # weights pushed after update 2 (the sync comes before the step's validation)
    actor, rollout, thetas = _fit(tmp_path / "rollout")
    assert actor.validated == [] and rollout.validated == [0.0, thetas[1]]


def test_trainer_side_validation_needs_the_fully_async_trainer(tmp_path):
    from rlhf_core.config import ConfigError

    with pytest.raises(ConfigError, match=r"use_trainer_do_validate=True moves .* async_training.mode="
                                          r"one_step_off_policy: set async_training.mode=fully_async"):
        _config(tmp_path, "async_training.mode=one_step_off_policy", "async_training.use_trainer_do_validate=True")
