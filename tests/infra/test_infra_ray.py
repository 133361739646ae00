"""Dispatching a driver function to a real embedded Ray instance."""

from __future__ import annotations

import os
import sys

import pytest
import ray
import ray.cloudpickle

from conftest_services import *  # noqa: F401,F403
from infra.ray_cluster import forwarded_env, run_on_ray

pytestmark = pytest.mark.ray  # starts Ray: uses the fixture ray_local


# test modules are not importable on Ray workers: ship this module's functions by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _remote_env(keys):
    return {k: os.environ.get(k) for k in keys} | {"pid": os.getpid()}


def _fails(msg):
    raise ValueError(msg)


def test_run_on_ray_forwards_env_and_returns(ray_local, monkeypatch, tmp_path):
    monkeypatch.setenv("RLHF_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    out = run_on_ray(_remote_env, ["RLHF_HOME", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"],
                     env={"MLFLOW_RUN_ID": "abc123"})
    assert out["RLHF_HOME"] == str(tmp_path)
    assert out["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path}/m.db"
    assert out["MLFLOW_RUN_ID"] == "abc123"
    assert out["pid"] != os.getpid()  # it really ran in a Ray worker


def test_run_on_ray_raises_the_remote_error(ray_local):
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        run_on_ray(_fails, "bad input")
    assert isinstance(info.value.cause, ValueError) and "bad input" in str(info.value)


def test_forwarded_env_only_set_values(monkeypatch):
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("RLHF_HOME", "/h")
    env = forwarded_env({"X": 1})
    assert env["RLHF_HOME"] == "/h" and env["X"] == "1" and "MLFLOW_RUN_ID" not in env


def _sleep_then(value, seconds):
    import time

    time.sleep(seconds)
    return value


def test_run_on_ray_polls_while_waiting(ray_local):
    calls = []
    assert run_on_ray(_sleep_then, 7, 1.5, on_poll=lambda: calls.append(1), poll_s=0.2) == 7
    assert len(calls) >= 3  # ~1.5 s of waiting at 0.2 s per poll (start-up adds more)


def test_unreachable_ray_address_fails_in_seconds_naming_it(free_port):
    import socket
    import subprocess
    import time

    from infra.ray_cluster import check_reachable

    with pytest.raises(ConnectionError, match=f"'127.0.0.1:{free_port}'.*unreachable"):
        check_reachable(f"127.0.0.1:{free_port}")  # nothing listens there
    with socket.socket() as srv:  # something listening passes
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        check_reachable(f"ray://127.0.0.1:{srv.getsockname()[1]}")
    # the flow's connect path, in a fresh process, via $RAY_ADDRESS
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{free_port}"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "from infra.ray_cluster import connect_ray; connect_ray()"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and f"Ray cluster at '127.0.0.1:{free_port}'" in proc.stderr
    assert time.monotonic() - t0 < 60  # python + ray import, then a 5 s connect timeout at most


NICENESS_PROBE = """
import os, ray
from infra.ray_cluster import connect_ray
connect_ray(None, num_cpus=1)
print("NICENESS", os.nice(0), ray.get(ray.remote(lambda: os.nice(0)).remote()), flush=True)
ray.shutdown()
"""


def test_the_flows_embedded_ray_runs_workers_at_the_drivers_priority():
    """The flow starts Ray through ``connect_ray``, not ``init_ray``: its workers too must not get Ray's nice 15
    (a ``make learn`` run's ranks were niced and lost the CPU to a concurrent job). A fresh process, the variable
    unset, so only ``connect_ray`` can set it."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_worker_niceness", "RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, "-c", NICENESS_PROBE], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("NICENESS "))
    driver, worker = line.split()[1:]
    assert worker == driver


def test_set_embedded_ray_env_sets_the_defaults_and_keeps_explicit_values(monkeypatch):
    from rlhf_core.distributed.ray_init import set_embedded_ray_env

    for key in ("RAY_worker_niceness", "RAY_enable_worker_prestart", "RAY_prestart_worker_first_driver"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # a user's explicit choice stays
    monkeypatch.setenv("RAY_max_direct_call_object_size", "1000")
    set_embedded_ray_env()
    assert (os.environ["RAY_worker_niceness"], os.environ["RAY_AUTH_MODE"]) == ("0", "token")
    assert (os.environ["RAY_enable_worker_prestart"], os.environ["RAY_prestart_worker_first_driver"]) == ("0", "0")
    assert os.environ["RAY_max_direct_call_object_size"] == "1000"
