"""What the DuckDB results store holds (``infra.results``): the three tables' columns (:data:`TABLES`), the views
derived from them (:data:`DERIVED_VIEWS`), the statement that makes a table's view, and the columns a sample file
gets when it is registered (:func:`prompt_id`, :func:`with_sample_ids`, :func:`label_suite`). No connection and no
file here: plain values and ``pyarrow`` tables.

- ``samples``: ``run_id, stage, step, data_source, uid, sample_idx, prompt, response,
  ground_truth, score, prompt_id, question, checkpoint`` plus any extra columns the core wrote
  (``acc``, ``pred``, ...; ``num_turns``, ``tool_calls``, ``tool_failures`` for multi-turn tool rollouts,
  ``rlhf_core.metrics.samples.trajectory_columns``). ``prompt_id`` (:func:`prompt_id`) is a hash of the rendered prompt
  and ``data_source``, the same for the same prompt in every run;
- ``metrics``: ``run_id, stage, step, key, value``;
- ``runs``: ``run_id, flow_run_id, stage, status, started_at, ended_at, params_json, name, kind``:
  one row per run id (``kind`` ``flow`` for a flow run, whose ``run_id`` is the Prefect flow-run
  id; ``stage`` for a stage run, whose ``run_id`` is its MLflow run id).

Derived views (:data:`DERIVED_VIEWS`): ``prompt_scores`` (one row per run, stage, step and
prompt: mean score over its samples) and ``compare_pairs`` (evaluation prompt scores of two
runs side by side, paired by ``prompt_id``; filter on ``run_a``/``run_b`` or ``flow_a``/``flow_b``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Mapping

import pyarrow as pa

TABLES: dict[str, dict[str, str]] = {
    "samples": {
        "run_id": "VARCHAR", "stage": "VARCHAR", "step": "BIGINT", "data_source": "VARCHAR",
        "uid": "VARCHAR", "sample_idx": "BIGINT", "prompt": "VARCHAR", "response": "VARCHAR",
        "ground_truth": "VARCHAR", "score": "DOUBLE", "prompt_id": "VARCHAR", "question": "VARCHAR",
        "checkpoint": "VARCHAR",
    },
    "metrics": {
        "run_id": "VARCHAR", "stage": "VARCHAR", "step": "BIGINT", "key": "VARCHAR", "value": "DOUBLE",
    },
    "runs": {
        "run_id": "VARCHAR", "flow_run_id": "VARCHAR", "stage": "VARCHAR", "status": "VARCHAR",
        "started_at": "TIMESTAMP", "ended_at": "TIMESTAMP", "params_json": "VARCHAR",
        "name": "VARCHAR", "kind": "VARCHAR",
    },
}
# Views over the three tables. ``runs`` may hold several rows for one run id in a store written
# before runs were keyed by run id alone, hence the GROUP BY in ``_run_index``.
DERIVED_VIEWS: dict[str, str] = {
    "prompt_scores": """
        WITH run_index AS (
            SELECT run_id, any_value(flow_run_id) AS flow_run_id, min(started_at) AS started_at
            FROM runs GROUP BY run_id)
        SELECT s.run_id, any_value(r.flow_run_id) AS flow_run_id, s.stage, s.step, s.data_source,
               coalesce(s.prompt_id, s.uid) AS prompt_id, any_value(s.question) AS question,
               any_value(s.prompt) AS prompt, any_value(s.checkpoint) AS checkpoint,
               avg(s.score) AS score, count(*) AS n_samples, any_value(r.started_at) AS started_at
        FROM samples s LEFT JOIN run_index r ON r.run_id = s.run_id
        GROUP BY s.run_id, s.stage, s.step, s.data_source, coalesce(s.prompt_id, s.uid)""",
    "compare_pairs": """
        SELECT a.run_id AS run_a, b.run_id AS run_b, a.flow_run_id AS flow_a, b.flow_run_id AS flow_b,
               a.data_source, a.prompt_id, coalesce(b.question, a.question) AS question,
               a.score AS score_a, b.score AS score_b, b.score - a.score AS diff
        FROM prompt_scores a JOIN prompt_scores b
          ON a.data_source = b.data_source AND a.prompt_id = b.prompt_id AND a.run_id <> b.run_id
        WHERE a.stage = 'evaluate' AND b.stage = 'evaluate'""",
}


def prompt_id(prompt: str | None, data_source: str | None) -> str:
    """Stable id of a prompt across runs: the first 16 hex digits of sha256(data_source, NUL, prompt).

    ``prompt`` is the prompt as rendered (the text the model saw); ``None`` counts as ``""``.
    """
    blob = f"{data_source or ''}\0{prompt or ''}".encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def view_sql(table: str, source_glob: str | None) -> str:
    """The statement that (re)creates ``table``'s view: over the parquet files ``source_glob`` matches, or (None:
    the table has no file yet) over a typed empty relation, so queries work on an empty store."""
    if source_glob is not None:
        src = (f"read_parquet('{source_glob}', union_by_name=true, "
               f"hive_partitioning=false)")
        return f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM {src}"
    cols = ", ".join(f"CAST(NULL AS {typ}) AS {name}" for name, typ in TABLES[table].items())
    return f"CREATE OR REPLACE VIEW {table} AS SELECT {cols} WHERE false"


def metrics_table(rows: Iterable[Mapping[str, Any]], run_id: str, stage: str) -> pa.Table:
    """The ``metrics`` rows (``run_id, stage, step, key, value``) of ``rows`` in long form ``{"step", "key"|"name",
    "value"}`` or wide form ``{"step": 3, "actor/pg_loss": 0.1, ...}``; non-numeric values (bools too) are skipped
    (see :meth:`infra.results.ResultsStore.register_metrics`).

    Raises:
        ValueError: a row without ``step``.
    """
    steps, keys, values = [], [], []
    for row in rows:
        if "step" not in row:
            raise ValueError(f"metrics row without 'step': {dict(row)!r:.200}")
        step = int(row["step"])
        long_key = "key" if "key" in row else "name" if "name" in row else None
        items = [(row[long_key], row.get("value"))] if long_key else [
            (k, v) for k, v in row.items() if k != "step"]
        for key, value in items:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            steps.append(step)
            keys.append(str(key))
            values.append(float(value))
    n = len(steps)
    return pa.table({
        "run_id": pa.array([run_id] * n, pa.string()),
        "stage": pa.array([stage] * n, pa.string()),
        "step": pa.array(steps, pa.int64()),
        "key": pa.array(keys, pa.string()),
        "value": pa.array(values, pa.float64()),
    })


def label_suite(table: pa.Table, suite: str) -> pa.Table:
    """``table`` (sample rows) of an evaluation suite: each row's ``data_source`` becomes
    ``<suite>/<data_source>`` and a ``suite`` column holds ``suite`` (a file's own ``suite`` column is replaced); see
    :meth:`infra.results.ResultsStore.register_samples`."""
    sources = [f"{suite}/{d}" for d in table.column("data_source").to_pylist()]
    table = table.set_column(table.column_names.index("data_source"), "data_source",
                             pa.array(sources, pa.string()))
    table = table.drop_columns([c for c in ("suite",) if c in table.column_names])
    return table.append_column("suite", pa.array([suite] * table.num_rows, pa.string()))


def with_sample_ids(table: pa.Table, checkpoint: str | Mapping[int, str] | None,
                     questions: Mapping[str, str]) -> pa.Table:
    """``table`` with ``prompt_id`` (computed from ``prompt`` and ``data_source``), ``question`` and
    ``checkpoint`` columns (see :meth:`infra.results.ResultsStore.register_samples`)."""
    cols = table.column_names
    n = table.num_rows
    prompts = table.column("prompt").to_pylist() if "prompt" in cols else [None] * n
    sources = table.column("data_source").to_pylist() if "data_source" in cols else [None] * n
    ids = [prompt_id(p, d) for p, d in zip(prompts, sources)]
    own_q = table.column("question").to_pylist() if "question" in cols else [None] * n
    own_c = table.column("checkpoint").to_pylist() if "checkpoint" in cols else [None] * n
    steps = table.column("step").to_pylist() if "step" in cols else [None] * n
    if isinstance(checkpoint, Mapping):
        ckpts = [checkpoint.get(int(s)) if s is not None else None for s in steps]
    else:
        ckpts = [checkpoint] * n
    new = {
        "prompt_id": pa.array(ids, pa.string()),
        "question": pa.array([questions.get(i, q) for i, q in zip(ids, own_q)], pa.string()),
        "checkpoint": pa.array([c if c is not None else o for c, o in zip(ckpts, own_c)], pa.string()),
    }
    for name, arr in new.items():
        if name in table.column_names:
            table = table.drop_columns([name])
        table = table.append_column(name, arr)
    return table
