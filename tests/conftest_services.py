"""Fixtures for the real services the pipeline uses (embedded, in temporary folders).

Import into a conftest or test module: ``from conftest_services import *``.

- ``rlhf_env``: a temporary ``RLHF_HOME`` with MLflow (SQLite) and Prefect homes under it,
  set in ``os.environ`` for the test and restored afterwards; yields the home ``Path``.
- ``results_store``: a ``ResultsStore`` on that home.
- ``mlflow_client``: an ``MlflowClient`` on that home's SQLite store.
- ``prefect_harness``: Prefect's ``prefect_test_harness`` (temporary database), per session (per xdist worker).
- ``prefect_server``: a real ``prefect server start`` on 127.0.0.1 (temporary PREFECT_HOME), per session (per xdist
  worker); yields ``(api_url, env)`` for its clients' subprocesses.

``prefect_harness`` and ``prefect_server`` are registered once, in tests/conftest.py: request them by name, never
import them into a test module (an imported fixture is a new definition there, and a session fixture defined in
each module that imports it starts one server per module).
- ``ray_local``: an embedded Ray instance with 2 CPU slots, shut down at the session's end.
- ``free_port``: an unused TCP port on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

__all__ = ["rlhf_env", "results_store", "mlflow_client", "ray_local", "free_port", "pick_free_port"]

_MANAGED = ("RLHF_HOME", "MLFLOW_TRACKING_URI", "RLHF_MLFLOW_ARTIFACT_ROOT", "MLFLOW_RUN_ID",
            "PREFECT_HOME")


def pick_free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    return pick_free_port()


@pytest.fixture
def rlhf_env(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "rlhf_home"
    for key in _MANAGED:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RLHF_HOME", str(home))
    keep_prefect = os.environ.get("PREFECT_API_URL")  # a harness/server the session set up
    from infra.home import configure_environment

    configure_environment()
    for key in _MANAGED:  # make monkeypatch restore what configure_environment set
        if key in os.environ:
            monkeypatch.setenv(key, os.environ[key])
    if keep_prefect:
        monkeypatch.setenv("PREFECT_API_URL", keep_prefect)
    return home


@pytest.fixture
def results_store(rlhf_env):
    from infra.results import ResultsStore

    return ResultsStore(rlhf_env)


@pytest.fixture
def mlflow_client(rlhf_env):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """``prefect server start`` (the documented command line, ``infra.servers.prefect_server_command``: it switches
    analytics off itself, no PREFECT_* variable is set) on a free port of 127.0.0.1, in a temporary PREFECT_HOME,
    UI off; yields ``(api_url, env)``: this environment without PREFECT_/MLFLOW_/RLHF_ variables, plus the server's
    home and ``PREFECT_API_URL``, for the CLI and worker subprocesses. One per session (per xdist worker): the
    modules that use it carry ``pytest.mark.xdist_group("prefect_server")``, so they run on one worker and share
    one server (each test uses its own work pool and deployment names)."""
    import httpx

    from infra.servers import prefect_server_command

    folder = tmp_path_factory.mktemp("prefect_server")
    port = pick_free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "RLHF_"))}
    env.update(PREFECT_HOME=str(folder / "prefect"), PREFECT_SERVER_UI_ENABLED="false")
    log = open(folder / "server.log", "w")
    server = subprocess.Popen(prefect_server_command(port, "127.0.0.1"),
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.time() + 180
        while True:
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"prefect server did not start:\n{(folder / 'server.log').read_text()[-3000:]}")
            time.sleep(0.25)
        # no telemetry: the server's setting, which its clients (workers, flow runs) follow as well
        assert httpx.get(f"{api}/admin/settings", timeout=10).json()["server"]["analytics_enabled"] is False
        yield api, {**env, "PREFECT_API_URL": api}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="session")
def ray_local():
    from infra.ray_cluster import connect_ray, shutdown_ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    resources = connect_ray(None, num_cpus=2)
    yield resources
    shutdown_ray()
