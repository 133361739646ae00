"""Ctrl-C during ``rlhf pipeline`` (flows/interrupt.py), with a real SIGINT sent to the process group as a terminal
does: one line, the flow run recorded Crashed, Ray and Prefect's server stopped, exit 130, in seconds."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.paths import REPO

# rlhf pipeline's own main() and flow (start_ephemeral_prefect, the flow's checks and records, result_of, the
# KeyboardInterrupt handling), with the stages replaced by one that waits 300 s on a Ray worker
DRIVER = textwrap.dedent("""
    import sys, time
    import flows.rlhf as pipeline  # first, as the rlhf command does: it sets Prefect's environment before Prefect loads
    import ray
    from prefect import task
    from infra.ray_cluster import connect_ray

    @ray.remote
    def busy():
        time.sleep(300)

    @task
    def stage():
        print("stage started", flush=True)
        ray.get(busy.remote())

    def stages(*args):  # the flow's stages, replaced by one that waits 300 s on a Ray worker
        connect_ray(num_cpus=1)
        from prefect.server.api.server import SubprocessASGIServer
        print("server pid", SubprocessASGIServer().server_process.pid, flush=True)
        pipeline.result_of(stage.submit())

    pipeline._pipeline = stages
    sys.exit(pipeline.main(["--experiment", "experiments/countdown.yaml"]))
""")


def _session_members(sid: int) -> list[str]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # field 6 (session), after the state and ppid, pgrp
            out.append(stat.parent.name)
    return out


@pytest.mark.slow
def test_ctrl_c_stops_the_pipeline_in_seconds_and_marks_the_flow_run_crashed(tmp_path):
    home = tmp_path / "home"
    # a user's environment: no PREFECT_/MLFLOW_/RLHF_ variable an earlier test of this process left set (PREFECT_HOME
    # from configure_environment would put the flow's Prefect database elsewhere)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "RLHF_"))},
           "RLHF_HOME": str(home), "PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    log = tmp_path / "out.log"
    with open(log, "w") as fh:  # own session, SIGINT at its default (as in a terminal)
        proc = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=REPO, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 400
    while "stage started" not in log.read_text():
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    time.sleep(2)
    server_pid = int(log.read_text().split("server pid ")[1].split()[0])
    assert _session_members(proc.pid), "the driver's session is empty before the interrupt"
    sent = time.time()
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=120)
    took = time.time() - sent
    text = log.read_text()
    assert code == 130, text[-3000:]
    assert took < 30, f"{took:.1f} s after SIGINT\n{text[-3000:]}"  # before: the stage's 300 s, then 2+ min of retries
    lines = [ln for ln in text.splitlines() if ln.startswith("rlhf pipeline: interrupted")]
    assert len(lines) == 1 and "is Crashed" in lines[0], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    time.sleep(3)
    assert _session_members(proc.pid) == [], "processes left behind (Ray workers, services)"
    assert not Path(f"/proc/{server_pid}").exists() or \
        Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    with sqlite3.connect(home / "prefect" / "prefect.db") as db:  # what the Prefect UI will show
        assert db.execute("select state_type from flow_run").fetchall() == [("CRASHED",)]
    from infra.results import ResultsStore

    _, rows = ResultsStore(home).sql("select status from runs where stage = 'flow'")
    assert rows == [("FAILED",)]  # the store's record of the flow run, written as the interrupt passed
