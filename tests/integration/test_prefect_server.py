"""Deployment `rlhf/full` on a real Prefect server, run by a real process worker.

On ``prefect server start`` on a free port in a temporary PREFECT_HOME (the session's ``prefect_server``,
tests/conftest_services.py, shared with test_deploy_experiment.py), creates the process pool, deploys from
``prefect.yaml``, triggers a tiny run and lets ``prefect worker start --run-once`` execute it; the flow run must
end COMPLETED.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
# the modules on the session's prefect_server run on one xdist worker, which starts one server for them all
pytestmark = pytest.mark.xdist_group("prefect_server")
TINY = {"train_prompts": 16, "val_prompts": 4, "sft_epochs": 1, "ppo_steps": 1, "segment_steps": 1}


def _pool_name() -> str:
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    [dep] = [d for d in spec["deployments"] if d["name"] == "full"]
    return dep["work_pool"]["name"]


def test_prefect_yaml_declares_the_deployment():
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    [dep] = [d for d in spec["deployments"] if d["name"] == "full"]
    assert dep["entrypoint"] == "flows/rlhf.py:rlhf"
    assert [s["cron"] for s in dep["schedules"]] == ["0 2 * * *"]
    assert _pool_name() == "rlhf-pool"
    # the nightly run is gated against the last successful one
    assert dep["parameters"]["baseline"] == "previous-successful"
    assert dep["parameters"]["max_regression"] > 0


def _run(cmd, env, timeout=300, **kw):
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_deployment_runs_on_a_process_worker(prefect_server, tmp_path, gsm8k_dir):
    api, env = prefect_server
    pool = _pool_name()
    _run([PREFECT, "work-pool", "create", "--type", "process", pool], env)
    _run([PREFECT, "--no-prompt", "deploy", "--all"], env)
    params = json.dumps({**TINY, "gsm8k_dir": str(gsm8k_dir)})
    out = _run([PREFECT, "deployment", "run", "rlhf/full", "--params", params], env)
    assert "rlhf/full" in out

    worker_env = {**env, "RLHF_HOME": str(tmp_path / "home"), "RAY_AUTH_MODE": "disabled"}
    worker = subprocess.run([PREFECT, "worker", "start", "--pool", pool, "--run-once"], cwd=REPO,
                            env=worker_env, capture_output=True, text=True, timeout=1800)
    (tmp_path / "worker.log").write_text(worker.stdout + worker.stderr)  # kept for a look after a failure
    runs = httpx.post(f"{api}/flow_runs/filter", json={"sort": "START_TIME_DESC"}, timeout=30).json()
    started = [r for r in runs if r["parameters"].get("ppo_steps") == TINY["ppo_steps"]]
    assert started, f"no triggered run found; worker said:\n{worker.stdout[-3000:]}\n{worker.stderr[-3000:]}"
    state = started[0]["state"]["type"]
    assert state == "COMPLETED", f"{state}\n{worker.stdout[-4000:]}\n{worker.stderr[-4000:]}"
    # the run wrote its results under the worker's RLHF_HOME
    assert (tmp_path / "home" / "results.duckdb").exists()
    assert (tmp_path / "home" / "mlflow.db").exists()
    _assert_artifacts_and_graph(api, started[0]["id"])
    _assert_logs_tell_the_story(api, started[0]["id"])
    _assert_registered_policy(tmp_path / "home", started[0]["id"])


def _assert_registered_policy(home: Path, flow_run_id: str) -> None:
    """The final policy is version 1 of the model named after the experiment, made by this flow run's ppo run,
    with its lineage tags and a loadable (merged) Hugging Face folder as its source."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    [version] = client.search_model_versions("name = 'rlhf'")
    assert str(version.version) == "1" and version.tags["flow_run_id"] == flow_run_id
    ppo = client.get_run(version.run_id)
    # the stage runs are named with the flow run ("ppo · vivacious-wolverine")
    assert ppo.info.run_name.startswith("ppo · ") and ppo.data.tags["registered_model"] == "rlhf/1"
    # TINY runs one PPO step in one segment: the policy is merged from the step-1 checkpoint
    assert Path(version.tags["ppo_checkpoint"]).name == "global_step_1"
    assert {"sft_model", "dataset.gsm8k_train.sha256", "dataset.gsm8k_val.sha256"} <= set(version.tags)
    assert version.source.endswith("/hf_model")
    assert "hf_model/config.json" in {a.path for a in client.list_artifacts(ppo.info.run_id, "hf_model")}
    # registered after evaluation and the gate (rlhf/full is gated on previous-successful; the first run has
    # nothing to compare with): candidate, not champion, and the version says how it scored
    assert version.tags["regression_gate"] == "no baseline"  # (search results carry no aliases: get the version)
    assert sorted(client.get_model_version("rlhf", "1").aliases) == ["candidate"]
    assert 0.0 <= float(version.tags["eval.test_score/openai/gsm8k"]) <= 1.0
    assert "Regression gate: no baseline; alias champion not moved" in version.description
    # the parent run: its datasets, source, resolved settings and the summary
    parent = client.get_run(ppo.data.tags["mlflow.parentRunId"])
    assert {d.dataset.name for d in parent.inputs.dataset_inputs} == {"gsm8k_train", "gsm8k_val"}
    assert parent.data.tags["mlflow.source.name"].endswith("flows/rlhf.py (Prefect flow rlhf)")
    assert {"summary.md", "config"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert ppo.info.run_name == f"ppo · {parent.info.run_name}"


def _assert_artifacts_and_graph(api: str, flow_run_id: str) -> None:
    """Summary markdown, evaluation table, PPO progress at 100 %; named segment runs; a linked graph."""
    arts = httpx.post(f"{api}/artifacts/filter", timeout=30,
                      json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}).json()
    by_key = {a["key"]: a for a in arts}
    assert {"rlhf-summary", "rlhf-evaluation", "ppo-progress"} <= set(by_key), sorted(by_key)
    summary = by_key["rlhf-summary"]
    assert summary["type"] == "markdown"
    for stage in ("| prepare_data |", "| sft |", "| ppo |", "| evaluate |", "test_score/openai/gsm8k"):
        assert stage in summary["data"], summary["data"]
    assert "/#/experiments/" in summary["data"]  # MLflow run links, which open the model-training view
    assert summary["data"].count("?workflowType=machine_learning") >= 6, summary["data"]  # parent + 5 stages
    link = by_key["mlflow-run"]["data"]  # a link artifact: Prefect stores "[text](url)" as markdown
    assert re.fullmatch(r"\[MLflow run \w+\]\(http://127\.0\.0\.1:5000/#/experiments/\d+/runs/\w+"
                        r"\?workflowType=machine_learning\)", link), link
    assert "## Model registry" in summary["data"] and "registered model rlhf version 1" in summary["data"]
    table = by_key["rlhf-evaluation"]
    assert table["type"] == "table"
    rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    assert [r["data_source"] for r in rows] == ["openai/gsm8k"] and 0.0 <= rows[0]["test_score"] <= 1.0
    progress = by_key["ppo-progress"]
    assert progress["type"] == "progress" and float(progress["data"]) == 100.0
    tasks = httpx.post(f"{api}/task_runs/filter", timeout=30,
                       json={"task_runs": {"flow_run_id": {"any_": [flow_run_id]}}}).json()
    names = {t["name"]: t for t in tasks}
    # every task run says what it did (TINY: 16 train and 4 val prompts, experiments/gsm8k_tiny.yaml's model and
    # overlong filter, 1 SFT epoch)
    assert set(names) == {"prepare_data · gsm8k · 16 train, 4 val prompts",
                          "build_model · 4 layers × 128 hidden, vocab 2000",
                          "filter_prompts · <= 256 tokens, 1 workers", "sft · 16 rows, 1 epoch",
                          "ppo_segment 1/1 (steps 1-1)", "validate · step 1", "evaluate · step 1",
                          "register_model rlhf"}, sorted(names)
    # the graph: every stage after the first waits for the one before it; the segment's checkpoint is validated by
    # its own task (issue 33), which evaluate waits for
    [evaluate] = [t for n, t in names.items() if n.startswith("evaluate")]
    [segment] = [t for n, t in names.items() if n.startswith("ppo_segment")]
    validate = names["validate · step 1"]
    assert [i["id"] for i in validate["task_inputs"]["wait_for"]] == [segment["id"]]
    assert [i["id"] for i in evaluate["task_inputs"]["wait_for"]] == [validate["id"]]
    assert [i["id"] for i in names["register_model rlhf"]["task_inputs"]["wait_for"]] == [evaluate["id"]]
    assert segment["task_inputs"]["wait_for"], segment["task_inputs"]


def _assert_logs_tell_the_story(api: str, flow_run_id: str) -> None:
    """The flow run's logs, read back from the server (what the UI's Logs tab shows): one line per stage with its
    figures, the PPO step line, the learning summary, the gate's verdict and the registered model; no WARNING (no
    Prefect task-timeout warning, nothing else) in a healthy run."""
    logs, offset = [], 0
    while True:  # the API returns at most 200 logs per call
        page = httpx.post(f"{api}/logs/filter", timeout=30, json={
            "logs": {"flow_run_id": {"any_": [flow_run_id]}}, "sort": "TIMESTAMP_ASC", "offset": offset,
            "limit": 200}).json()
        logs += page
        offset += len(page)
        if len(page) < 200:
            break
    messages = [entry["message"] for entry in logs]
    text = "\n".join(messages)
    for stage, figure in [("prepare_data", None), ("build_model", None), ("filter_prompts", None),
                          ("sft", "train/loss"), ("ppo", "critic/score/mean"), ("evaluate", "test_score/openai/gsm8k")]:
        [line] = [m for m in messages if m.startswith(f"stage {stage}: ")]
        # "stage sft: FINISHED, 41.3 s, MLflow run <id>; train/loss 6.93, val/loss 6.87"
        assert re.match(rf"stage {stage}: FINISHED, \d+\.\d s, MLflow run \w+", line), line
        if figure:
            assert re.search(rf"[;,] {re.escape(figure)} -?\d", line), line
    assert any(re.match(r"ppo step 1/1: score \d\.\d{3}", m) for m in messages), text
    assert "regression gate: no earlier successful run to compare with (previous-successful)" in messages, text
    assert any(m.startswith("registered model rlhf version 1 ") for m in messages), text
    assert any("held-out prompts" in m or m.startswith("no validation metric") for m in messages), text
    warnings = [(e["level"], e["message"][:300]) for e in logs if e["level"] >= logging.WARNING]
    assert warnings == [], warnings
