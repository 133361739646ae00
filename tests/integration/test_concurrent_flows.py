"""Two flow runs at once on one RLHF_HOME: both complete, their rows and samples stay separate and whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_concurrent_flow_runs_on_one_home(tmp_path, gsm8k_dir):
    from infra.results import ResultsStore

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RLHF_", "RAY_ADDRESS"))}
    env.update(RLHF_HOME=str(home), GSM8K_DIR=str(gsm8k_dir), RAY_AUTH_MODE="disabled")
    cmd = [sys.executable, "-m", "flows.rlhf", "--train-prompts", "16", "--val-prompts", "4", "--ppo-steps", "1",
           "--segment-steps", "1", "--skip-sft"]
    logs = [open(tmp_path / f"flow{i}.log", "w") for i in range(2)]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT) for log in logs]
    codes = [p.wait(timeout=2400) for p in procs]
    for log in logs:
        log.close()
    assert codes == [0, 0], "\n\n".join((tmp_path / f"flow{i}.log").read_text()[-4000:] for i in range(2))

    store = ResultsStore(home)
    _, flows = store.sql("SELECT run_id, status FROM runs WHERE kind = 'flow' ORDER BY run_id")
    assert len(flows) == 2 and all(status == "FINISHED" for _, status in flows)
    for flow_id, _ in flows:
        _, stages = store.sql(f"SELECT stage, status FROM runs WHERE flow_run_id = '{flow_id}' AND kind = 'stage' "
                              "ORDER BY stage")
        # prepare_data / build_model may be cache hits of the other run: ppo and evaluate are always its own
        assert ("evaluate", "FINISHED") in stages and ("ppo", "FINISHED") in stages, stages
        # every sample of each run: 4 validation prompts x val_kwargs.n=2 at step 1, scored again by evaluate
        _, counts = store.sql(
            "SELECT stage, count(*), count(score), count(prompt_id) FROM samples WHERE run_id IN "
            f"(SELECT run_id FROM runs WHERE flow_run_id = '{flow_id}') GROUP BY stage ORDER BY stage")
        assert counts == [("evaluate", 8, 8, 8), ("ppo", 8, 8, 8)], counts
    # checkpoints are per flow run
    assert len(list(home.glob("runs/*/checkpoints/global_step_1"))) == 2
