"""pass@k never drops prompts silently: each pass@k says how many prompts it covers, and ``rlhf eval`` names the
prompts with too few responses. Numbers derived by hand below (pass@k = 1 − C(n−c, k) / C(n, k))."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

# Three prompts with 4, 2 and 1 samples; correct: 1 of 4, 2 of 2, 0 of 1.
#   pass@1: (1 − 3/4, 1, 0)               → mean (0.25 + 1 + 0) / 3 = 5/12 over 3 prompts
#   pass@2: (1 − C(3,2)/C(4,2) = 1/2, 1)  → mean 3/4 over 2 prompts (the 1-sample prompt cannot give pass@2)
#   pass@4: (1 − C(3,4)/C(4,4) = 1)       → 1 over 1 prompt
EXPECTED = {1: (5 / 12, 3), 2: (0.75, 2), 4: (1.0, 1)}


def test_validation_pass_at_k_reports_the_prompts_it_covers():
    from rlhf_core.metrics.validation import process_validation_metrics, val_metrics_to_names

    uids = ["u1"] * 4 + ["u2"] * 2 + ["u3"]
    acc = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    raw = process_validation_metrics(["d"] * 7, uids, {"acc": acc})
    for k, (value, covered) in EXPECTED.items():
        assert raw["d"]["acc"][f"pass@{k}"] == pytest.approx(value)
        assert raw["d"]["acc"][f"pass@{k}/num_prompts"] == covered
    names = val_metrics_to_names(raw)
    assert names["val-aux/d/acc/pass@4/num_prompts"] == 1.0 and names["val-aux/d/acc/pass@1/num_prompts"] == 3.0


def _responses_file(tmp_path: Path) -> str:
    # GSM8K strict scoring: "#### <truth>" is correct. Row 0: 1 of 4 right; row 1: 2 of 2; row 2: 0 of 1.
    path = tmp_path / "responses.parquet"
    pd.DataFrame({
        "data_source": ["openai/gsm8k"] * 3,
        "prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(3)],
        "responses": [["#### 5", "#### 1", "#### 2", "#### 3"], ["#### 7", "#### 7"], ["#### 0"]],
        "reward_model": [{"ground_truth": g} for g in ("5", "7", "9")],
    }).to_parquet(path)
    return str(path)


SHORT_LINE = ("2 of 3 prompts of data_source 'openai/gsm8k' have fewer than 4 responses and are left out of pass@4 "
              "(see pass@<k>/num_prompts/openai/gsm8k): row 1 (2), row 2 (1)")


def test_eval_metrics_cover_and_name_short_prompts(tmp_path, caplog):
    from rlhf_core.config import load_config
    from rlhf_core.trainer.evaluation import run_evaluation

    cfg = load_config("evaluation", [f"data.path={_responses_file(tmp_path)}", "ray_init.num_cpus=1"])
    with caplog.at_level("WARNING", logger="rlhf_core.trainer.evaluation"):
        metrics = run_evaluation(cfg)
    for k, (value, covered) in EXPECTED.items():
        assert metrics[f"pass@{k}/openai/gsm8k"] == pytest.approx(value)
        assert metrics[f"pass@{k}/num_prompts/openai/gsm8k"] == covered
    assert SHORT_LINE in caplog.text


def test_eval_with_even_prompts_reports_nothing(tmp_path):
    from rlhf_core.trainer.evaluation import report_short_prompts

    rows = [{"data_source": "d", "uid": str(i), "score": 1.0} for i in (0, 0, 1, 1)]
    assert report_short_prompts(rows) == []


def test_rlhf_eval_prints_the_short_prompts(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "rlhf_core.trainer.main_eval", f"data.path={_responses_file(tmp_path)}",
           "ray_init.num_cpus=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert SHORT_LINE in proc.stderr
    printed = json.loads(proc.stdout)
    assert printed["pass@4/num_prompts/openai/gsm8k"] == 1.0 and printed["pass@1/num_prompts/openai/gsm8k"] == 3.0
