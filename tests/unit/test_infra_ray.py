"""Dispatching a driver function to a real embedded Ray instance."""

from __future__ import annotations

import os
import sys

import pytest
import ray
import ray.cloudpickle

from conftest_services import *  # noqa: F401,F403
from infra.ray_cluster import forwarded_env, run_on_ray


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
