"""Prompt-by-prompt streaming of the fully async driver (rlhf_core/trainer/fully_async_stream.py): sub-batch sizes,
groups, a step assembled from groups of several versions, and the queue under a real rollouter thread that puts
one group at a time (every prompt trained once, steps = loader batches, the lag within the bound). No Ray, no
model: the driver's slow test is tests/rlhf_core/trainer/test_fully_async.py::test_streaming_mixes_versions_in_a_step.
"""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.trainer.fully_async_queue import RolloutQueue, max_staleness
from rlhf_core.trainer.fully_async_stream import (Group, assemble_step, queue_unit, split_groups, sub_batch_bounds,
                                                  sub_batch_size)


def test_sub_batch_size_is_verls_max_concurrent_samples_within_one_loader_batch():
    # verl: max_concurrent_samples = replicas × concurrent_samples_per_replica; here capped at one step's prompts
    assert sub_batch_size(1, 16, 2) == 2  # verl's default 16 per replica: the whole loader batch (today's chunk)
    assert sub_batch_size(2, 1, 6) == 2  # 2 ranks × 1
    assert sub_batch_size(1, 1, 4) == 1  # one prompt at a time
    assert sub_batch_size(8, 16, 24) == 24
    with pytest.raises(ValueError, match="concurrent_samples_per_replica=0"):
        sub_batch_size(1, 0, 4)
    assert sub_batch_bounds(6, 4) == [(0, 4), (4, 6)]
    assert sub_batch_bounds(4, 1) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert sub_batch_bounds(2, 16) == [(0, 2)]
    # sub-batches of 4 and the remainder 2 are multiples of gcd(4, 6) = 2
    assert queue_unit(4, 6) == 2 and queue_unit(1, 4) == 1 and queue_unit(2, 2) == 2


def _generated(prompts: int, n: int, version: int, uid0: int = 0) -> Batch:
    """A generated sub-batch: ``prompts`` × ``n`` rows, row r's attention mask has r % 3 + 1 ones."""
    rows = prompts * n
    mask = torch.zeros(rows, 4, dtype=torch.long)
    for r in range(rows):
        mask[r, : r % 3 + 1] = 1
    uids = np.array([f"u{uid0 + r // n}" for r in range(rows)], dtype=object)
    ver = torch.full((rows,), version, dtype=torch.long)
    return Batch({"attention_mask": mask, "row": torch.arange(rows), "min_global_steps": ver, "max_global_steps": ver},
                 {"uid": uids}, {"temperature": 1.0, "global_token_num": mask.sum(-1).tolist()})


def test_groups_of_two_versions_make_one_step_in_queue_order():
    # loader batch 0 of 3 prompts × n=2, cut into sub-batches of 2 and 1 prompts; a sync between them: the first
    # two groups come from version 0, the third from version 1
    first, second = split_groups(_generated(2, 2, 0), 2), split_groups(_generated(1, 2, 1, uid0=2), 2)
    assert [len(g) for g in first + second] == [2, 2, 2]
    assert [g.non_tensors["uid"].tolist() for g in first] == [["u0", "u0"], ["u1", "u1"]]
    # per-row meta follows the rows: rows 2, 3 of the first sub-batch have 3 and 1 ones
    assert first[1].meta["global_token_num"] == [3, 1] and first[1].meta["temperature"] == 1.0
    groups = [Group(first[0], 0, 0, 0.0, "after-0"), Group(first[1], 0, 0, 1.5, "after-0"),
              Group(second[0], 0, 0, 0.25, "after-0")]
    batch, epoch, position, seconds = assemble_step(groups, 3)
    assert batch["row"].tolist() == [0, 1, 2, 3, 0, 1]  # queue order, each group whole
    assert batch["min_global_steps"].tolist() == [0, 0, 0, 0, 1, 1]
    # global_token_num recomputed over the 6 rows (not the first group's 2): 1, 2, 3, 1 then 1, 2
    assert batch.meta["global_token_num"] == [1, 2, 3, 1, 1, 2]
    assert (epoch, position, seconds) == (0, "after-0", 1.75)  # the sub-batches' seconds: 1.5 + 0.25


def test_a_step_refuses_groups_of_two_loader_batches_or_too_few():
    a, b = split_groups(_generated(2, 2, 0), 2)
    with pytest.raises(RuntimeError, match=r"groups of loader batches \[0, 1\]"):
        assemble_step([Group(a, 0, 0, 0.0, None), Group(b, 0, 1, 0.0, None)], 2)
    with pytest.raises(RuntimeError, match="ended inside a step: 1 of 2 groups"):
        assemble_step([Group(a, 0, 0, 0.0, None)], 2)
    with pytest.raises(ValueError, match="not whole groups of rollout.n=2"):
        split_groups(_generated(3, 1, 0), 2)
    mixed = _generated(2, 2, 0)
    mixed.non_tensors["uid"] = np.array(["u0", "u1", "u1", "u0"], dtype=object)  # not repeat_interleave order
    with pytest.raises(ValueError, match=r"rows 0..1 of the sub-batch are not one prompt's group"):
        split_groups(mixed, 2)


@pytest.mark.parametrize("required,k,threshold,trigger", [(2, 1, 0.5, 1), (4, 1, 1.0, 1), (6, 4, 0.5, 2),
                                                          (3, 2, 0.0, 1)])
def test_streamed_groups_train_every_prompt_once_within_the_lag_bound(required, k, threshold, trigger):
    """A rollouter thread (sub-batches of k prompts, one put per prompt) and this thread (a trainer taking
    ``required`` groups per step, a sync every ``trigger`` steps), random speeds: every prompt is trained exactly
    once, in loader order, each step is one loader batch, and each group's lag is within max_staleness with the
    queue unit gcd(k, required)."""
    rng = random.Random(11)
    q = RolloutQueue(required, threshold, trigger)
    version, lock, batches = [0], threading.Lock(), 12

    def rollouter():
        for b in range(batches):
            for lo, hi in sub_batch_bounds(required, k):
                if not q.acquire(hi - lo):
                    return
                with lock:  # the generation lock: a sync waits for the sub-batch in flight
                    v = version[0]
                    time.sleep(rng.random() * 0.001)
                for p in range(lo, hi):
                    q.put(1, v, (b, b * required + p))
        q.close()

    thread = threading.Thread(target=rollouter)
    thread.start()
    trained, lags, mixed = [], [], 0
    for step in range(1, batches + 1):
        items = [q.get() for _ in range(required)]
        assert {b for _, (b, _) in items} == {step - 1}  # one loader batch per step
        trained += [p for _, (_, p) in items]
        lags += [version[0] - v for v, _ in items]
        mixed += len({v for v, _ in items}) > 1
        time.sleep(rng.random() * 0.001)
        if step % trigger == 0:
            with lock:
                version[0] += 1
            q.reset_staleness()
    assert q.get() is None
    thread.join()
    assert trained == list(range(batches * required))  # every prompt once, in order
    bound = max_staleness(required, threshold, trigger, chunk=queue_unit(k, required))
    assert 0 <= min(lags) and max(lags) <= bound, (lags, bound)
    assert q.stats()["fully_async/count/dropped_stale_samples"] == 0
    if threshold == 0 and trigger == 1:
        assert max(lags) == 0 and mixed == 0  # M = required: nothing generated ahead of a sync
