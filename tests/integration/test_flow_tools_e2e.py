"""The tools experiment end to end: `python -m flows.rlhf --experiment experiments/gsm8k_tools.yaml` (multi-turn
GSM8K data with SFT tool traces, the overlong filter, SFT, one GRPO step with the tool agent loop), then the turns and
tool calls in DuckDB's `samples`.

Starts from the session's tiny model (``--model-path``: no build_model stage) and skips evaluation, to keep it short.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray  # starts Ray through an entry point (the rlhf CLI, a trainer, the flow)

REPO = Path(__file__).resolve().parents[2]
VAL_PROMPTS, VAL_N = 4, 2  # val_kwargs.n=2 in experiments/gsm8k_tools.yaml


@pytest.mark.slow
def test_tools_experiment_flow_records_turns_and_tool_calls(tmp_path, gsm8k_dir, tiny_model_dir):
    from infra.results import ResultsStore

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RLHF_", "RAY_ADDRESS"))}
    env.update(RLHF_HOME=str(home), GSM8K_DIR=str(gsm8k_dir), RAY_AUTH_MODE="disabled")
    cmd = [sys.executable, "-m", "flows.rlhf", "--experiment", "experiments/gsm8k_tools.yaml",
           "--model-path", tiny_model_dir, "--train-prompts", "16", "--val-prompts", str(VAL_PROMPTS),
           "--ppo-steps", "1", "--segment-steps", "1", "--sft-epochs", "1", "--skip-evaluate"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]

    store = ResultsStore(home)
    _, runs = store.sql("SELECT stage, status FROM runs WHERE kind = 'stage' ORDER BY stage")
    assert runs == [("filter_prompts", "FINISHED"), ("ppo", "FINISHED"), ("prepare_data", "FINISHED"),
                    ("sft", "FINISHED")]
    names, rows = store.sql("SELECT prompt, num_turns, tool_calls, tool_failures, score FROM samples "
                            "WHERE stage = 'ppo' AND step = 1")
    assert names == ["prompt", "num_turns", "tool_calls", "tool_failures", "score"]
    assert len(rows) == VAL_PROMPTS * VAL_N
    for prompt, turns, calls, failures, score in rows:
        assert "calc_gsm8k_reward" in prompt  # the multi-turn system prompt asking for the tool
        assert turns >= 2 and 0 <= failures <= calls and score is not None
        if calls == 0:  # no tool call: one assistant turn, nothing after it (1 + 1)
            assert turns == 2
    _, types = store.sql("SELECT DISTINCT typeof(num_turns), typeof(tool_calls) FROM samples")
    assert types == [("BIGINT", "BIGINT")]
    # the samples hold what the rollout recorded: their mean equals the validation metric of the same column
    _, [(mean_turns,)] = store.sql("SELECT avg(num_turns) FROM samples WHERE stage = 'ppo' AND step = 1")
    _, metric = store.sql("SELECT value FROM metrics WHERE stage = 'ppo' AND key LIKE 'val-aux/%/num_turns/mean@2'")
    assert metric and metric[0][0] == pytest.approx(mean_turns)
    # the training rollout's multi-turn metrics reach the metrics table too
    _, keys = store.sql("SELECT DISTINCT key FROM metrics WHERE stage = 'ppo'")
    assert {"num_turns/min", "num_turns/max", "num_turns/mean", "tool_calls/total"} <= {k for (k,) in keys}
