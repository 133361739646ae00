"""Per-response parameter versions (``min_global_steps`` / ``max_global_steps``) and verl's staleness metrics from
them (rlhf_core/trainer/response_versions.py), on hand-built batches. The drivers' runs that carry them:
tests/rlhf_core/trainer/test_fully_async.py (a forced sync inside a partial rollout) and test_one_step_off_policy.py."""
from __future__ import annotations

import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.trainer.response_versions import MAX_KEY, MIN_KEY, segment_versions, tag_versions, version_metrics


def _batch(n: int) -> Batch:
    return Batch({"responses": torch.zeros((n, 3), dtype=torch.long)})


def test_a_sync_inside_a_partial_rollout_gives_start_k_and_end_k_plus_1():
    # segments ran under versions 4 (the start) and 5 (after the forced sync); rows 1 and 3 were still open at the
    # sync and ended in segment 1, rows 0 and 2 ended in segment 0
    lo, hi = segment_versions([4, 5], torch.tensor([0, 1, 0, 1]))
    assert lo.tolist() == [4, 4, 4, 4] and hi.tolist() == [4, 5, 4, 5]
    batch = tag_versions(_batch(4), lo, hi)
    assert batch[MIN_KEY].dtype == batch[MAX_KEY].dtype == torch.long
    # trained at version 5: spans max-min+1 = [1, 2, 1, 2]; staleness 5-max = [1, 0, 1, 0]; worst 5-min = 1 each;
    # partial = rows with max != min = 2 of 4; stale (5 - max >= 1) = rows 0 and 2
    metrics, stale = version_metrics(batch, current=5, partial=True)
    assert metrics == {
        "training/off_policy/trajectory_spans/mean": 1.5, "training/off_policy/trajectory_spans/max": 2.0,
        "training/off_policy/trajectory_spans/min": 1.0,
        "training/off_policy/trajectory_staleness/mean": 0.5, "training/off_policy/trajectory_staleness/max": 1.0,
        "training/off_policy/trajectory_staleness/min": 0.0,
        "training/off_policy/trajectory_staleness_worst/mean": 1.0,
        "training/off_policy/trajectory_staleness_worst/max": 1.0,
        "training/off_policy/trajectory_staleness_worst/min": 1.0,
        "fully_async/partial/total_partial_num": 2, "fully_async/partial/partial_ratio": 0.5,
        "fully_async/partial/max_partial_span": 1}
    assert stale == 2


def test_one_version_per_batch_and_three_segments():
    # one-step driver: the whole batch from version 2, trained at 3: staleness 1 everywhere, span 1, all stale
    metrics, stale = version_metrics(tag_versions(_batch(3), 2), current=3, partial=False)
    assert metrics["training/off_policy/trajectory_staleness/mean"] == 1.0 and stale == 3
    assert metrics["training/off_policy/trajectory_spans/max"] == 1.0
    assert not any(k.startswith("fully_async/partial") for k in metrics)
    # two syncs in one rollout (segments under 0, 1, 2): last segments [2, 0, 1] → max [2, 0, 1]; trained at 2
    lo, hi = segment_versions([0, 1, 2], torch.tensor([2, 0, 1]))
    metrics, stale = version_metrics(tag_versions(_batch(3), lo, hi), current=2, partial=True)
    assert metrics["fully_async/partial/max_partial_span"] == 2
    assert metrics["fully_async/partial/total_partial_num"] == 2
    assert metrics["training/off_policy/trajectory_staleness/max"] == 2.0  # row 1: 2 - 0
    assert metrics["training/off_policy/trajectory_staleness/min"] == 0.0  # row 0: 2 - 2
    assert stale == 2  # rows 1 and 2
    assert version_metrics(_batch(2), current=1, partial=True) == ({}, 0)  # untagged: nothing to report


def test_bad_versions_are_refused_naming_the_row():
    with pytest.raises(ValueError, match=r"row 1 ends at version 2 before it starts \(3\)"):
        tag_versions(_batch(2), torch.tensor([1, 3]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"\(3,\) / \(3,\) for a batch of 2 rows"):
        tag_versions(_batch(2), torch.tensor([1, 1, 1]))


def test_overlap_clock_counts_the_update_seconds_a_generation_ran(monkeypatch):
    from rlhf_core.trainer import overlap_clock

    now = [0.0]
    monkeypatch.setattr(overlap_clock.time, "perf_counter", lambda: now[0])
    clock = overlap_clock.OverlapClock()
    a = clock.start()  # generation A: 1 .. 4 (opened at 0 → moved below)
    a[0] = 1.0
    now[0] = 4.0
    clock.stop(a)
    now[0] = 6.0
    clock.start()  # generation B: from 6, still running
    # update [3, 8]: A covers 3..4 (1 s), B covers 6..8 (2 s, running: counted up to 8)
    assert clock.overlap(3.0, 8.0) == 3.0
    # update [5, 5.5]: between the two generations, nothing ran
    assert clock.overlap(5.0, 5.5) == 0.0
    # A ended before 5: dropped by the previous call; B alone covers [9, 10]
    assert clock.overlap(9.0, 10.0) == 1.0 and len(clock._spans) == 1
