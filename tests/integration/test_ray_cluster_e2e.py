"""The flow on an existing two-node Ray cluster (head + a second `ray start` joining it, on 127.0.0.1).

Each node has its own CPUs, ports and (shared) temporary folder, started and stopped by this test with
``ray start --block`` (SIGTERM ends exactly those nodes; never a global ``ray stop``). A PPO segment with
``trainer.nnodes=2 trainer.n_gpus_per_node=1`` runs through the flow: its two ranks must sit on
different nodes, and its metrics must equal those of the same run with both ranks on one node
(``nnodes=1 n_gpus_per_node=2``: same world size, same seeds) within 1e-6.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest_services import pick_free_port

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
# metrics that measure time or throughput differ between any two runs
UNTIMED = ("timing_s/", "timing_per_token_ms/", "perf/")


def _ports() -> list[str]:
    names = ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
             "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port")
    return [a for name in names for a in (name, str(pick_free_port()))]


def _start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    fh = open(log, "w")
    return subprocess.Popen([RAY, "start", "--block", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
                             "--disable-usage-stats", *_ports(), *args], env=env, stdout=fh,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # `ray start --block` shuts its own node down
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _nodes_alive(address: str, env: dict) -> int:
    code = ("import ray; ray.init(address=%r, logging_level='ERROR'); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))" % address)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0


@pytest.fixture
def two_node_cluster(tmp_path):
    temp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths have a length limit
    port = pick_free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_", "PREFECT_", "RLHF_"))}
    env.update(RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO))
    address = f"127.0.0.1:{port}"
    head = _start(["--head", "--port", str(port), "--temp-dir", str(temp), "--include-dashboard", "false",
                   "--ray-client-server-port", str(pick_free_port())], env, tmp_path / "head.log")
    procs = [head]
    try:
        deadline = time.time() + 180
        while _nodes_alive(address, env) < 1:
            assert head.poll() is None and time.time() < deadline, (tmp_path / "head.log").read_text()[-3000:]
            time.sleep(2)
        procs.append(_start(["--address", address], env, tmp_path / "worker.log"))
        while _nodes_alive(address, env) < 2:
            assert procs[1].poll() is None and time.time() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(2)
        yield address, env
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _flow(home: Path, gsm8k_dir: Path, env: dict, address: str, layout: list[str]) -> str:
    cmd = [sys.executable, "-m", "flows.rlhf", "--ray-address", address, "--train-prompts", "16",
           "--val-prompts", "4", "--ppo-steps", "1", "--segment-steps", "1", "--skip-sft", "--skip-evaluate",
           "--ppo-overrides", *layout]
    run_env = {**env, "RLHF_HOME": str(home), "GSM8K_DIR": str(gsm8k_dir)}
    proc = subprocess.run(cmd, cwd=REPO, env=run_env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc.stdout


def _ppo_runs(home: Path) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlhf")
    return client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'ppo'",
                              order_by=["attributes.start_time ASC"])


@pytest.mark.slow
def test_ppo_segment_spans_two_nodes_and_equals_the_single_node_run(two_node_cluster, tmp_path, gsm8k_dir):
    from infra.results import ResultsStore

    address, env = two_node_cluster
    home = tmp_path / "home"  # on this machine's filesystem: both nodes see it (the shared-home check passes)
    _flow(home, gsm8k_dir, env, address, ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"])
    _flow(home, gsm8k_dir, env, address, ["trainer.nnodes=1", "trainer.n_gpus_per_node=2"])
    multi, single = _ppo_runs(home)
    multi_nodes = multi.data.tags["segment.1.worker_nodes"].split(",")
    single_nodes = single.data.tags["segment.1.worker_nodes"].split(",")
    assert len(multi_nodes) == 2 and multi_nodes[0] != multi_nodes[1]  # one rank per node
    assert len(single_nodes) == 2 and single_nodes[0] == single_nodes[1]  # both ranks on one node
    store = ResultsStore(home)

    def metrics(run_id):
        _, rows = store.sql(f"SELECT key, value FROM metrics WHERE run_id = '{run_id}' AND step = 1")
        return {k: v for k, v in rows if not k.startswith(UNTIMED)}

    a, b = metrics(multi.info.run_id), metrics(single.info.run_id)
    assert "critic/score/mean" in a and "actor/pg_loss" in a and set(a) == set(b)
    diffs = {k: abs(a[k] - b[k]) for k in a}
    assert max(diffs.values()) <= 1e-6, sorted(diffs.items(), key=lambda kv: -kv[1])[:5]
