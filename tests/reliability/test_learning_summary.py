"""The flow's learning summary compares with the step-0 validation (issue 36).

A one-segment pipeline without ``val_before_train`` printed ``step 2: 0.038 -> step 2: 0.038``: the first validation
was taken as "before" although it came after training. The rows are what the trainer's ``file`` sink writes
(``{"step", "name", "value"}``), read back from real segment files the way the flow reads them.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks import plan
from infra.run_folders import read_jsonl

ACC = "val-core/openai/gsm8k/acc/mean@1"


def _segments(run_dir: Path, *segments: list[tuple[int, float]]) -> list[dict]:
    """Write ``metrics/segment_<k>.jsonl`` files (one validation row per (step, value), plus a training metric per
    step) and read them back as :func:`flows.pipeline_steps.print_learning` does."""
    (run_dir / "metrics").mkdir(parents=True)
    for k, points in enumerate(segments, start=1):
        rows = [row for step, value in points for row in (
            {"step": step, "name": ACC, "value": value},
            {"step": step, "name": "critic/score/mean", "value": 0.9})]  # not a validation metric
        (run_dir / "metrics" / f"segment_{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [r for f in sorted((run_dir / "metrics").glob("segment_*.jsonl")) for r in read_jsonl(f)]


def test_one_segment_without_step_0_says_so_instead_of_comparing_step_2_with_itself(tmp_path):
    rows = _segments(tmp_path, [(2, 0.125)])  # 4 of 32 prompts right: validated once, at the last step
    summary = plan.validation_before_after(rows)
    assert (summary["before_step"], summary["before"], summary["gain"]) == (None, None, None)
    assert (summary["after_step"], summary["after"]) == (2, 0.125)
    line = plan.learning_line(summary, 32)
    assert line == (f"{ACC} on 32 held-out prompts: step 2: 0.125 (no step-0 validation to compare with; "
                    "trainer.val_before_train=True adds one)")
    assert "->" not in line


def test_the_baseline_is_step_0_across_segments(tmp_path):
    # val_before_train: step 0 = 0.05; segment 1 ends at step 10 (0.20), segment 2 resumes (validates step 10
    # again, the same number) and ends at step 20 (0.35): gain 0.35 - 0.05 = 0.30, not 0.35 - 0.20
    rows = _segments(tmp_path, [(0, 0.05), (10, 0.20)], [(10, 0.20), (20, 0.35)])
    summary = plan.validation_before_after(rows)
    assert (summary["before_step"], summary["after_step"]) == (0, 20)
    assert summary["gain"] == pytest.approx(0.30, abs=1e-12)
    assert plan.learning_line(summary, 64) == (
        f"{ACC} on 64 held-out prompts: step 0: 0.050 -> step 20: 0.350 (gain +0.300)")


def test_later_first_validation_is_not_a_baseline_and_only_step_0_is_not_an_after(tmp_path):
    rows = _segments(tmp_path, [(10, 0.20)], [(20, 0.35)])  # test_freq=10 without val_before_train
    line = plan.learning_line(plan.validation_before_after(rows), 64)
    assert line == (f"{ACC} on 64 held-out prompts: step 20: 0.350 (no step-0 validation to compare with; "
                    "trainer.val_before_train=True adds one; first validated at step 10: 0.200)")
    only_0 = plan.validation_before_after(_segments(tmp_path / "b", [(0, 0.05)]))  # val_only / test_freq=0
    assert (only_0["before"], only_0["after"], only_0["gain"]) == (0.05, None, None)
    assert plan.learning_line(only_0, 64) == (f"{ACC} on 64 held-out prompts: step 0: 0.050; no validation after "
                                              "training (trainer.test_freq)")
    assert plan.learning_line(None, 64) == "no validation metric was logged (trainer.val_before_train / test_freq)"


def test_the_flow_reads_the_validate_tasks_files(tmp_path, capsys):
    """Issue 33: validation is the validate task's (``metrics/validate_step_<N>.jsonl``; segments write none): the
    flow's summary compares its step-0 file with its last one."""
    from flows.pipeline_steps import print_learning

    (tmp_path / "metrics").mkdir()
    for step, value in ((0, 0.05), (10, 0.20), (20, 0.35)):
        (tmp_path / "metrics" / f"validate_step_{step}.jsonl").write_text(
            json.dumps({"step": step, "name": ACC, "value": value}) + "\n")
    (tmp_path / "metrics" / "segment_1.jsonl").write_text(
        json.dumps({"step": 10, "name": "critic/score/mean", "value": 0.9}) + "\n")
    print_learning(tmp_path, 64)
    assert capsys.readouterr().out.strip() == (
        f"{ACC} on 64 held-out prompts: step 0: 0.050 -> step 20: 0.350 (gain +0.300)")


def test_the_prompt_count_is_the_validation_files_rows_not_val_max_samples(tmp_path, capsys):
    """A user's trial: an experiment with the default ``data.val_max_samples: -1`` (all rows) printed "on -1
    held-out prompts"; the count is the rows of the prepared validation file (8 here)."""
    import pandas as pd

    from flows.pipeline_steps import print_learning

    (tmp_path / "metrics").mkdir()
    for step, value in ((0, 0.0), (2, 0.25)):
        (tmp_path / "metrics" / f"validate_step_{step}.jsonl").write_text(
            json.dumps({"step": step, "name": ACC, "value": value}) + "\n")
    val = tmp_path / "val.parquet"
    pd.DataFrame({"data_source": ["countdown"] * 8, "x": range(8)}).to_parquet(val)
    print_learning(tmp_path, -1, str(val))
    assert capsys.readouterr().out.strip() == (
        f"{ACC} on 8 held-out prompts: step 0: 0.000 -> step 2: 0.250 (gain +0.250)")
