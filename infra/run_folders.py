"""Run folders in the results store: the samples, metrics and checkpoints a core run wrote, registered in DuckDB.

``rlhf results register PATH`` (:func:`register_folder`) adds a run folder written earlier; the tracked
``rlhf ppo`` / ``rlhf eval`` (:mod:`rlhf_cli.tracked`) and the pipeline's stages (:mod:`tasks.stages`) read
their folders with the same functions. Also the metrics-jsonl readers every layer above uses
(:func:`read_jsonl`, :func:`last_per_step_and_key`).
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


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a jsonl file ([] when it does not exist); a torn last line is skipped."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def last_per_step_and_key(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Long metric rows (``step`` + ``name``/``key``) with only the last row of each (step, name): a retry that
    resumed at step K logs its validation at K again (``val_before_train``), the same number as before."""
    last: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        name = row.get("name", row.get("key"))
        last[(row.get("step"), name) if name is not None else (row.get("step"), id(row))] = row
    return list(last.values())


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
    from rlhf_core.trainer.tracking import mlflow_params

    folder, files, rows = check_run_folder(path)
    stage = stage or ("evaluate" if any(f.name.startswith("eval_samples") for f in files) else "ppo")
    run_id = run_id or "manual-" + hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    n_samples = store.register_samples([str(f) for f in files], run_id, stage,
                                       checkpoint=checkpoints_by_step(folder) or None)
    n_metrics = store.register_metrics(rows, run_id, stage) if rows else 0
    if stage == "evaluate" and files and not rows:
        n_metrics = store.register_metrics([{"step": 0, **evaluation_metrics_of(files)}], run_id, stage)
    params_json = json.dumps(mlflow_params(params) if params is not None else {"path": str(folder)},
                             sort_keys=True)
    started = started_at or dt.datetime.fromtimestamp(folder.stat().st_mtime, dt.timezone.utc).replace(tzinfo=None)
    store.index_run(run_id, None, stage, status, started, _now(), params_json, name=name or folder.name)
    return {"run_id": run_id, "stage": stage, "samples": n_samples, "metrics": n_metrics}


def evaluation_metrics_of(files: list[Path]) -> dict[str, float]:
    """``test_score/<ds>`` and ``pass@k/<ds>`` recomputed from evaluation sample files."""
    from rlhf_core.trainer.evaluation import evaluation_metrics

    rows: list[dict[str, Any]] = []
    for f in files:
        rows.extend(pq.read_table(f).to_pylist())
    return evaluation_metrics(rows)
