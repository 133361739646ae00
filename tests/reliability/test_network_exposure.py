"""Network exposure of the embedded Ray instance (issue 32): every socket on loopback, no job API, private files.

Real Ray 2.60 started the way the product starts it (``init_ray`` for ``rlhf ppo``/``sft``/``eval``,
``connect_ray`` for the Prefect flow), its listening sockets read with ``ss -ltnp`` (``psutil`` where ``ss`` is
missing) and filtered by the PIDs of the processes the start created. The attack is tried for real: an HTTP job
submission whose command creates a file, sent to this machine's own non-loopback addresses on every port the
instance listens on and on Ray's default job ports, and to every port on loopback. The control test shows the
same request runs its command against Ray started as before this change.
"""
from __future__ import annotations

import http.client
import ipaddress
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import ray

pytestmark = pytest.mark.ray  # starts Ray: calls ray.remote

RAY_JOB_PORTS = (52365, 8265)  # Ray's default dashboard-agent HTTP port and dashboard (job REST API) port
JOB_PATHS = ("/api/job_agent/jobs/", "/api/jobs/")  # the agent's and the dashboard's job submission endpoints


def _listening(pids: set[int] | None = None) -> set[tuple[str, int, int]]:
    """``(address, port, pid)`` of every TCP socket in LISTEN state that one of ``pids`` holds (``ss -ltnpH``);
    ``pids=None``: every listening socket on the machine (pid -1 where ``ss`` may not show it)."""
    if shutil.which("ss") is None:
        return {(c.laddr.ip, c.laddr.port, c.pid or -1) for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and (pids is None or c.pid in pids)}
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        local, procs = fields[3], " ".join(fields[5:])
        host, _, port = local.rpartition(":")
        host = host.strip("[]").split("%")[0]  # "[::ffff:127.0.0.1]" -> "::ffff:127.0.0.1"; "127.0.0.53%lo" -> ...
        for pid in map(int, re.findall(r"pid=(\d+)", procs) or [-1]):
            if pids is None or pid in pids:
                found.add((host, int(port), pid))
    return found


def _is_loopback(host: str) -> bool:
    if host == "*":  # ss's wildcard: every interface
        return False
    addr = ipaddress.ip_address(host)
    mapped = getattr(addr, "ipv4_mapped", None)  # a dual-stack socket bound to ::ffff:127.0.0.1
    return (mapped or addr).is_loopback


def _machine_addresses() -> list[str]:
    """This machine's own non-loopback IPv4/IPv6 addresses (link-local ones need a scope: left out)."""
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6) and "%" not in a.address
            and not ipaddress.ip_address(a.address).is_loopback and not ipaddress.ip_address(a.address).is_link_local]


def _submit_job(host: str, port: int, marker: Path) -> dict[str, object]:
    """POST a Ray job whose entrypoint creates ``marker`` to both job paths on ``host:port``.

    Returns ``{path: outcome}``: ``"refused"`` (no TCP connection), ``"no http"`` (connected, no HTTP answer: a
    gRPC port) or the HTTP status (int)."""
    body = json.dumps({"entrypoint": f"touch {marker}", "submission_id": f"attack-{uuid.uuid4().hex[:8]}"})
    outcomes: dict[str, object] = {}
    for path in JOB_PATHS:
        conn = http.client.HTTPConnection(host, port, timeout=3)
        try:
            conn.connect()
        except OSError:
            outcomes[path] = "refused"
            continue
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            outcomes[path] = conn.getresponse().status
        except (OSError, http.client.HTTPException):
            outcomes[path] = "no http"
        finally:
            conn.close()
    return outcomes


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:  # an idle worker that exited meanwhile
        return f"exited pid {pid}"


def _started_pids(before: set[int]) -> set[int]:
    me = psutil.Process()
    return {me.pid} | {p.pid for p in me.children(recursive=True)} - before


@ray.remote(num_cpus=0)
class _Probe:
    def node_ip(self) -> str:
        return ray.util.get_node_ip_address()


def _start_and_probe(start) -> tuple[set[int], str]:
    """Start Ray with ``start()``, run an actor (a worker's gRPC server opens) and return the PIDs the start
    created (driver included: its core worker listens too) and the node address the actor sees."""
    assert not ray.is_initialized()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start()
    probe = _Probe.remote()
    node_ip = ray.get(probe.node_ip.remote(), timeout=120)
    return _started_pids(before), node_ip


def _init_ray():
    from rlhf_core.distributed.ray_init import init_ray

    init_ray(None, num_cpus=1)


def _connect_ray():
    from infra.ray_cluster import connect_ray

    connect_ray(None, num_cpus=1)


@pytest.mark.parametrize("start", [_init_ray, _connect_ray], ids=["init_ray", "connect_ray"])
def test_embedded_ray_listens_on_loopback_only_and_serves_no_job_api(start, tmp_path, monkeypatch):
    monkeypatch.delenv("RLHF_BIND_HOST", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    marker = tmp_path / "attack-ran"
    try:
        pids, node_ip = _start_and_probe(start)
        listening = _listening(pids)
        names = {_name(pid) for _, _, pid in listening}
        # the instance's servers were found (a filter that matched nothing would pass vacuously)
        assert {"gcs_server", "raylet"} <= names and len(listening) >= 6, listening
        assert node_ip == "127.0.0.1"
        exposed = sorted((h, p, _name(pid)) for h, p, pid in listening if not _is_loopback(h))
        assert exposed == []
        ports = {p for _, p, _ in listening}
        assert not ports & set(RAY_JOB_PORTS), listening  # no dashboard agent HTTP server, no dashboard
        # the attack: from the network (this machine's own addresses) on every port of the instance and on Ray's
        # default job ports (unless another program on this shared machine holds one), and from loopback
        foreign = {p for _, p, pid in _listening() if pid not in pids}
        targets = ports | (set(RAY_JOB_PORTS) - foreign)
        outcomes = {(h, p): _submit_job(h, p, marker) for h in _machine_addresses() for p in targets}
        assert all(o == "refused" for out in outcomes.values() for o in out.values()), outcomes
        local = {p: _submit_job("127.0.0.1", p, marker) for p in ports}
        assert not [(p, o) for p, out in local.items() for o in out.values() if isinstance(o, int) and o < 300], local
        time.sleep(2)  # a job that had been accepted would have created the file by now
        assert not marker.exists()

        session = Path(ray._private.worker.global_worker.node.get_session_dir_path())
        _assert_private(session)
    finally:
        ray.shutdown()


def _assert_private(session: Path) -> None:
    """The session folder lies in this user's 0700 temp folder, and another user can neither list nor write in it
    (tried for real as uid 65534 where the test runs as root)."""
    from rlhf_core.distributed.ray_loopback import private_temp_root

    root = private_temp_root()
    assert session.is_relative_to(root), (session, root)
    info = os.lstat(root)
    assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, os.getuid())
    if os.getuid() != 0:
        return
    # as another user: list the session folder, create a file in its logs (exit status 0 = allowed)
    script = 'ls "$1" >/dev/null 2>&1; echo "list $?"; touch "$1/logs/x" 2>/dev/null; echo "write $?"'
    proc = subprocess.run(["/bin/sh", "-c", script, "sh", str(session)], capture_output=True, text=True, timeout=60,
                          user=65534, group=65534, extra_groups=[], cwd="/")
    denied = [line for line in proc.stdout.splitlines() if not line.endswith(" 0")]
    assert len(denied) == 2 and not (session / "logs" / "x").exists(), proc.stdout + proc.stderr


def test_the_job_api_attack_runs_a_command_against_ray_started_as_before(tmp_path, monkeypatch):
    """Control: Ray started with the product's former ``ray.init`` arguments serves the job API on this machine's
    address, and the request of the test above runs its command there. Without this the refusals above could
    come from a wrong request."""
    addresses = [a for a in _machine_addresses() if ipaddress.ip_address(a).version == 4]
    if not addresses:
        pytest.skip("this machine has no non-loopback IPv4 address to attack")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as EMBEDDED_RAY_ENV sets it
    marker = tmp_path / "attack-ran"
    try:
        pids, node_ip = _start_and_probe(lambda: ray.init(address="local", num_cpus=1, include_dashboard=False,
                                                          dashboard_host="127.0.0.1"))
        agent_ports = {p for h, p, _ in _listening(pids) if h == node_ip}
        assert node_ip in addresses and agent_ports, (node_ip, _listening(pids))
        outcomes = {p: _submit_job(node_ip, p, marker) for p in agent_ports}
        assert 200 in [o for out in outcomes.values() for o in out.values()], outcomes
        deadline = time.monotonic() + 90
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert marker.exists()  # a command sent over the network ran as this user
    finally:
        ray.shutdown()


def test_private_temp_root_is_made_private_and_refuses_a_planted_one(tmp_path, monkeypatch):
    from rlhf_core.distributed.ray_loopback import private_temp_root

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    root = tmp_path / f"rlhf-ray-{os.getuid()}"
    assert private_temp_root() == root and stat.S_IMODE(root.stat().st_mode) == 0o700
    root.chmod(0o777)  # ours but opened up: closed again
    assert stat.S_IMODE(private_temp_root().stat().st_mode) == 0o700
    root.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    root.symlink_to(tmp_path / "elsewhere")  # planted link: followed, Ray's sockets would land where it points
    with pytest.raises(PermissionError, match=f"{root} is not a folder of uid {os.getuid()}"):
        private_temp_root()
    if os.getuid() == 0:  # a folder planted by another user
        root.unlink()
        root.mkdir(mode=0o700)
        os.chown(root, 65534, 65534)
        with pytest.raises(PermissionError, match="owner uid 65534"):
            private_temp_root()


def test_process_group_store_listens_on_the_master_address_only():
    """The rank-0 TCPStore of a training process group (``tcp://`` rendezvous listened on ``*``)."""
    from rlhf_core.distributed.worker_group import free_port, rendezvous_store

    port = free_port()
    store = rendezvous_store(0, 1, "127.0.0.1", port)
    store.set("k", "v")
    assert store.get("k") == b"v"
    mine = {(h, p) for h, p, _ in _listening({os.getpid()}) if p == port}
    assert mine == {("127.0.0.1", port)}
    for host in _machine_addresses():
        with pytest.raises(OSError):
            socket.create_connection((host, port), timeout=2).close()
    del store


@pytest.mark.slow
def test_no_socket_of_an_rlhf_ppo_run_listens_outside_loopback(tmp_path, gsm8k_dir, tiny_model_dir):
    """``rlhf ppo`` with 2 ranks (a gloo group, its TCPStore) on the embedded Ray: every listening socket of
    every process of the run, polled with ``ss`` for its whole length, is on loopback."""
    sys.path.insert(0, str(Path(__file__).parent))
    from resume_fixtures import write_prompts

    train, test = write_prompts(gsm8k_dir, tmp_path, 4, 2)
    args = [f"data.train_files={train}", f"data.val_files={test}", "data.train_batch_size=2",
            "data.max_prompt_length=64", "data.truncation=left", "data.max_response_length=6",
            f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.actor.use_kl_loss=false", "algorithm.adv_estimator=grpo", "trainer.nnodes=1",
            "trainer.n_gpus_per_node=2", "trainer.device=cpu", "trainer.total_training_steps=1",
            "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console]",
            f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.project_name=p", "trainer.experiment_name=e",
            "ray_init.num_cpus=2"]
    env = {k: v for k, v in os.environ.items() if k not in ("RLHF_BIND_HOST", "RAY_ADDRESS")}
    env.update(RLHF_HOME=str(tmp_path / "home"), RAY_AUTH_MODE="disabled")
    log = open(tmp_path / "log.txt", "w")
    proc = subprocess.Popen([sys.executable, "-c", "import sys, rlhf_cli; sys.exit(rlhf_cli.main())", "ppo", *args],
                            cwd=Path(__file__).parents[2], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    seen: set[tuple[str, int, str]] = set()
    try:
        while proc.poll() is None:
            try:
                tree = {proc.pid} | {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
            except psutil.Error:
                break
            seen |= {(h, p, _name(pid)) for h, p, pid in _listening(tree)}
            time.sleep(0.3)
        assert proc.wait(timeout=600) == 0, (tmp_path / "log.txt").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    names = {n for _, _, n in seen}
    assert {"gcs_server", "raylet"} <= names and any("WorkerHos" in n for n in names), seen
    assert sorted(s for s in seen if not _is_loopback(s[0])) == []
