"""Shared stage plumbing: the per-flow context, and a stage's MLflow run + DuckDB index row."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from infra import lineage
from infra.results import ResultsStore


def make_context(home: str, experiment: str, parent_run_id: str | None, flow_run_id: str | None,
                 run_dir: str, ray_address: str | None = None) -> dict[str, Any]:
    """The per-flow-run facts every task needs, as a plain (serialisable) dict."""
    return {"home": home, "experiment": experiment, "parent_run_id": parent_run_id,
            "flow_run_id": flow_run_id, "run_dir": run_dir, "ray_address": ray_address}


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
    flat = lineage.flatten_params(params)
    params_json = json.dumps(flat, sort_keys=True)
    started = _now()
    with lineage.stage_run(name, params, parent_run_id=ctx.get("parent_run_id"),
                           experiment=ctx["experiment"], flow_run_id=ctx.get("flow_run_id")) as rid:
        lineage.log_dict_artifact(rid, flat, f"config/{name}.json")
        store.index_run(rid, ctx.get("flow_run_id"), name, "RUNNING", started, None, params_json, name=name)
        status = "FAILED"
        try:
            yield rid
            status = "FINISHED"
        finally:
            store.index_run(rid, ctx.get("flow_run_id"), name, status, started, _now(), params_json, name=name)


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


def parquet_files(folder: str | Path) -> list[str]:
    """Parquet files under ``folder`` (recursively), sorted; [] when it does not exist."""
    p = Path(folder)
    return sorted(str(f) for f in p.rglob("*.parquet")) if p.exists() else []
