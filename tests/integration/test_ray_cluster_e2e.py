"""The flow on an existing two-node Ray cluster, and two flow runs at once on one RLHF_HOME.

The cluster: a head (``ray start --head``) and a second node joining it (``ray start --address``), on
127.0.0.1, each with its own CPUs, ports and the test's temporary folder. Each runs under
``ray start --block`` in its own process group, so teardown ends exactly those processes (SIGTERM, then
SIGKILL of the group); never a global ``ray stop``. The nodes get no PYTHONPATH and another working
directory: the code reaches them through the flow's ``runtime_env`` (as on a real cluster).

Two flow runs start at once, pointed at the cluster as users do (``RAY_ADDRESS=... rlhf pipeline``),
with the same config except the layout of the two actor ranks: ``trainer.nnodes=2
trainer.n_gpus_per_node=1`` (one rank per node) and ``nnodes=1 n_gpus_per_node=2`` (both on one node,
the single-node run: same world size, seeds and threads per rank). One run of the test shows

- the two ranks of the multi-node run ran on different node ids, those of the single-node run on one;
- the multi-node run equals the single-node run: every metric of the step within 1e-6, the same
  validation responses and scores;
- two concurrent flow runs on one home both complete, and every sample of both is in DuckDB, with
  their own checkpoints, MLflow runs and registered model versions.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest_services import pick_free_port

pytestmark = pytest.mark.ray  # starts Ray through an entry point (the rlhf CLI, a trainer, the flow)

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
NODE_CPUS = 3  # both runs at once: 1 + 1 CPU (a rank on each node) and 2 CPUs on one node
# metrics that measure time, throughput or memory differ between any two runs
UNTIMED = ("timing_s/", "timing_per_token_ms/", "perf/")
VAL_PROMPTS, VAL_N = 2, 2  # validation samples per run: prompts x actor_rollout_ref.rollout.val_kwargs.n
LAYOUTS = {"multi": ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"],
           "single": ["trainer.nnodes=1", "trainer.n_gpus_per_node=2"]}
# the same for both runs: 1 intra-op thread per rank (equal in both layouts by construction, and
# 4 ranks on a 2-core machine stay fast), short responses
COMMON = ["actor_rollout_ref.actor.fsdp_config.cpu_threads=1", "data.max_response_length=32",
          f"actor_rollout_ref.rollout.val_kwargs.n={VAL_N}"]


def _ports() -> list[str]:
    """Distinct free ports for one node's fixed-port components (Ray refuses a port used twice); its
    workers bind random ports (``--min/max-worker-port 0``), never the default 10002-19999 range that
    another Ray instance on this machine may be using."""
    names = ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
             "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port")
    ports: set[int] = set()
    while len(ports) < len(names):
        ports.add(pick_free_port())
    return [a for name, port in zip(names, sorted(ports)) for a in (name, str(port))] + [
        "--min-worker-port", "0", "--max-worker-port", "0"]


def _start(args: list[str], env: dict, cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as fh:
        return subprocess.Popen([RAY, "start", "--block", "--num-cpus", str(NODE_CPUS), "--node-ip-address",
                                 "127.0.0.1", "--disable-usage-stats", *_ports(), *args], env=env, cwd=cwd,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """End one node: SIGTERM to its ``ray start --block`` (which stops the node's processes), then SIGKILL
    to whatever is left in its process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _wait_for(what: str, ready, proc: subprocess.Popen, log: Path, deadline: float) -> None:
    while not ready():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{what} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(1)


def _nodes_alive(address: str, env: dict) -> int:
    code = ("import ray; ray.init(address=%r, logging_level='ERROR'); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))" % address)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0


@pytest.fixture
def two_node_cluster(tmp_path):
    """``(address, env)`` of a head and a joined second node, each with NODE_CPUS CPUs."""
    temp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths have a length limit
    port = pick_free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "MLFLOW_", "PREFECT_", "RLHF_")) and k != "PYTHONPATH"}
    env["RAY_AUTH_MODE"] = "disabled"
    address = f"127.0.0.1:{port}"
    logs = {name: tmp_path / f"{name}.log" for name in ("head", "worker")}
    procs: list[subprocess.Popen] = []
    try:
        deadline = time.time() + 240
        procs.append(_start(["--head", "--port", str(port), "--temp-dir", str(temp), "--include-dashboard",
                             "false", "--ray-client-server-port", str(pick_free_port())], env, temp, logs["head"]))
        _wait_for("the head node", lambda: "Ray runtime started" in logs["head"].read_text(), procs[0],
                  logs["head"], deadline)
        procs.append(_start(["--address", address], env, temp, logs["worker"]))
        _wait_for("the second node", lambda: _nodes_alive(address, env) >= 2, procs[1], logs["worker"], deadline)
        yield address, env
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)


def _flow_cmd(layout: list[str]) -> list[str]:
    return [sys.executable, "-m", "flows.rlhf", "--train-prompts", "16", "--val-prompts", str(VAL_PROMPTS),
            "--ppo-steps", "1", "--segment-steps", "1", "--skip-sft", "--skip-evaluate",
            "--ppo-overrides", *COMMON, *layout]


@pytest.mark.slow
def test_two_concurrent_flow_runs_on_a_two_node_cluster(two_node_cluster, tmp_path, gsm8k_dir):
    from mlflow import MlflowClient

    from infra.results import ResultsStore

    address, env = two_node_cluster
    home = tmp_path / "home"  # on this machine's filesystem: both nodes see it (the shared-home check passes)
    run_env = {**env, "RAY_ADDRESS": address, "RLHF_HOME": str(home), "GSM8K_DIR": str(gsm8k_dir),
               "PYTHONPATH": str(REPO)}
    logs = {name: tmp_path / f"flow_{name}.log" for name in LAYOUTS}
    procs = {}
    try:
        for name, layout in LAYOUTS.items():
            with open(logs[name], "w") as fh:
                procs[name] = subprocess.Popen(_flow_cmd(layout), cwd=REPO, env=run_env, stdout=fh,
                                               stderr=subprocess.STDOUT)
        codes = {name: proc.wait(timeout=1500) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert codes == {"multi": 0, "single": 0}, "\n\n".join(f"{n}:\n{logs[n].read_text()[-4000:]}" for n in logs)

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlhf")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`rlhf.stage` = 'ppo'")  # stage runs: "ppo · <flow run>"
    ppo = {r.data.params["trainer.nnodes"]: r for r in runs}
    assert len(runs) == 2 and set(ppo) == {"1", "2"}, [r.data.params.get("trainer.nnodes") for r in runs]
    multi, single = ppo["2"], ppo["1"]
    multi_nodes = multi.data.tags["segment.1.worker_nodes"].split(",")
    single_nodes = single.data.tags["segment.1.worker_nodes"].split(",")
    assert len(multi_nodes) == 2 and multi_nodes[0] != multi_nodes[1]  # one rank per node
    assert len(single_nodes) == 2 and single_nodes[0] == single_nodes[1]  # both ranks on one node

    store = ResultsStore(home)

    def metrics(run_id):
        _, rows = store.sql(f"SELECT key, value FROM metrics WHERE run_id = '{run_id}' AND step = 1")
        return {k: v for k, v in rows if not k.startswith(UNTIMED)}

    a, b = metrics(multi.info.run_id), metrics(single.info.run_id)
    assert {"critic/score/mean", "actor/pg_loss", "actor/entropy"} <= set(a) and set(a) == set(b)
    assert any(k.startswith("val-core/") for k in a)
    diffs = {k: abs(a[k] - b[k]) for k in a}
    assert max(diffs.values()) <= 1e-6, sorted(diffs.items(), key=lambda kv: -kv[1])[:5]

    # both flow runs complete, each with its own rows; every validation sample of both is in DuckDB
    _, flows = store.sql("SELECT run_id, status FROM runs WHERE kind = 'flow' ORDER BY run_id")
    assert len(flows) == 2 and all(status == "FINISHED" for _, status in flows), flows

    def samples(run_id):
        _, rows = store.sql("SELECT prompt_id, sample_idx, response, score FROM samples "
                            f"WHERE run_id = '{run_id}' AND stage = 'ppo' AND step = 1 ORDER BY prompt_id, sample_idx")
        return rows

    got = {name: samples(run.info.run_id) for name, run in (("multi", multi), ("single", single))}
    for rows in got.values():
        assert len(rows) == VAL_PROMPTS * VAL_N and len({r[0] for r in rows}) == VAL_PROMPTS
        assert all(r[0] and r[3] is not None for r in rows)
    assert got["multi"] == got["single"]  # the same responses, scored the same
    for flow_id, _ in flows:
        _, stages = store.sql(f"SELECT stage, status FROM runs WHERE flow_run_id = '{flow_id}' AND kind = 'stage'")
        assert ("ppo", "FINISHED") in stages, stages
    # checkpoints per flow run; one registered model version per run
    assert len(list(home.glob("runs/*/checkpoints/global_step_1/actor"))) == 2
    versions = client.search_model_versions("name = 'rlhf'")
    assert sorted(str(v.version) for v in versions) == ["1", "2"]
    assert {v.run_id for v in versions} == {multi.info.run_id, single.info.run_id}
