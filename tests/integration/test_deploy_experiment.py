"""``rlhf deploy FILE`` on a real Prefect server on 127.0.0.1 (the session's ``prefect_server``), run by a real
process worker: the deployment ``rlhf/<experiment name>`` carries the file's schedule, work pool and text (with its
digest); a second deploy of the edited file updates the same deployment; and a run of it completes after the file
was deleted, so what runs is the deployed content, not the path.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from test_prefect_server import PREFECT, REPO, _run

# on the server test_prefect_server.py uses (one xdist worker runs both modules: one server)
pytestmark = pytest.mark.xdist_group("prefect_server")
RLHF = str(Path(sys.executable).with_name("rlhf"))
POOL = "experiments-pool"


def tiny_countdown(name: str) -> dict:
    """experiments/countdown.yaml cut to one GRPO step on 32 generated prompts (n = 8), no SFT, 4 validation prompts."""
    exp = yaml.safe_load((REPO / "experiments" / "countdown.yaml").read_text())
    ppo = [o for o in exp["ppo"]["overrides"] if not o.startswith(("trainer.total_training_seconds",
                                                                   "trainer.val_before_train",
                                                                   "data.val_batch_size"))]
    exp.update(name=name, description="one GRPO step on Countdown (rlhf deploy test)", work_pool="nowhere-pool",
               schedule={"cron": "0 3 * * *", "timezone": "Europe/Paris"})
    exp["data"].update(train_max_samples=32, val_max_samples=4)
    exp["sft"]["enabled"] = False
    exp["ppo"].update(total_steps=1, segment_steps=1, overrides=ppo + [
        "trainer.val_before_train=False", "data.val_batch_size=4"])
    return exp


def rlhf_deploy(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([RLHF, "deploy", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def deployment(api: str, name: str) -> dict:
    response = httpx.get(f"{api}/deployments/name/{name}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow
def test_rlhf_deploy_creates_updates_and_runs_the_deployed_file(prefect_server, tmp_path):
    api, env = prefect_server
    _run([PREFECT, "work-pool", "create", "--type", "process", POOL], env)
    file = tmp_path / "team" / "nightly.yaml"
    file.parent.mkdir()
    exp = tiny_countdown("deploy-e2e")
    text = yaml.safe_dump(exp, sort_keys=False)
    file.write_text(text)

    # the file's work pool does not exist there: one line, nothing created
    proc = rlhf_deploy([str(file)], env, tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"rlhf deploy: error: work pool 'nowhere-pool' does not exist on {api}: create it with `prefect work-pool "
        "create --type process nowhere-pool` (or pass --pool)"), proc.stderr
    assert httpx.get(f"{api}/deployments/name/rlhf/deploy-e2e", timeout=30).status_code == 404

    started = time.monotonic()
    proc = rlhf_deploy([str(file), "--pool", POOL], env, tmp_path)  # from any folder: the checkout runs it
    deploy_s, out = time.monotonic() - started, proc.stdout
    assert proc.returncode == 0 and out.startswith("created deployment rlhf/deploy-e2e ("), (out, proc.stderr)
    first = deployment(api, "rlhf/deploy-e2e")
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert first["parameters"] == {"experiment_content": text, "experiment_sha256": digest,
                                   "experiment_base_dir": str(file.parent)}
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"]) for s in first["schedules"]] == [
        ("0 3 * * *", "Europe/Paris", True)]
    assert first["work_pool_name"] == POOL and first["description"] == exp["description"]
    assert first["tags"] == ["rlhf", "experiment", "deploy-e2e"] and first["version"] == f"sha256:{digest[:12]}"
    # the same code location as prefect.yaml's rlhf/full: this checkout's flows/rlhf.py, no code push or pull
    assert first["entrypoint"] == "flows/rlhf.py:rlhf" and first["path"] is None
    assert first["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
    assert {"experiment_content", "experiment_sha256", "ppo_steps"} <= set(
        first["parameter_openapi_schema"]["properties"])

    # the team edits the file: a second deploy updates the same deployment (id kept, parameters and schedule new)
    exp["description"] = "edited"
    exp["schedule"] = {"cron": "15 4 * * 1", "timezone": "UTC", "active": False}
    text = yaml.safe_dump(exp, sort_keys=False)
    file.write_text(text)
    proc = rlhf_deploy([str(file), "--pool", POOL], env, tmp_path)
    out = proc.stdout
    assert proc.returncode == 0 and out.startswith(f"updated deployment rlhf/deploy-e2e ({first['id']})"), (out, proc.stderr)
    second = deployment(api, "rlhf/deploy-e2e")
    assert second["id"] == first["id"] and second["description"] == "edited"
    assert second["parameters"]["experiment_content"] == text
    assert second["parameters"]["experiment_sha256"] == hashlib.sha256(text.encode()).hexdigest() != digest
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"]) for s in second["schedules"]] == [
        ("15 4 * * 1", "UTC", False)]

    # the file is gone (another machine never had it): the run uses the deployed content and completes
    file.unlink()
    _run([PREFECT, "deployment", "run", "rlhf/deploy-e2e"], env)
    home = tmp_path / "home"
    started = time.monotonic()
    worker = subprocess.run([PREFECT, "worker", "start", "--pool", POOL, "--run-once"], cwd=REPO,
                            env={**env, "RLHF_HOME": str(home), "RAY_AUTH_MODE": "disabled"},
                            capture_output=True, text=True, timeout=1800)
    run_s = time.monotonic() - started
    (tmp_path / "worker.log").write_text(worker.stdout + worker.stderr)
    runs = httpx.post(f"{api}/flow_runs/filter", timeout=30,
                      json={"flow_runs": {"deployment_id": {"any_": [first["id"]]}}}).json()
    assert len(runs) == 1, runs
    assert runs[0]["parameters"]["experiment_sha256"] == second["parameters"]["experiment_sha256"]
    assert runs[0]["state"]["type"] == "COMPLETED", f"{worker.stdout[-4000:]}\n{worker.stderr[-4000:]}"
    # the run is the experiment's: its MLflow experiment and registered model are named after it
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    assert client.get_experiment_by_name("deploy-e2e") is not None
    print(json.dumps({"deploy_s": round(deploy_s, 1), "worker_run_s": round(run_s, 1)}))
