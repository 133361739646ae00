"""Fixtures for the real services the pipeline uses (embedded, in temporary folders).

Import into a conftest or test module: ``from conftest_services import *``.

- ``rlhf_env``: a temporary ``RLHF_HOME`` with MLflow (SQLite) and Prefect homes under it,
  set in ``os.environ`` for the test and restored afterwards; yields the home ``Path``.
- ``results_store``: a ``ResultsStore`` on that home.
- ``mlflow_client``: an ``MlflowClient`` on that home's SQLite store.
- ``prefect_harness``: Prefect's ``prefect_test_harness`` (temporary database), per session.
- ``ray_local``: an embedded Ray instance with 2 CPU slots, shut down at the session's end.
- ``free_port``: an unused TCP port on 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

__all__ = ["rlhf_env", "results_store", "mlflow_client", "prefect_harness", "ray_local", "free_port",
           "pick_free_port"]

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
def ray_local():
    from infra.ray_cluster import connect_ray, shutdown_ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    resources = connect_ray(None, num_cpus=2)
    yield resources
    shutdown_ray()
