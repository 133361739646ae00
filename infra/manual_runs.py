"""Runs started by hand (``rlhf ppo``, ``rlhf eval``) in the same results store and MLflow home.

When ``RLHF_HOME`` is set, ``rlhf ppo ...`` / ``rlhf eval ...`` go through :func:`ppo_main` /
:func:`eval_main`: the MLflow tracking store is ``$RLHF_HOME``'s (unless ``MLFLOW_TRACKING_URI``
is set), an MLflow run is created first and the core logs into it (``MLFLOW_RUN_ID``), and
when the core returns its samples, metrics and run row are registered in the DuckDB store,
under that MLflow run id. ``rlhf results register PATH`` (:func:`register_folder`) adds a run
folder written earlier.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from infra.results import ResultsStore

SAMPLE_COLUMNS = {"step", "data_source", "uid", "prompt", "response", "score"}
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def sample_files(folder: str | Path) -> list[Path]:
    """Parquet files under ``folder`` that have the core's sample columns, sorted."""
    out = []
    for path in sorted(Path(folder).rglob("*.parquet")):
        if path.name.startswith("."):
            continue
        try:
            names = set(pq.read_schema(path).names)
        except Exception:  # noqa: BLE001 - not a readable parquet: not a sample file
            continue
        if SAMPLE_COLUMNS <= names:
            out.append(path)
    return out


def checkpoints_by_step(folder: str | Path) -> dict[int, str]:
    """``{step: path}`` of the ``global_step_<N>`` folders below ``folder``."""
    out = {}
    for path in Path(folder).rglob("global_step_*"):
        m = _STEP_DIR.match(path.name)
        if m and path.is_dir():
            out[int(m.group(1))] = str(path.resolve())
    return out


def metric_rows(folder: str | Path) -> list[dict[str, Any]]:
    """Rows of every ``metrics*.jsonl`` below ``folder`` (the core's ``file`` sink), the last of each (step,
    name) only: a run resumed at step K appends the steps after K again, and those rows are the ones kept."""
    from tasks.common import last_per_step_and_key, read_jsonl

    rows: list[dict[str, Any]] = []
    for path in sorted(Path(folder).rglob("metrics*.jsonl")):
        rows.extend(read_jsonl(path))
    return last_per_step_and_key(rows)


def check_run_folder(path: str | Path) -> tuple[Path, list[Path], list[dict[str, Any]]]:
    """``(folder, sample files, metric rows)`` of a run folder that :func:`register_folder` accepts; reads only.

    Raises:
        FileNotFoundError: ``path`` is not a folder. ValueError: no sample file and no metrics in it.
    """
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"run folder {folder} does not exist")
    files = sample_files(folder)
    rows = metric_rows(folder)
    if not files and not rows:
        raise ValueError(f"{folder}: no sample parquet files (columns {sorted(SAMPLE_COLUMNS)}) "
                         f"and no metrics*.jsonl to register (rlhf ppo writes <trainer.default_local_dir>/"
                         "metrics.jsonl)")
    return folder, files, rows


def register_folder(store: ResultsStore, path: str | Path, stage: str | None = None,
                    run_id: str | None = None, params: Any = None, status: str = "FINISHED",
                    name: str | None = None, started_at: dt.datetime | None = None) -> dict[str, Any]:
    """Register the samples, metrics and run row of a run folder.

    Args:
        path: folder holding sample parquet files (``val_step_<N>.parquet`` of ``rlhf ppo``,
            ``eval_samples.parquet`` of ``rlhf eval``) and/or ``metrics*.jsonl`` (``rlhf ppo`` writes
            ``<trainer.default_local_dir>/metrics.jsonl``), optionally
            ``global_step_<N>`` checkpoint folders (recorded as each step's checkpoint).
        stage: ``ppo``/``evaluate``/``sft``; None guesses ``evaluate`` when an
            ``eval_samples.parquet`` is there, else ``ppo``.
        run_id: default ``manual-`` + 12 hex digits of the folder's absolute path.
        params: the resolved config (a mapping or DictConfig) for ``params_json``.

    Returns:
        ``{"run_id", "stage", "samples": rows, "metrics": values}``.

    Raises:
        FileNotFoundError: ``path`` is not a folder. ValueError: no sample file and no metrics.
    """
    from infra.lineage import flatten_params

    folder, files, rows = check_run_folder(path)
    stage = stage or ("evaluate" if any(f.name.startswith("eval_samples") for f in files) else "ppo")
    run_id = run_id or "manual-" + hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    n_samples = store.register_samples([str(f) for f in files], run_id, stage,
                                       checkpoint=checkpoints_by_step(folder) or None)
    n_metrics = store.register_metrics(rows, run_id, stage) if rows else 0
    if stage == "evaluate" and files and not rows:
        n_metrics = store.register_metrics([{"step": 0, **_eval_metrics(files)}], run_id, stage)
    params_json = json.dumps(flatten_params(params) if params is not None else {"path": str(folder)},
                             sort_keys=True)
    started = started_at or dt.datetime.fromtimestamp(folder.stat().st_mtime, dt.timezone.utc).replace(tzinfo=None)
    store.index_run(run_id, None, stage, status, started, _now(), params_json, name=name or folder.name)
    return {"run_id": run_id, "stage": stage, "samples": n_samples, "metrics": n_metrics}


def _eval_metrics(files: list[Path]) -> dict[str, float]:
    """``test_score/<ds>`` and ``pass@k/<ds>`` recomputed from evaluation sample files."""
    from rlhf_core.trainer.evaluation import evaluation_metrics

    rows: list[dict[str, Any]] = []
    for f in files:
        rows.extend(pq.read_table(f).to_pylist())
    return evaluation_metrics(rows)


def _tracked(config_name: str, argv: list[str], run_folder_key: str, experiment_key: str,
             run_core) -> int:
    """Shared body of :func:`ppo_main` / :func:`eval_main`."""
    from infra import lineage
    from infra.home import configure_environment, rlhf_home
    from rlhf_core.config import load_config
    from rlhf_core.trainer.tracking import sanitize_mlflow_name

    configure_environment()  # MLFLOW_TRACKING_URI under $RLHF_HOME unless the user set one
    config = load_config(config_name, argv)  # a bad key fails here, before any run is created
    experiment = str(_select(config, experiment_key)) if experiment_key else "rlhf-eval"
    run_id = lineage.start_run(experiment, f"manual {config_name}", tags={lineage.STAGE_TAG: config_name})
    folder = rlhf_home() / "runs" / f"manual-{run_id}"
    extra: list[str] = []
    if _select(config, run_folder_key) is None:  # keep the samples where the store can find them
        extra.append(f"{run_folder_key}={folder / 'samples'}")
        config = load_config(config_name, argv + extra)
    samples_dir = Path(str(_select(config, run_folder_key)))
    store = ResultsStore(rlhf_home())
    stage = "ppo" if config_name == "ppo_trainer" else "evaluate"
    started = _now()
    params_json = json.dumps(lineage.flatten_params(config), sort_keys=True)
    store.index_run(run_id, None, stage, "RUNNING", started, None, params_json, name=f"manual {stage}")
    env = {**lineage.stage_env(run_id), "RLHF_METRICS_FILE": str(folder / "metrics.jsonl")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    status, code = "FAILED", 1
    try:
        code = int(run_core(argv + extra) or 0)
        status = "FINISHED" if code == 0 else "FAILED"
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        store.register_samples([str(f) for f in sample_files(samples_dir)] if samples_dir.exists() else [],
                               run_id, stage, checkpoint=_ckpts(config, config_name))
        rows = metric_rows(folder) if folder.exists() else []
        if stage == "evaluate" and samples_dir.exists() and sample_files(samples_dir):
            metrics = _eval_metrics(sample_files(samples_dir))
            rows = [{"step": 0, **metrics}]
            lineage.log_metrics(run_id, {sanitize_mlflow_name(k): v for k, v in metrics.items()})
        if rows:
            store.register_metrics(rows, run_id, stage)
        lineage.end_run(run_id, status)
        store.index_run(run_id, None, stage, status, started, _now(), params_json, name=f"manual {stage}")
        print(f"registered run {run_id} ({stage}, {status}) in {store.db_path}")
    return code


def _ckpts(config: Any, config_name: str) -> dict[int, str] | None:
    if config_name != "ppo_trainer":
        return None
    root = Path(str(config.trainer.default_local_dir))
    return checkpoints_by_step(root) if root.exists() else None


def _select(config: Any, dotted: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, dotted)


def ppo_main(argv: list[str]) -> int:
    """``rlhf ppo`` with ``RLHF_HOME`` set: the core's run, tracked and registered (module docstring)."""
    from rlhf_core.trainer.main_ppo import main

    if any(a in ("-h", "--help") for a in argv):  # help: nothing to track
        return main(argv)
    return _tracked("ppo_trainer", list(argv), "trainer.validation_data_dir", "trainer.project_name", main)


def eval_main(argv: list[str]) -> int:
    """``rlhf eval`` with ``RLHF_HOME`` set: the core's evaluation, tracked and registered."""
    from rlhf_core.trainer.main_eval import main

    if any(a in ("-h", "--help") for a in argv):  # help: nothing to track
        return main(argv)
    return _tracked("evaluation", list(argv), "output.samples_dir", "", main)
