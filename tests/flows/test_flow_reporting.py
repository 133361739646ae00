"""One line per PPO step from the metrics file, the evaluation table, stage headlines."""

from __future__ import annotations

import datetime as dt
import json

from conftest_services import *  # noqa: F401,F403
from flows import artifacts
from tasks.progress import StepProgress, step_line


def _log(path, step, **metrics):
    with open(path, "a") as fh:
        for name, value in metrics.items():
            fh.write(json.dumps({"step": step, "name": name.replace("__", "/"), "value": value}) + "\n")


def test_step_progress_prints_each_finished_step_once(tmp_path, capsys):
    f = tmp_path / "segment_1.jsonl"
    progress = StepProgress(f, total_steps=4, artifact_id=None)
    progress.poll()  # no file yet
    _log(f, 1, critic__score__mean=0.25, response_length__mean=40.0)
    progress.poll()  # step 1 has no timing_s/step and no later step: maybe still being written
    assert capsys.readouterr().out == ""
    _log(f, 1, timing_s__step=3.25)
    _log(f, 2, critic__score__mean=0.5)
    progress.poll()
    progress.poll()
    assert capsys.readouterr().out.splitlines() == [
        "ppo step 1/4: score 0.250, response length 40.0, 3.2 s"]
    progress.finish()  # the segment returned: step 2 is complete
    assert capsys.readouterr().out.splitlines() == ["ppo step 2/4: score 0.500"]
    assert step_line(3, 4, {}) == "ppo step 3/4:"


def test_evaluation_table_one_row_per_data_source():
    # metric names with slashes (reward/num_errors, pass@k/num_prompts) and sources with slashes (openai/gsm8k)
    rows = artifacts.evaluation_table({"test_score/openai/gsm8k": 0.25, "pass@1/openai/gsm8k": 0.2,
                                       "pass@1/num_prompts/openai/gsm8k": 8.0,
                                       "reward/num_errors/openai/gsm8k": 1.0, "test_score/math": 0.5})
    assert rows == [{"data_source": "math", "test_score": 0.5},
                    {"data_source": "openai/gsm8k", "test_score": 0.25, "pass@1": 0.2, "pass@1/num_prompts": 8.0,
                     "reward/num_errors": 1.0}]


def test_log_stage_names_duration_and_headline(results_store, capsys):
    t0 = dt.datetime(2026, 11, 1, 2, 0, 0)
    results_store.index_run("r1", "f1", "ppo", "FINISHED", t0, t0 + dt.timedelta(seconds=90), "{}", name="ppo")
    results_store.register_metrics([{"step": 1, "critic/score/mean": 0.1}, {"step": 2, "critic/score/mean": 0.3,
                                     "actor/entropy": 2.0}], "r1", "ppo")
    line = artifacts.log_stage(results_store, "ppo", "r1")
    # the last step's score; entropy is not a headline figure
    assert line == "stage ppo: FINISHED, 90.0 s, MLflow run r1; critic/score/mean 0.3"
    assert capsys.readouterr().out.strip() == line
