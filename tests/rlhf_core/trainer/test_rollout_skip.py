"""``skip.rollout.steps`` and ``skip.rollout.action`` (verl 0.9's SkipManager, rlhf_core/trainer/rollout_control.py)
with the fake worker groups of test_trainer_ppo."""
from __future__ import annotations

import os

import pytest
import torch

from tests.rlhf_core.trainer.test_trainer_keys_effect import IndexActor, _fit, _steps

from rlhf_core.config import ConfigError, load_config
from rlhf_core.protocol import Batch
from rlhf_core.trainer.rollout_control import RolloutDump


class ResponseActor(IndexActor):
    """Records the responses each update trained on."""

    def __init__(self, log):
        super().__init__(log)
        self.trained = []

    def update_actor(self, batch):
        self.trained.append(batch["responses"].clone())
        return super().update_actor(batch)


def _skip_config(tmp_path, steps, action="cache", n_steps=3):
    cfg = _steps(tmp_path, n_steps)
    cfg.skip.rollout.enable = True
    cfg.skip.rollout.dump_dir = str(tmp_path / "dump")
    cfg.skip.rollout.steps = steps
    cfg.skip.rollout.action = action
    return cfg


def _dumped(tmp_path, step):
    path = tmp_path / "dump" / "e_p_GBS2__N2" / f"step_{step}.pt"  # experiment e, project p, batch 2, n 2
    return torch.load(path, weights_only=False)["tensors"]["responses"]


def test_steps_dump_and_replay_only_the_listed_steps(tmp_path):
    cfg = _skip_config(tmp_path, [2])
    first = ResponseActor([])
    _fit(cfg, first)
    # steps [2]: only step 2 is dumped, steps 1 and 3 generate and dump nothing
    assert sorted(os.listdir(tmp_path / "dump" / "e_p_GBS2__N2")) == ["step_2.pt"]
    assert len(first.indices) == 3
    # a second run whose engine answers otherwise (theta shifted): steps 1 and 3 generate, step 2 replays
    cfg.trainer.default_local_dir = str(tmp_path / "ckpt2")
    second = ResponseActor([])
    second.theta = 5.0
    _fit(cfg, second)
    assert second.indices == [first.indices[0], first.indices[2]]  # the prompts of steps 1 and 3 only
    assert torch.equal(second.trained[1], _dumped(tmp_path, 2))  # step 2 trained the dump, byte-equal
    assert torch.equal(second.trained[1], first.trained[1])
    assert not torch.equal(second.trained[0], first.trained[0])  # step 1 was generated anew by the other engine


def test_repeat_replays_the_nearest_dump_at_every_listed_step(tmp_path):
    first = ResponseActor([])
    _fit(_skip_config(tmp_path, [2]), first)  # one dump, of step 2
    cfg = _skip_config(tmp_path, [], action="repeat", n_steps=3)
    cfg.trainer.default_local_dir = str(tmp_path / "ckpt2")
    second = ResponseActor([])
    second.theta = 5.0
    _fit(cfg, second)
    # step 1: no earlier dump -> the earliest later one (2); step 2: its own; step 3: the latest earlier one (2)
    assert second.indices == []  # the engine never generated a training batch
    for trained in second.trained:
        assert torch.equal(trained, _dumped(tmp_path, 2))
    # without any dump, repeat generates and dumps the step (verl: "run generation and dump as usual")
    fresh = _skip_config(tmp_path / "fresh", [], action="repeat", n_steps=1)
    actor = ResponseActor([])
    _fit(fresh, actor)
    assert len(actor.indices) == 1 and os.listdir(tmp_path / "fresh" / "dump" / "e_p_GBS2__N2") == ["step_1.pt"]


def test_source_step_follows_verls_find_latest_step(tmp_path):
    # verl RolloutSkip._find_latest_step: own step, else max step < current, else min step > current, else none
    cache = RolloutDump(str(tmp_path), "e", "p", 2, 2)
    repeat = RolloutDump(str(tmp_path), "e", "p", 2, 2, action="repeat")
    listed = RolloutDump(str(tmp_path), "e", "p", 2, 2, steps=[5, 6], action="repeat")
    assert repeat.source_step(3) is None  # nothing dumped yet
    one = Batch({"responses": torch.zeros(1, 2, dtype=torch.long)})
    for step in (5, 20):
        repeat.dump(step, one)
    assert listed.dump(7, one) is None and repeat.dumped_steps() == [5, 20]  # 7 is not listed: not dumped
    assert [repeat.source_step(s) for s in (5, 12, 3, 25)] == [5, 5, 5, 20]
    assert [cache.source_step(s) for s in (5, 12)] == [5, None]  # cache: the step's own dump only
    assert [listed.source_step(s) for s in (5, 6, 12)] == [5, 5, None]  # 12 is not listed: generated
    with pytest.raises(ValueError, match="skip.rollout: .*step_5.pt holds 1 responses, this step generates 4"):
        repeat.load(12, 4)


@pytest.mark.parametrize("override, message", [
    ("skip.rollout.action=repeet", r"skip.rollout.action='repeet' is not one of \['cache', 'repeat'\]"),
    ("skip.rollout.steps=[1,x]", r"skip.rollout.steps=\[1, 'x'\]: steps must be integers, got \['x'\]"),
])
def test_bad_steps_or_action_fail_when_the_config_loads(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("ppo_trainer", [override])
