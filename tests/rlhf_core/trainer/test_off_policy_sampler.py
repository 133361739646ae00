"""verl 0.9's v1 sampler rule (``trainer.v1.sampler.max_off_policy_threshold`` / ``max_off_policy_strategy``) on the
fully async driver under ``trainer.v1.trainer_mode=separate_async`` (rlhf_core/trainer/off_policy_sampler.py).

Fast: the rule on hand-made versions; the driver's eviction on hand-made groups (the regeneration stubbed).
Slow: a 3-step run whose rollouter is held two loader batches ahead: ``drop`` with threshold 1 evicts exactly the
groups of span 2 and 3 and trains only span-1 groups; ``wait`` trains them as they are; ``drop`` again with
``partial_rollout=True`` (verl's default) on the continuous rollouter."""
from __future__ import annotations

import time

import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.trainer.fully_async_stream import Group
from rlhf_core.trainer.off_policy_sampler import eviction_metrics, spans, stale_groups
from tests.rlhf_core.trainer.test_one_step_off_policy import _config
from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, make_dataset, reward_fn

SA = ("trainer.v1.trainer_mode=separate_async", "trainer.v1.separate_async.parameter_sync_step=1",
      "async_training.partial_rollout=False")


def test_threshold_two_drops_exactly_the_groups_of_span_three_and_more():
    # trained at version 3; groups whose first tokens came from versions 3, 2, 1, 0, 2: spans 3-v+1 = 1, 2, 3, 4, 2
    versions = [3, 2, 1, 0, 2]
    assert spans(versions, 3) == [1, 2, 3, 4, 2]
    assert stale_groups(versions, 3, 2, "drop") == [2, 3]  # span > 2
    assert stale_groups(versions, 3, 1, "drop") == [1, 2, 3, 4]  # only same-version groups stay
    assert stale_groups(versions, 3, 8, "drop") == []  # verl's default threshold: none here
    assert stale_groups(versions, 3, 1, "wait") == []  # wait evicts nothing
    # verl's metrics over the evicted spans 3 and 4
    assert eviction_metrics([3, 4]) == {"training/off_policy/evicted_samples": 2,
                                        "training/off_policy/evicted_samples_staleness/mean": 3.5,
                                        "training/off_policy/evicted_samples_staleness/max": 4,
                                        "training/off_policy/evicted_samples_staleness/min": 3}
    assert eviction_metrics([]) == {"training/off_policy/evicted_samples": 0}
    with pytest.raises(ValueError, match=r"max_off_policy_threshold=0 must be an integer >= 1"):
        stale_groups(versions, 3, 0, "drop")
    with pytest.raises(ValueError, match=r"max_off_policy_strategy='skip' must be 'drop' or 'wait'"):
        stale_groups(versions, 3, 2, "skip")


def _group(uid: str, version: int) -> Group:
    rows = Batch({"min_global_steps": torch.full((2,), version), "max_global_steps": torch.full((2,), version)},
                 {"uid": [uid, uid]})
    return Group(rows, 0, 0, 0.0, None, Batch({"input_ids": torch.tensor([[1, 2]])}, {"uid": [uid]}))


def test_the_driver_regenerates_exactly_the_stale_groups(tmp_path):
    from rlhf_core.trainer.fully_async import FullyAsyncTrainer

    cfg = _config(tmp_path, *SA, "trainer.v1.sampler.max_off_policy_threshold=2")
    trainer = FullyAsyncTrainer(cfg, DecodeTok(), lambda c: {}, reward_fn, None, make_dataset(6))
    try:
        assert trainer.v1_sampler == (2, "drop")
        trainer.param_version = 3
        asked = []

        def regenerate(prompts):  # stands in for the rollout group: version 3 groups of the same prompts
            asked.extend(p.non_tensors["uid"][0] for p in prompts)
            return [_group(p.non_tensors["uid"][0], 3).batch for p in prompts]

        trainer._regenerate = regenerate
        groups = [_group(u, v) for u, v in zip("abcde", [3, 2, 1, 0, 2])]
        out, versions, metrics = trainer._evict_stale(groups, [3, 2, 1, 0, 2])
        assert asked == ["c", "d"]  # spans 3 and 4 > 2
        assert versions == [3, 2, 3, 3, 2]
        assert [g.batch.non_tensors["uid"][0] for g in out] == list("abcde")  # the step's order kept
        assert out[0] is groups[0] and out[2] is not groups[2]
        assert metrics["training/off_policy/evicted_samples"] == 2
        assert metrics["training/off_policy/evicted_samples_staleness/mean"] == 3.5
        assert trainer._evict_stale(groups[:2], [3, 2]) == (groups[:2], [3, 2], {})  # nothing stale
    finally:
        trainer.shutdown()
    # not separate_async (plain async_training.mode=fully_async, verl's fully_async_policy): no v1 sampler
    plain = FullyAsyncTrainer(_config(tmp_path, "async_training.mode=fully_async"), DecodeTok(), lambda c: {},
                              reward_fn, None, make_dataset(6))
    try:
        assert plain.v1_sampler is None
    finally:
        plain.shutdown()
    with pytest.raises(Exception, match=r"trainer.v1.sampler.max_off_policy_threshold=0 must be an integer >= 1"):
        _config(tmp_path, *SA, "trainer.v1.sampler.max_off_policy_threshold=0")
    with pytest.raises(Exception, match=r"max_off_policy_strategy.*'skip'"):
        _config(tmp_path, *SA, "trainer.v1.sampler.max_off_policy_strategy=skip")


def _held_ahead_run(tmp_path, tiny_model_dir, monkeypatch, strategy, *extra):
    """3 steps of 2 prompts, num_warmup_batches=2 (the rollouter may run 2 loader batches ahead), threshold 1; step
    1's update waits until the rollouter has queued loader batches 2 and 3 (both from version 0). ``extra``:
    more overrides. Returns (per-step metrics, the batch each step trained, the trainer)."""
    from rlhf_core.trainer.fully_async import FullyAsyncTrainer
    from tests.rlhf_core.trainer.test_fully_async import _run

    update, trained = FullyAsyncTrainer.update_actor, {}

    def held(self, batch):
        if self.global_steps == 1:
            deadline = time.monotonic() + 120
            while self.queue.stats()["fully_async/monitor/queue/mq_queue_size"] < 4:
                assert time.monotonic() < deadline, "the rollouter did not queue two batches ahead"
                time.sleep(0.05)
        trained[self.global_steps] = batch
        return update(self, batch)

    monkeypatch.setattr(FullyAsyncTrainer, "update_actor", held)
    torch.manual_seed(0)
    cfg = _config(tmp_path, *SA, "trainer.v1.separate_async.num_warmup_batches=2",
                  "trainer.v1.sampler.max_off_policy_threshold=1",
                  f"trainer.v1.sampler.max_off_policy_strategy={strategy}", *extra)
    steps, _, trainer = _run(cfg, tiny_model_dir, True)
    return steps, trained, trainer


@pytest.mark.slow
def test_drop_evicts_the_groups_generated_ahead_and_wait_trains_them(tiny_model_dir, tmp_path, monkeypatch):
    steps, trained, _ = _held_ahead_run(tmp_path / "drop", tiny_model_dir, monkeypatch, "drop")
    # loader batches 2 and 3 came from version 0; trained at versions 1 and 2 their spans are 2 and 3 > 1: both
    # groups of each are evicted and generated again by the version that trains them
    assert [steps[s].get("training/off_policy/evicted_samples", 0) for s in (1, 2, 3)] == [0, 2, 2]
    assert [steps[s].get("training/off_policy/evicted_samples_staleness/max") for s in (2, 3)] == [2, 3]
    for s in (1, 2, 3):
        assert trained[s]["min_global_steps"].tolist() == [s - 1] * 4, s  # every trained response: span 1
        assert steps[s]["fully_async/staleness"] == 0
    wsteps, wtrained, _ = _held_ahead_run(tmp_path / "wait", tiny_model_dir, monkeypatch, "wait")
    assert all("training/off_policy/evicted_samples" not in wsteps[s] for s in (1, 2, 3))
    assert [wtrained[s]["min_global_steps"].tolist() for s in (2, 3)] == [[0] * 4, [0] * 4]  # trained as queued
    assert [wsteps[s]["fully_async/staleness"] for s in (1, 2, 3)] == [0, 1, 2]


@pytest.mark.slow
def test_drop_with_partial_rollouts_regenerates_on_the_continuous_path(tiny_model_dir, tmp_path, monkeypatch):
    # verl's separate_async is partial by default: the same held-ahead run with partial_rollout=True, the rollouter
    # batching continuously (hf engine, no agent loop). Loader batches 2 and 3 (version 0) reach steps 2 and 3 with
    # spans 2 and 3 > 1: evicted, their prompts generated again in one plain call (no partial segments) by the
    # version that trains them, so both their first and their last tokens carry that version
    steps, trained, trainer = _held_ahead_run(tmp_path, tiny_model_dir, monkeypatch, "drop",
                                              "async_training.partial_rollout=True")
    assert trainer.partial and trainer._stream_active  # the continuous path with partial rollouts
    assert [steps[s].get("training/off_policy/evicted_samples", 0) for s in (1, 2, 3)] == [0, 2, 2]
    assert [steps[s].get("training/off_policy/evicted_samples_staleness/max") for s in (2, 3)] == [2, 3]
    for s in (1, 2, 3):
        assert trained[s]["min_global_steps"].tolist() == [s - 1] * 4, s
        assert trained[s]["max_global_steps"].tolist() == [s - 1] * 4, s
