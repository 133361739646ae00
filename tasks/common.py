"""Shared stage plumbing: the per-flow context, and a stage's MLflow run + DuckDB index row."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from infra import lineage
from infra.results import ResultsStore
from infra.run_folders import read_jsonl
from rlhf_core.trainer.tracking import mlflow_params, sanitize_mlflow_name


def make_context(home: str, experiment: str, parent_run_id: str | None, flow_run_id: str | None,
                 run_dir: str, ray_address: str | None = None, flow_run_name: str | None = None,
                 timeouts: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The per-flow-run facts every task needs, as a plain (serialisable) dict. ``flow_run_name`` (Prefect's
    ``practical-fox``) goes into the stage runs' MLflow names (``sft · practical-fox``). ``timeouts``: seconds per
    stage (the experiment's ``tasks.<stage>.timeout_seconds``), which each stage enforces where its work runs
    (:mod:`tasks.deadline`); a stage not in it has no limit."""
    return {"home": home, "experiment": experiment, "parent_run_id": parent_run_id,
            "flow_run_id": flow_run_id, "run_dir": run_dir, "ray_address": ray_address,
            "flow_run_name": flow_run_name, "timeouts": dict(timeouts or {})}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


@contextlib.contextmanager
def stage(name: str, params: Mapping[str, Any], ctx: Mapping[str, Any]) -> Iterator[str]:
    """Open the stage's nested MLflow run and index it in DuckDB (one ``runs`` row per run id).

    The run-index row is written RUNNING at the start and replaced FINISHED/FAILED at the end,
    so a query during a run sees what is in progress. ``params`` (the stage's whole resolved
    config) is saved flattened in ``params_json``, as MLflow params and as artifact
    ``config/<name>.json``.

    Yields:
        The stage's MLflow run id.
    """
    store = ResultsStore(ctx["home"])
    flat = mlflow_params(params)
    params_json = json.dumps(flat, sort_keys=True)
    started = _now()
    with lineage.stage_run(name, params, parent_run_id=ctx.get("parent_run_id"), experiment=ctx["experiment"],
                           flow_run_id=ctx.get("flow_run_id"), flow_run_name=ctx.get("flow_run_name")) as rid:
        lineage.log_dict_artifact(rid, flat, f"config/{name}.json")
        store.index_run(rid, ctx.get("flow_run_id"), name, "RUNNING", started, None, params_json, name=name)
        status = "FAILED"
        try:
            yield rid
            status = "FINISHED"
        finally:
            store.index_run(rid, ctx.get("flow_run_id"), name, status, started, _now(), params_json, name=name)


def parquet_files(folder: str | Path) -> list[str]:
    """Parquet files under ``folder`` (recursively), sorted; [] when it does not exist."""
    p = Path(folder)
    return sorted(str(f) for f in p.rglob("*.parquet")) if p.exists() else []


def lineage_name(key: str) -> str:
    """A metric name MLflow accepts (``@`` → ``_at_``: the core's MLflow sink's
    :func:`rlhf_core.trainer.tracking.sanitize_mlflow_name`)."""
    return sanitize_mlflow_name(key)
