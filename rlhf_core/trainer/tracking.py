"""Metric sinks for the trainers (verl's ``Tracking``): console, file (jsonl), mlflow, tensorboard, wandb, ...

``Tracking(project_name, experiment_name, default_backend, config)`` fans every ``log(data, step)`` out to the
backends named in ``trainer.logger``:

* ``console`` — one line ``step:N - key:value - ...`` per call, numbers with 3 decimals (verl's LocalLogger);
* ``file`` (ours) — JSON lines, one line per metric ``{"step": N, "name": str, "value": float, "timestamp": s}``
  (long format, so DuckDB reads it as a table). Path: env ``RLHF_METRICS_FILE`` if set, else
  ``<trainer.default_local_dir>/metrics.jsonl`` (else ``./metrics.jsonl`` without a config);
* ``mlflow`` — into the run ``MLFLOW_RUN_ID`` when that env variable is set (the pipeline creates it), else a new
  run named ``experiment_name`` in the experiment ``project_name``. The flattened config is logged as params once.
  MLflow metric names allow letters, digits, ``_ - . : / `` and space only; other characters are replaced:
  ``@`` → ``_at_`` (``val-core/x/reward/mean@4`` → ``val-core/x/reward/mean_at_4``), anything else → ``_``;
* ``tensorboard`` — ``torch.utils.tensorboard`` under env ``TENSORBOARD_DIR`` or
  ``tensorboard_log/<project>/<experiment>`` (verl's default);
* ``wandb``, ``swanlab``, ``trackio`` — through their own packages.

Non-numeric values (lists, strings) are skipped by every sink (console too, like verl).

Pipeline contract (ours): when env ``RLHF_METRICS_FILE`` is set the ``file`` sink is added, and when env
``MLFLOW_RUN_ID`` is set the ``mlflow`` sink is added, even if ``trainer.logger`` does not list them (the Prefect
tasks set these variables to collect every stage's metrics). A listed third-party sink whose package is not
installed (``wandb``, ``swanlab``, ``trackio``, ``tensorboard``) is skipped with a warning, so verl's default
``logger: [console, wandb]`` runs on a machine without wandb.

Raises:
    ValueError: for an unknown backend name.
"""
from __future__ import annotations

import contextlib
import errno
import importlib
import json
import logging
import numbers
import os
import re
import time
from typing import Any

from rlhf_core.flat import flatten_tree
from rlhf_core.redact import install_log_redaction, redact
from rlhf_core.trainer.metrics_file import default_metrics_file, names_at_last_step
from rlhf_core.storage import (
    StorageError, is_storage_error, read_only_reason, sqlite_store_path, storage_error)

logger = logging.getLogger(__name__)

SUPPORTED_BACKENDS = ("console", "file", "mlflow", "tensorboard", "wandb", "swanlab", "trackio")
_MLFLOW_INVALID = re.compile(r"[^0-9A-Za-z_\-.:/ ]")


def sanitize_mlflow_name(name: str) -> str:
    """``name`` with characters MLflow rejects replaced: ``@`` → ``_at_``, other invalid characters → ``_``."""
    return _MLFLOW_INVALID.sub("_", name.replace("@", "_at_"))


def scalar_metrics(data: dict[str, Any]) -> dict[str, float]:
    """The entries of ``data`` that are real numbers (python, numpy or 0-d torch), as floats."""
    out = {}
    for key, value in data.items():
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        if isinstance(value, numbers.Number) and not isinstance(value, bool | complex):
            out[key] = float(value)
    return out


# MLflow's limits (mlflow.utils.validation MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH), not imported: MLflow is
# heavy and this module is imported by every run
MLFLOW_KEY_LIMIT = 250
MLFLOW_PARAM_VALUE_LIMIT = 6000


def mlflow_param_name(key: str, limit: int = MLFLOW_KEY_LIMIT) -> str:
    """The MLflow name of a dotted config key: :func:`sanitize_mlflow_name`, then, when longer than ``limit``
    characters (MLflow's 250 for param and tag keys), its last ``limit`` characters: the leaf, which tells two
    keys apart, is kept and the shared section prefix is cut. Every writer (the core's ``mlflow`` sink and
    ``infra.lineage``) names params with this, so one key has one name in a run."""
    name = sanitize_mlflow_name(key)
    return name[-limit:] if len(name) > limit else name


def mlflow_params(config: Any) -> dict[str, str]:
    """A nested config (DictConfig or mapping) as MLflow params ``{name: value}``: secret values redacted
    (:func:`rlhf_core.redact.redact`), flattened (:func:`rlhf_core.flat.flatten_tree`: one param per scalar or
    list, empty mappings dropped), names by :func:`mlflow_param_name`, values as ``str`` and, when longer than
    MLflow's 6000 characters, cut to 5997 and ending in ``...``. Also the run index's ``params_json``."""
    out: dict[str, str] = {}
    for key, value in flatten_tree(redact(config) or {}).items():
        text = str(value)
        if len(text) > MLFLOW_PARAM_VALUE_LIMIT:
            text = text[: MLFLOW_PARAM_VALUE_LIMIT - 3] + "..."
        out[mlflow_param_name(key)] = text
    return out


def _fmt(value: float) -> str:
    """verl's ``:.3f``, except small non-zero values (a 1e-6 learning rate) in scientific notation."""
    return f"{value:.3e}" if value != 0 and abs(value) < 1e-3 else f"{value:.3f}"


class ConsoleSink:
    def log(self, data: dict[str, Any], step: int) -> None:
        parts = [f"step:{step}"] + [f"{k}:{_fmt(v)}" for k, v in scalar_metrics(data).items()]
        print(" - ".join(parts), flush=True)

    def finish(self) -> None:
        pass


class FileSink:
    """Appends one JSON line per metric to ``path``, each call's lines in one unbuffered write, so a crash loses
    nothing logged. A metric the file already holds at its last step (a resumed run validating again at its
    checkpoint's step) is not written twice (:mod:`rlhf_core.trainer.metrics_file`).

    Raises:
        StorageError: the file cannot be opened (read-only file system) or a write fails for a full disk; the
            file is cut back to its last whole line, and the message names it and the last step it holds.
    """

    def __init__(self, path: str):
        self.path = path
        self._last_step: int | None = None
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._held_step, self._held = names_at_last_step(path)  # what the file holds at its last step
            self._fh = open(path, "ab", buffering=0)
        except OSError as exc:
            if is_storage_error(exc):
                raise storage_error(exc, "metrics file", path, "nothing (no step was logged yet)") from exc
            raise

    def log(self, data: dict[str, Any], step: int) -> None:
        now = time.time()
        held = self._held if int(step) == self._held_step else set()
        blob = "".join(json.dumps({"step": int(step), "name": name, "value": value, "timestamp": now}) + "\n"
                       for name, value in scalar_metrics(data).items() if name not in held).encode("utf-8")
        start = self._fh.seek(0, os.SEEK_END)
        try:
            view = memoryview(blob)
            while view:
                view = view[self._fh.write(view):]
        except OSError as exc:
            with contextlib.suppress(OSError):  # no half line: the reader takes every line as a whole record
                os.ftruncate(self._fh.fileno(), start)
            if is_storage_error(exc):
                kept = "nothing (no step was logged yet)" if self._last_step is None else \
                    f"the metrics of steps up to {self._last_step}, in whole lines"
                raise storage_error(exc, f"metrics of step {int(step)} to", self.path, kept) from exc
            raise
        self._last_step = int(step)

    def finish(self) -> None:
        self._fh.close()


class MlflowSink:
    """Logs into ``MLFLOW_RUN_ID`` when set, else into a new run (ended with FINISHED by :meth:`finish`).

    Raises:
        StorageError: ``MLFLOW_TRACKING_URI`` is a ``sqlite:///`` store on a read-only file system (or one this
            process may not write), before any MLflow call, naming the store.
    """

    def __init__(self, project_name: str, experiment_name: str, config: Any):
        # lazy (this and the two below): mlflow takes seconds to import; only runs with the mlflow sink pay it
        from mlflow.tracking import MlflowClient

        store = sqlite_store_path(os.environ.get("MLFLOW_TRACKING_URI"))
        reason = read_only_reason(store) if store else None
        if reason:  # before MLflow's client: it would fail in SQLAlchemy with a long traceback
            raise StorageError(errno.EROFS if "Read-only" in reason else errno.EACCES,
                               f"MLflow store {store} not written ({reason}); kept: nothing was logged to it "
                               f"(set MLFLOW_TRACKING_URI to a writable store, or drop 'mlflow' from trainer.logger)")
        self.client = MlflowClient()
        run_id = os.environ.get("MLFLOW_RUN_ID")
        self.owns_run = not run_id
        if run_id:
            self.run_id = run_id
        else:
            exp = self.client.get_experiment_by_name(project_name)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(project_name)
            self.run_id = self.client.create_run(exp_id, run_name=experiment_name).info.run_id
        if config is not None:
            self._log_params(mlflow_params(config))

    def _log_params(self, params: dict[str, str]) -> None:
        """Log ``params``; into an existing run, only the new keys: a key the run already has with another
        value (a later PPO segment's ``trainer.stop_after_step``) becomes tag ``param.<key>`` instead, since
        MLflow params cannot change."""
        from mlflow.entities import Param, RunTag

        existing = {} if self.owns_run else self.client.get_run(self.run_id).data.params
        changed = [RunTag("param." + mlflow_param_name(k, MLFLOW_KEY_LIMIT - len("param.")), v)
                   for k, v in params.items() if k in existing and existing[k] != v]
        new = [Param(k, v) for k, v in params.items() if k not in existing]
        for i in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[i : i + 100])
        for i in range(0, len(changed), 100):
            self.client.log_batch(self.run_id, tags=changed[i : i + 100])

    def log(self, data: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        metrics = [Metric(sanitize_mlflow_name(k), v, ts, int(step)) for k, v in scalar_metrics(data).items()]
        for i in range(0, len(metrics), 500):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 500])

    def finish(self) -> None:
        if self.owns_run:
            self.client.set_terminated(self.run_id, "FINISHED")


class TensorboardSink:
    def __init__(self, project_name: str, experiment_name: str):
        from torch.utils.tensorboard import SummaryWriter  # ImportError without the tensorboard package

        log_dir = os.environ.get("TENSORBOARD_DIR", os.path.join("tensorboard_log", project_name, experiment_name))
        self.writer = SummaryWriter(log_dir=log_dir)

    def log(self, data: dict[str, Any], step: int) -> None:
        for k, v in scalar_metrics(data).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class _ModuleSink:
    """wandb / swanlab / trackio: ``init(project=, name=, config=)``, ``log(data, step=)``, ``finish()``."""

    def __init__(self, module_name: str, project_name: str, experiment_name: str, config: Any):
        self.module = importlib.import_module(module_name)
        cfg = {k: str(v) for k, v in flatten_tree(redact(config)).items()} if config is not None else None
        self.module.init(project=project_name, name=experiment_name, config=cfg)

    def log(self, data: dict[str, Any], step: int) -> None:
        self.module.log(scalar_metrics(data), step=step)

    def finish(self) -> None:
        self.module.finish()


class Tracking:
    """Fan-out of metrics to the sinks in ``default_backend`` (see the module docstring)."""

    def __init__(self, project_name: str, experiment_name: str, default_backend: list[str] | str = "console",
                 config: Any = None, metrics_file: str | None = None):
        install_log_redaction()  # the trainer's own log lines: no secret from its config or environment
        if config is not None:
            redact(config)  # remembers the config's secret values, so log lines quoting them are scrubbed
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend or [])
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; supported: {list(SUPPORTED_BACKENDS)}")
        if os.environ.get("RLHF_METRICS_FILE") and "file" not in backends:
            backends.append("file")
        if os.environ.get("MLFLOW_RUN_ID") and "mlflow" not in backends:
            backends.append("mlflow")
        self.sinks: dict[str, Any] = {}
        for name in backends:
            try:
                self.sinks[name] = self._make_sink(name, project_name, experiment_name, config, metrics_file)
            except ImportError as exc:
                logger.warning("trainer.logger: %r is not installed (%s); skipping that sink", name, exc)

    @staticmethod
    def _make_sink(name: str, project_name: str, experiment_name: str, config: Any, metrics_file: str | None):
        if name == "console":
            return ConsoleSink()
        if name == "file":
            return FileSink(metrics_file or default_metrics_file(config))
        if name == "mlflow":
            return MlflowSink(project_name, experiment_name, config)
        if name == "tensorboard":
            return TensorboardSink(project_name, experiment_name)
        return _ModuleSink(name, project_name, experiment_name, config)

    def log(self, data: dict[str, Any], step: int) -> None:
        for sink in self.sinks.values():
            sink.log(data, step)

    def finish(self) -> None:
        for sink in self.sinks.values():
            sink.finish()


def read_metrics_jsonl(path: str) -> dict[int, dict[str, float]]:
    """Read a ``file``-sink jsonl back as ``{step: {name: value}}`` (the last value wins)."""
    out: dict[int, dict[str, float]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                out.setdefault(row["step"], {})[row["name"]] = row["value"]
    return out
