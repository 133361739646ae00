"""Input errors fail a pipeline stage at once; crashes are still retried (issue 36).

A pipeline whose data could not be read was retried three times over 92 s before its clear message. Each test
runs a real stage task with the retries and retry delay of the default experiment (``flows/experiment.py``; a retry
would wait ``retry_delay_seconds``) in a Prefect flow against a temporary Prefect API, and reads the task run's
``run_count`` back from Prefect: one attempt for an input error, two for a transient crash.
"""
from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest_services import *  # noqa: F401,F403 - rlhf_env, ray_local (prefect_harness: tests/conftest.py)

pytestmark = pytest.mark.ray  # starts Ray: uses the fixture ray_local


def _shipped_options(stage: str) -> dict[str, float]:
    """The Prefect options of ``stage`` in the default experiment (what ``rlhf pipeline`` applies)."""
    from flows.settings import resolve_settings

    opts = resolve_settings({}).task_options[stage]
    assert opts["retries"] >= 1 and opts["retry_delay_seconds"] >= 10  # a retry would be seen in the timing
    return {"retries": opts["retries"], "retry_delay_seconds": opts["retry_delay_seconds"]}


def _gsm8k(source_dir: str | None, n_train: int = 8, n_val: int = 4) -> dict[str, Any]:
    """``prepare_data``'s ``data`` argument for the gsm8k generator (``PipelineSettings.data_spec()``)."""
    return {"generator": "gsm8k", "generator_args": {"source_dir": source_dir}, "train_files": [], "val_files": [],
            "train_prompts": n_train, "val_prompts": n_val, "sft_train_files": [], "sft_val_files": [],
            "suites": [], "prompt_key": "prompt"}


def _ctx(home: Path, name: str) -> dict[str, Any]:
    from tasks.common import make_context

    return make_context(str(home), "retries", None, name, str(home / "runs" / name))


def _run(task: Any, *args: Any, **kwargs: Any) -> tuple[Any, int, float]:
    """Run ``task(*args, **kwargs)`` in a flow; returns (its final state, Prefect's run_count, seconds it took)."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    @flow(name="input-errors")
    def one_task() -> tuple[Any, Any, float]:
        start = time.monotonic()
        state = task(*args, return_state=True, **kwargs)
        return state, state.state_details.task_run_id, time.monotonic() - start

    state, task_run_id, seconds = one_task()
    with get_client(sync_client=True) as client:
        return state, client.read_task_run(task_run_id).run_count, seconds


def _error(state: Any) -> BaseException:
    assert state.is_failed(), state
    exc = state.result(raise_on_failure=False)
    assert isinstance(exc, BaseException), exc
    return exc


def test_unreachable_hub_fails_prepare_data_once_with_its_message(prefect_harness, rlhf_env, monkeypatch):
    import huggingface_hub.constants

    from rlhf_core.data import RemoteUnavailableError
    from tasks.stages import prepare_data

    # huggingface_hub's own offline mode (HF_HUB_OFFLINE=1, read per request): every hub request is refused, as
    # on a machine without network. source_dir=None is what `rlhf pipeline` does without GSM8K_DIR.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("GSM8K_DIR", raising=False)
    opts = _shipped_options("prepare_data")
    state, run_count, seconds = _run(prepare_data.with_options(**opts), _gsm8k(None), _ctx(rlhf_env, "hub"))
    exc = _error(state)
    assert isinstance(exc, RemoteUnavailableError)
    assert str(exc).startswith("could not read openai/gsm8k from the Hugging Face hub (hf://datasets/openai/gsm8k/")
    assert "set GSM8K_DIR" in str(exc)
    assert run_count == 1  # before: 3 attempts (retries: 2)
    # the retries alone would wait retries x retry_delay_seconds (2 x 10 s); one attempt (opening the stage's MLflow
    # run on a fresh store included) takes a few seconds
    assert seconds < opts["retries"] * opts["retry_delay_seconds"]


def test_missing_data_folder_fails_prepare_data_once_naming_the_file(prefect_harness, rlhf_env, tmp_path):
    from tasks.stages import prepare_data

    missing = tmp_path / "no_such_gsm8k"
    opts = _shipped_options("prepare_data")
    state, run_count, seconds = _run(prepare_data.with_options(**opts), _gsm8k(str(missing)), _ctx(rlhf_env, "dir"))
    exc = _error(state)
    assert isinstance(exc, FileNotFoundError) and str(missing / "train.jsonl") in str(exc)
    assert run_count == 1 and seconds < opts["retries"] * opts["retry_delay_seconds"]


def test_a_transient_crash_is_still_retried(prefect_harness, rlhf_env, gsm8k_dir, monkeypatch):
    import pandas as pd

    from rlhf_core.data import gsm8k
    from tasks.stages import prepare_data

    real: Callable[..., dict[str, str]] = gsm8k.preprocess_gsm8k
    calls: list[str] = []

    def reset_once(*args: Any, **kwargs: Any) -> dict[str, str]:  # the first attempt meets a dropped connection
        calls.append("call")
        if len(calls) == 1:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        return real(*args, **kwargs)

    monkeypatch.setattr(gsm8k, "preprocess_gsm8k", reset_once)
    task = prepare_data.with_options(**{**_shipped_options("prepare_data"), "retry_delay_seconds": 0})
    state, run_count, _ = _run(task, _gsm8k(str(gsm8k_dir)), _ctx(rlhf_env, "transient"))
    assert state.is_completed(), state
    assert run_count == 2 and len(calls) == 2
    assert len(pd.read_parquet(state.result()["train"])) == 8  # the retry did the work


def test_input_errors_raised_on_ray_are_not_retried_but_crashes_are(ray_local, tmp_path):
    """The classification of real errors as they reach the flow from a Ray task (RayTaskError around the cause)."""
    import os
    import sys

    import ray.cloudpickle
    from ray.exceptions import RayTaskError

    from infra.ray_cluster import run_on_ray
    from rlhf_core.storage import StorageError
    from tasks import plan, remote

    with pytest.raises(RayTaskError) as missing:  # the remote builder reads a parquet file that is not there
        run_on_ray(remote.build_model_remote, str(tmp_path / "gone.parquet"), str(tmp_path / "m"), {})
    assert isinstance(missing.value, FileNotFoundError) and "gone.parquet" in str(missing.value)
    assert not plan.is_retriable(missing.value)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _raise/_die travel to the worker by value
    try:
        with pytest.raises(RayTaskError) as full:  # a full disk in the worker
            run_on_ray(_raise, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "x")))
        assert full.value.cause.errno == errno.ENOSPC  # Ray's wrapper has errno None; its cause keeps it
        assert not plan.is_retriable(full.value)
        with pytest.raises(RayTaskError) as bug:  # an error of the program, not of the input: retried
            run_on_ray(_raise, RuntimeError("NCCL watchdog timeout"))
        assert "NCCL watchdog timeout" in str(bug.value) and plan.is_retriable(bug.value)
        with pytest.raises(Exception) as killed:  # the stage's driver process killed (OOM killer, lost node)
            run_on_ray(_die)
        assert "died" in str(killed.value).lower() or "crash" in str(killed.value).lower(), killed.value
        assert plan.is_retriable(killed.value)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert not plan.is_retriable(StorageError(errno.EROFS, "metrics file /x not written (Read-only file system)"))
    assert plan.is_retriable(OSError(errno.EIO, "Input/output error"))
    assert plan.is_retriable(ConnectionError("MLflow server blip"))  # not the hub's RemoteUnavailableError


def _raise(exc: BaseException) -> None:
    raise exc


def _die() -> None:
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
