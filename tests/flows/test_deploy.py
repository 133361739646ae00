"""``rlhf deploy FILE`` before any server (flows/deploy.py): what the deployment will carry, and the refusals that
come before the server is contacted. The deployment on a real Prefect server, updated and run by a real worker:
tests/integration/test_deploy_experiment.py."""
from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.deploy import REPO, deployment_spec, main

RLHF = str(Path(sys.executable).parent / "rlhf")

EXPERIMENT = """\
name: nightly-countdown
description: Countdown, tiny model
data: {generator: countdown, train_max_samples: 16, val_max_samples: 4}
ppo: {total_steps: 1, segment_steps: 1}
schedule: {cron: "30 1 * * *", timezone: Europe/Paris}
work_pool: gpu-pool
"""


def _write(folder: Path, text: str = EXPERIMENT) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "exp.yaml").write_text(text, encoding="utf-8")
    return folder / "exp.yaml"


def test_spec_carries_the_file_its_digest_and_folder(tmp_path):
    file = _write(tmp_path / "team" / "experiments")
    spec = deployment_spec(file)
    assert spec.full_name == "rlhf/nightly-countdown"
    assert spec.parameters == {
        "experiment_content": EXPERIMENT,  # the text itself, byte for byte, not the path
        "experiment_sha256": hashlib.sha256(EXPERIMENT.encode("utf-8")).hexdigest(),
        "experiment_base_dir": str(tmp_path / "team" / "experiments"),  # relative paths resolve here
    }
    assert spec.schedule == {"cron": "30 1 * * *", "timezone": "Europe/Paris", "active": True}  # active: default
    assert (spec.work_pool, spec.description) == ("gpu-pool", "Countdown, tiny model")
    assert spec.tags == ["rlhf", "experiment", "nightly-countdown"]
    assert spec.version == "sha256:" + spec.parameters["experiment_sha256"][:12]
    # the worker runs flows/rlhf.py:rlhf from this checkout, as prefect.yaml's rlhf/full
    assert (spec.entrypoint, spec.working_dir) == ("flows/rlhf.py:rlhf", str(REPO))


def test_options_override_the_file(tmp_path):
    spec = deployment_spec(_write(tmp_path), pool="cpu-pool", name="trial", schedule=False, check_configs=False)
    assert (spec.full_name, spec.work_pool, spec.schedule) == ("rlhf/trial", "cpu-pool", None)
    # an experiment without a schedule gets none; a paused one stays paused
    assert deployment_spec(_write(tmp_path, EXPERIMENT.replace("schedule:", "# schedule:")),
                           check_configs=False).schedule is None
    paused = EXPERIMENT.replace("timezone: Europe/Paris}", "timezone: UTC, active: false}")
    assert deployment_spec(_write(tmp_path, paused), check_configs=False).schedule == {
        "cron": "30 1 * * *", "timezone": "UTC", "active": False}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _deploy(args: list[str], tmp_path: Path, api_url: str | None) -> tuple[subprocess.CompletedProcess, float]:
    """``rlhf deploy ARGS`` in a fresh interpreter, with a fresh Prefect home (no profile, no server)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect_home")
    if api_url:
        env["PREFECT_API_URL"] = api_url
    start = time.monotonic()
    proc = subprocess.run([RLHF, "deploy", *args], capture_output=True, text=True, env=env, timeout=120)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("case", ["bad_cron", "bad_timezone", "unknown_field", "bad_override"])
def test_a_bad_file_is_refused_in_one_line(case, tmp_path, capsys):
    text = {"bad_cron": EXPERIMENT.replace("30 1 * * *", "30 1 * *"),
            "bad_timezone": EXPERIMENT.replace("Europe/Paris", "Europe/Pariss"),
            "unknown_field": EXPERIMENT.replace("work_pool:", "work_pol:"),
            # a stage config the flow's first check refuses: refused at deploy time, not at the nightly run
            "bad_override": EXPERIMENT.replace("ppo: {", "ppo: {overrides: [actor_rollout_ref.actor.clip_ratio=nan], ")
            }[case]
    file = _write(tmp_path, text)
    assert main([str(file)]) == 1  # before PREFECT_API_URL is even looked at
    out, err = capsys.readouterr()
    # one line; a stage config's refusal: the stage's line, then one line per bad key (rlhf pipeline's format)
    assert out == "" and len(err.strip().splitlines()) == (2 if case == "bad_override" else 1), err
    expected = {"bad_cron": [f"rlhf deploy: error: {file}: schedule.cron: Invalid cron string", "30 1 * *"],
                "bad_timezone": [f"rlhf deploy: error: {file}: schedule.timezone: Invalid timezone", "Europe/Pariss"],
                "unknown_field": [f"rlhf deploy: error: {file}", "work_pol", "work_pool"],  # did-you-mean
                "bad_override": [f"rlhf deploy: error: ppo stage (ppo_trainer): invalid overrides ({file}",
                                 "actor_rollout_ref.actor.clip_ratio", "nan"]}[case]
    for part in expected:
        assert part in err, err


@pytest.mark.slow  # two fresh interpreters that import prefect and the experiment loader: 10-25 s each
@pytest.mark.parametrize("case", ["no_api_url", "no_server"])
def test_no_server_is_refused_in_one_line(case, tmp_path):
    file = _write(tmp_path)
    api = None if case == "no_api_url" else f"http://127.0.0.1:{_closed_port()}/api"  # nothing listens there
    proc, seconds = _deploy([str(file)], tmp_path, api)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    expected = {
        "no_api_url": ["PREFECT_API_URL is not set", "prefect server start --host 127.0.0.1 --port 4200",
                       "PREFECT_SERVER_ANALYTICS_ENABLED=false", "export PREFECT_API_URL=http://127.0.0.1:4200/api"],
        "no_server": [f"rlhf deploy: error: Prefect server at {api} is not reachable (ConnectError",
                      "waited at most 5 s"],
    }[case]
    for part in expected:
        assert part in lines[0], lines[0]
    # a refused connection answers at once, without client retries: the seconds are the imports (about 5 s idle,
    # 20-28 s at load average 12 on 2 cores)
    assert seconds < 45, seconds


@pytest.mark.slow  # imports every module flows/rlhf.py imports (MLflow, Ray...): 5-15 s
def test_parameter_schema_is_prefects_own():
    """flow_parameter_schema reads only the rlhf function's source; it must stay what Prefect derives from the whole
    file (a flow parameter whose annotation needs one of the file's imports would break the shortcut)."""
    from prefect.utilities.callables import parameter_schema_from_entrypoint

    from flows.deploy import flow_parameter_schema

    schema = flow_parameter_schema()
    assert schema == parameter_schema_from_entrypoint(str(REPO / "flows/rlhf.py") + ":rlhf").model_dump_for_openapi()
    # what a deployment's run form offers (issue 33's parameters first, with their types)
    assert list(schema["properties"])[:4] == ["experiment_file", "experiment_content", "experiment_sha256",
                                              "experiment_base_dir"]
    assert schema["properties"]["ppo_steps"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
