"""Running the ``rlhf`` flow locally (``rlhf pipeline``, ``flows.rlhf.main``): the parameter check before any
service starts (:func:`check_parameters`), the ephemeral Prefect server under the home's lock
(:func:`start_ephemeral_prefect`), an input error's flow-run log line without Prefect's traceback
(:func:`quiet_input_error_tracebacks`), and where the results are afterwards (:func:`mlflow_ui_lines`,
:func:`rlhf_command`).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import filelock
from prefect.settings import get_current_settings

from flows import interrupt, report
from flows.preflight import run_checks
from flows.resume import find_run
from flows.settings import resolve_settings
from infra import lineage
from infra.compare import RunNotFoundError
from infra.home import rlhf_home
from infra.results import ResultsStore
from rlhf_core.config import ConfigError
from rlhf_core.data.fs import copy_to_local, is_local
from rlhf_core.storage import StorageError, free_bytes


def mlflow_ui_lines(parent_run_id: str) -> list[str]:
    """How to see the parent run in the MLflow UI (model-training view): for a SQLite store, the loopback command
    that serves the UI on it (``infra.servers.mlflow_server_command``) and the link; for a tracking server, the
    link. ``[]`` when lineage is degraded (nothing is in MLflow)."""
    import shlex

    from infra.servers import mlflow_server_command

    if lineage.degraded() is not None:
        return []
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    lines = [] if uri.startswith(("http://", "https://")) else [f"UI:   {shlex.join(mlflow_server_command(uri))}"]
    return lines + [f"open: {lineage.run_url(parent_run_id)}"]


PREFECT_MIN_FREE_BYTES = 16 << 20
"""Bytes free on ``$PREFECT_HOME``'s disk below which :func:`start_ephemeral_prefect` refuses to start: Prefect's
SQLite state after one small flow run measured 1.4 MB plus a 4 MB write-ahead log (a user's trial)."""


def start_ephemeral_prefect(timeout_s: float = 600.0) -> None:
    """Without a Prefect server (no ``PREFECT_API_URL``): start this process's ephemeral API server under
    a file lock on ``$PREFECT_HOME`` (``prefect.db.lock``), so flow runs starting at once on a fresh home
    do not run Prefect's SQLite schema migrations at the same time (the loser fails "database is locked"
    or "table already exists"). The flow run then uses this server (one per process, Prefect's own).

    Raises:
        StorageError: ``ENOSPC``, less than :data:`PREFECT_MIN_FREE_BYTES` free on ``$PREFECT_HOME``'s disk (one line
            naming it; on a full disk Prefect's server fails its migrations and retries for minutes, with a
            traceback each time, before the flow could start).
        filelock.Timeout: another process kept the lock ``timeout_s`` seconds.
        RuntimeError: the server did not start (Prefect's message).
    """
    if get_current_settings().api.url:
        return
    prefect_home = Path(os.environ["PREFECT_HOME"]).expanduser()
    free = free_bytes(prefect_home)
    if free < PREFECT_MIN_FREE_BYTES:  # else its SQLite migrations fail "disk is full" and Prefect retries for minutes
        raise StorageError(errno.ENOSPC, f"PREFECT_HOME={prefect_home}: {free} bytes free on its disk; Prefect's "
                                         f"ephemeral server needs {PREFECT_MIN_FREE_BYTES >> 20} MiB there for its "
                                         "state database (about 6 MB after a flow run); free space or set RLHF_HOME "
                                         "to a folder on a roomier disk")
    with filelock.FileLock(str(Path(os.environ["PREFECT_HOME"]).expanduser() / "prefect.db.lock"), timeout=timeout_s):
        interrupt.start_server()  # in its own session: a Ctrl-C in the terminal does not kill it


class _InputErrorWithoutTraceback(logging.Filter):
    """Drops the traceback (``exc_info``) of a record whose exception is or wraps an input or storage error
    (:func:`rlhf_core.cli.user_error`); the record, whose message holds the error's repr, is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        from rlhf_core.cli import user_error

        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and user_error(exc) is not None:
            record.exc_info, record.exc_text = None, None
        return True


def quiet_input_error_tracebacks() -> None:
    """Prefect's flow engine logs a failed flow run's exception with its whole traceback ("Encountered exception
    during execution", about 60 lines through Prefect's futures) before ``rlhf pipeline`` prints its one
    ``error:`` line; for a bad row or key that traceback says nothing the line does not (a new user's trial). This
    filter on the ``prefect.flow_runs`` logger keeps the log line and drops the traceback for input and storage
    errors only; any other failure keeps its traceback. Idempotent."""
    logger = logging.getLogger("prefect.flow_runs")
    if not any(isinstance(f, _InputErrorWithoutTraceback) for f in logger.filters):
        logger.addFilter(_InputErrorWithoutTraceback())


def _local(path: str) -> Path | None:
    """``path`` as a local ``Path`` (a plain path or ``file://`` URL, ``~`` expanded); None for a remote URL."""
    return Path(copy_to_local(path)) if is_local(path) else None  # local: returned as is, nothing copied


def check_parameters(params: dict[str, Any]) -> str | None:
    """What is wrong with the flow parameters and their experiment (None when they are usable): the check's whole
    message, whose first line names the parameter (or the experiment file and field) and whose next lines, if
    any, each bad key and why.

    Runs the flow's own checks (the experiment, every stage's override list, every row of every RL data file,
    the model, the reward function: ``flows.preflight``; the baseline run id; the ``resume`` run:
    ``flows.resume.find_run``) plus a ``model_path`` or ``gsm8k_dir``
    parameter's existence (local paths and ``file://`` URLs), without starting any service.
    """
    from rlhf_core.data.generators import GENERATORS

    try:
        s = resolve_settings(params)
        value = params.get("model_path")
        local = _local(value) if value else None
        if local is not None and not local.exists():
            return f"model_path: {value} does not exist"
        gen = GENERATORS.get(s.generator or "")
        wrong = gen.missing_source(s.generator_args) if gen is not None else None
        if wrong:  # what the generator would read (e.g. GSM8K's jsonl files)
            return f"gsm8k_dir: {wrong}" if params.get("gsm8k_dir") else (
                f"{s.experiment_file}: data.generator_args.source_dir: {wrong}")
        run_checks(s)
        if params.get("resume"):  # a run that finished, is running or had other settings: named before Prefect starts
            find_run(rlhf_home(), params["resume"], s.as_params())
        if s.baseline not in (None, report.PREVIOUS_SUCCESSFUL):
            report.resolve_baseline(ResultsStore(rlhf_home()), s.baseline, None)
    except (ValueError, FileNotFoundError, ConfigError, RunNotFoundError) as exc:
        return str(exc)
    return None


def rlhf_command() -> str:
    """How to call the ``rlhf`` CLI here: ``rlhf`` when it is on PATH, else the venv's script
    (``.venv/bin/rlhf``, relative to the current folder when below it)."""
    if shutil.which("rlhf"):
        return "rlhf"
    script = Path(sys.executable).parent / "rlhf"
    if not script.exists():
        return ".venv/bin/rlhf"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)
