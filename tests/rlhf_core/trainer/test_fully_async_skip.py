"""``skip.async_rollout`` (rlhf_core/trainer/fully_async_skip.py): the fully async rollouter's per-prompt dump/replay,
with a fake rollout group (the FakeActor engine of test_trainer_ppo) and the real rollouter thread and queue."""
from __future__ import annotations

import copy
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.rlhf_core.trainer.test_one_step_off_policy import _config
from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, FakeActor, make_dataset, reward_fn

from rlhf_core.config import ConfigError
from rlhf_core.protocol import Batch
from rlhf_core.trainer.fully_async_skip import AsyncRolloutDump, generate_with_dumps

FA = ("async_training.mode=fully_async", "async_training.partial_rollout=False",
      "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1")


class _EngineGroup:
    """A rollout group whose engine is FakeActor (responses a function of theta and the prompts); records the
    dataset index of every prompt it generated for."""

    def __init__(self, theta):
        self.actor, self.asked = FakeActor([]), []
        self.actor.theta = theta

    def execute_dp(self, method, batch):
        self.asked += [int(i) for i in batch["index"][::2]]  # n = 2 rows per prompt
        return self.actor.generate_sequences(batch)

    def shutdown(self):
        pass


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The fully async config of the runs below (loaded once: a config load is most of a run here)."""
    return _config(tmp_path_factory.mktemp("fa"), *FA, "skip.async_rollout.enable=True")


def _steps_of(base, dump_dir, theta, steps=(), action="cache"):
    """The three step batches (2 prompts × n=2 each) the rollouter queues, and the prompts the engine saw."""
    from rlhf_core.trainer.fully_async import FullyAsyncTrainer

    cfg = copy.deepcopy(base)
    cfg.skip.async_rollout.merge_with({"dump_dir": str(dump_dir), "steps": list(steps), "action": action})
    trainer = FullyAsyncTrainer(cfg, DecodeTok(), lambda c: {}, reward_fn, None, make_dataset(6))
    engine = _EngineGroup(theta)
    trainer.wgs, trainer._executor = {"rollout": engine}, ThreadPoolExecutor(max_workers=1)
    batches = []
    try:
        stream = trainer.train_batches(1, 3)
        for _ in range(3):
            batches.append(next(stream)[1])
            trainer.queue.reset_staleness()  # what the weight sync after each update does
    finally:
        trainer.shutdown()
    return batches, engine.asked


def test_listed_feed_indices_are_dumped_then_replayed_byte_equal(base, tmp_path):
    first, asked = _steps_of(base, tmp_path / "dump", 0.0, [2, 5])
    folder = next((tmp_path / "dump").iterdir())  # <experiment>_<project>_GBS1__N2
    assert folder.name.endswith("_GBS1__N2")  # one prompt × rollout.n = 2 per dump
    assert sorted(os.listdir(folder)) == ["step_2.pt", "step_5.pt"]  # feed indices 2 and 5 only
    order = [int(i) for b in first for i in b["index"][::2]]  # the prompts in feed order (feed index = position + 1)
    assert sorted(asked) == sorted(order) and len(order) == 6
    # a second run whose engine answers otherwise (theta 5): it is asked for feed indices 1, 3, 4, 6 only
    second, asked2 = _steps_of(base, tmp_path / "dump", 5.0, [2, 5])
    assert asked2 == [order[0], order[2], order[3], order[5]]
    rows = lambda batches, feed: torch.cat([b["responses"] for b in batches])[2 * (feed - 1): 2 * feed]  # noqa: E731
    for feed in (2, 5):  # replayed: the dumped responses, byte-equal, under the current prompt's uid and index
        dumped = torch.load(folder / f"step_{feed}.pt", weights_only=False)["tensors"]["responses"]
        assert torch.equal(rows(second, feed), dumped) and torch.equal(dumped, rows(first, feed))
    assert not torch.equal(rows(second, 1), rows(first, 1))  # generated anew by the other engine
    assert [int(i) for b in second for i in b["index"][::2]] == order  # the same prompts in the same places
    # replayed rows carry the version the rollout group holds, as the generated ones (-1: this fake group never
    # loaded weights)
    assert second[0]["min_global_steps"].tolist() == second[0]["max_global_steps"].tolist() == [-1] * 4


def test_repeat_replays_the_nearest_dumped_feed_index(base, tmp_path):
    _steps_of(base, tmp_path / "dump", 0.0, [3])  # one dump: feed index 3
    second, asked = _steps_of(base, tmp_path / "dump", 5.0, action="repeat")
    assert asked == []  # every prompt replays: 1, 2 -> 3 (the earliest later), 3 -> 3, 4..6 -> 3 (the latest earlier)
    folder = next((tmp_path / "dump").iterdir())
    dumped = torch.load(folder / "step_3.pt", weights_only=False)["tensors"]["responses"]
    assert all(torch.equal(b["responses"][r:r + 2], dumped) for b in second for r in (0, 2))


def test_generate_with_dumps_keeps_prompt_order_and_the_prompts_own_columns(tmp_path):
    dumps = AsyncRolloutDump(str(tmp_path), "e", "p", 1, 2)
    prompts = Batch({"input_ids": torch.tensor([[1], [2], [3]])}, {"uid": __import__("numpy").array(["a", "b", "c"],
                                                                                                    dtype=object)})

    def engine(todo):  # responses = 10 × the prompt id, n = 2 rows per prompt
        rows = todo.repeat_interleave(2)
        out = rows.merge(Batch({"responses": rows["input_ids"] * 10}))
        return [out.index(slice(i, i + 2)) for i in range(0, len(out), 2)]

    groups = generate_with_dumps(dumps, prompts, [1, 2, 3], 2, 1, lambda: 0, engine)
    assert [g["responses"][:, 0].tolist() for g in groups] == [[10, 10], [20, 20], [30, 30]]
    # the next run's engine answers 7 everywhere; feed index 2 is replayed (20), with the new prompt's uid "y"
    prompts.non_tensors["uid"][:] = ["x", "y", "z"]
    seen = []
    groups = generate_with_dumps(dumps, prompts.index([1]), [2], 2, 4, lambda: 3,
                                 lambda todo: seen.append(len(todo)) or [])
    assert seen == [] and groups[0]["responses"][:, 0].tolist() == [20, 20]
    assert groups[0].non_tensors["uid"].tolist() == ["y", "y"] and groups[0]["max_global_steps"].tolist() == [3, 3]
    assert groups[0].meta["global_steps"] == 4
    with pytest.raises(ValueError, match="skip.async_rollout: .*step_1.pt holds 2 responses, this step generates 3"):
        dumps.load(1, 3)


def test_bad_async_rollout_steps_or_action_fail_when_the_config_loads(tmp_path):
    with pytest.raises(ConfigError, match=r"skip.async_rollout.steps=\[True\]: steps must be integers"):
        _config(tmp_path, *FA, "skip.async_rollout.steps=[true]")
    with pytest.raises(ConfigError, match=r"skip.async_rollout.action='load' is not one of \['cache', 'repeat'\]"):
        _config(tmp_path, *FA, "skip.async_rollout.action=load")
    with pytest.raises(ConfigError, match=r"skip.async_rollout.enable=True dumps/replays the fully asynchronous "
                                          r"rollouter's prompts, but async_training.mode=on_policy"):
        _config(tmp_path, "skip.async_rollout.enable=True")
    with pytest.raises(ConfigError, match=r"skip.rollout_tq.enable=True is not supported yet \(the V1 trainer's "
                                          r"rollout through TransferQueue"):
        _config(tmp_path, "skip.rollout_tq.enable=True")
