"""Per-sample result files (validation generations, evaluation scores) for the DuckDB ``samples`` view.

Schema (``docs/ARCHITECTURE.md``, "Results and lineage"), always in this order and with these types:

| column | type | meaning |
| --- | --- | --- |
| ``step`` | int64 | global step (0 for offline evaluation) |
| ``data_source`` | string | |
| ``uid`` | string | prompt id; samples of one prompt share it |
| ``sample_idx`` | int64 | 0..N-1 within the uid |
| ``prompt``, ``response`` | string | text (a chat message list is rendered by :func:`render_prompt`) |
| ``ground_truth`` | string | a non-string ground truth is JSON-encoded |
| ``score`` | float64 | |
| ``num_turns``, ``tool_calls``, ``tool_failures`` | int64 | multi-turn rollouts only (:func:`trajectory_columns`) |
| extras (``acc``, ``pred``, ...) | float64 when every non-null value is a number or bool, else string | |

Files are written atomically: to a hidden temporary file in the same folder, then ``os.replace``, so a reader
never sees a half-written parquet.
"""
from __future__ import annotations

import json
import os
from numbers import Number
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlhf_core.atomic import atomic_write
from rlhf_core.storage import is_storage_error, storage_error

CORE_COLUMNS: dict[str, pa.DataType] = {
    "step": pa.int64(),
    "data_source": pa.string(),
    "uid": pa.string(),
    "sample_idx": pa.int64(),
    "prompt": pa.string(),
    "response": pa.string(),
    "ground_truth": pa.string(),
    "score": pa.float64(),
}

# per-trajectory counts of agent-loop rollouts (rlhf_core.agent.layout.pack_trajectories' non-tensor columns)
TRAJECTORY_COLUMNS: tuple[str, ...] = ("num_turns", "tool_calls", "tool_failures")


def trajectory_columns(non_tensors: dict[str, Any]) -> dict[str, list[int]]:
    """Sample columns from a multi-turn rollout batch's non-tensor data; ``{}`` for a single-turn batch.

    Args:
        non_tensors: the batch's ``non_tensors`` with ``num_turns`` (verl's count: 1 + assistant turns +
            tool/user turns) and ``tool_calls`` (per row ``{tool name: [calls, failures]}``).

    Returns:
        ``{"num_turns": [...], "tool_calls": [calls summed over tools], "tool_failures": [...]}``, one int per row.
    """
    if "num_turns" not in non_tensors:
        return {}
    calls = list(non_tensors["tool_calls"])
    return {"num_turns": [int(n) for n in non_tensors["num_turns"]],
            "tool_calls": [sum(int(c[0]) for c in per_row.values()) for per_row in calls],
            "tool_failures": [sum(int(c[1]) for c in per_row.values()) for per_row in calls]}


def _to_text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, np.ndarray):
        v = v.tolist()
    try:
        return json.dumps(v, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(v)


def render_prompt(prompt: Any) -> str:
    """A prompt as text: a string as is; a chat message list as ``"<role>: <content>"`` lines."""
    if isinstance(prompt, np.ndarray):
        prompt = prompt.tolist()
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in prompt)
    return _to_text(prompt) or ""


def _is_number(v: Any) -> bool:
    return isinstance(v, (Number, np.number)) and not isinstance(v, complex)


def _column(name: str, values: list) -> pa.Array:
    if name in CORE_COLUMNS:
        typ = CORE_COLUMNS[name]
        if typ == pa.string():
            return pa.array([_to_text(v) for v in values], type=pa.string())
        if typ == pa.int64():
            return pa.array([None if v is None else int(v) for v in values], type=pa.int64())
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    if name in TRAJECTORY_COLUMNS:
        return pa.array([None if v is None else int(v) for v in values], type=pa.int64())
    present = [v for v in values if v is not None and not (isinstance(v, float) and np.isnan(v))]
    if present and all(_is_number(v) for v in present):
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    return pa.array([_to_text(v) for v in values], type=pa.string())


def samples_table(rows: "list[dict] | pandas.DataFrame") -> pa.Table:
    """Rows → an Arrow table with the schema above.

    Raises:
        ValueError: when a core column is missing from the rows.
    """
    if hasattr(rows, "to_dict") and not isinstance(rows, list):  # a pandas DataFrame
        rows = rows.to_dict(orient="records")
    names: list[str] = []
    for r in rows:
        names += [k for k in r if k not in names]
    missing = [c for c in CORE_COLUMNS if c not in names] if rows else []
    if missing:
        raise ValueError(f"sample rows lack the columns {missing}; every row needs {list(CORE_COLUMNS)}")
    order = list(CORE_COLUMNS) + [n for n in names if n not in CORE_COLUMNS]
    return pa.table({n: _column(n, [r.get(n) for r in rows]) for n in order}) if rows else pa.table(
        {n: pa.array([], type=t) for n, t in CORE_COLUMNS.items()}
    )


def write_samples_parquet(rows: "list[dict] | pandas.DataFrame", out_dir: str, name: str) -> str:
    """Write ``rows`` to ``<out_dir>/<name>.parquet`` atomically (``name`` may already end in ``.parquet``);
    creates ``out_dir``; returns the file's path. An existing file of that name is replaced.

    Raises:
        StorageError: a full disk or a read-only file system; no partial file is left, an existing file of that
            name and the other files of ``out_dir`` are untouched, and the message says so.
    """
    fname = name if name.endswith(".parquet") else f"{name}.parquet"
    path = os.path.join(out_dir, fname)
    table = samples_table(rows)
    try:
        os.makedirs(out_dir, exist_ok=True)
        with atomic_write(path) as fh:
            pq.write_table(table, fh)
    except OSError as exc:
        if is_storage_error(exc):
            raise storage_error(exc, f"samples file ({table.num_rows} row(s))", path,
                                f"the sample files already in {out_dir}, unchanged; no partial file") from exc
        raise
    return path


def make_sample_rows(
    step: int,
    data_sources: Sequence[str],
    uids: Sequence[str],
    prompts: Sequence[Any],
    responses: Sequence[str],
    ground_truths: Sequence[Any],
    scores: Sequence[float],
    extra: dict[str, Sequence[Any]] | None = None,
) -> list[dict]:
    """Per-sample rows for :func:`write_samples_parquet` (what validation writes each test step).

    ``sample_idx`` counts the samples of each uid in order (0, 1, ...); ``extra`` (e.g. the reward manager's
    ``reward_extra_info``) adds one column per key, except keys that clash with core columns (``score``).

    Raises:
        ValueError: when the sequences differ in length.
    """
    n = len(data_sources)
    extra = {k: v for k, v in (extra or {}).items() if k not in CORE_COLUMNS}
    lengths = {len(x) for x in (uids, prompts, responses, ground_truths, scores, *extra.values())}
    if lengths - {n}:
        raise ValueError(f"make_sample_rows: inputs differ in length ({sorted(lengths | {n})})")
    seen: dict[str, int] = {}
    rows = []
    for i in range(n):
        uid = str(uids[i])
        seen[uid] = seen.get(uid, -1) + 1
        row = {
            "step": int(step), "data_source": data_sources[i], "uid": uid, "sample_idx": seen[uid],
            "prompt": render_prompt(prompts[i]), "response": responses[i], "ground_truth": ground_truths[i],
            "score": scores[i],
        }
        row.update({k: v[i] for k, v in extra.items()})
        rows.append(row)
    return rows
