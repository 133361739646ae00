"""The validation sample files as plain functions (no Prefect, no Ray, no MLflow): the raw question of each
validated prompt (:func:`questions_by_prompt_id`), the last step's samples grouped into evaluation.yaml's responses
table, the first rows of a parquet file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from infra.results_schema import prompt_id
from rlhf_core.atomic import atomic_write


def latest_validation_samples(paths: Iterable[str]) -> pd.DataFrame:
    """Concatenate validation sample parquet files and keep only the rows of the highest step.

    Raises:
        ValueError: no file or no row.
    """
    frames = [pd.read_parquet(p) for p in paths]
    if not frames:
        raise ValueError("no validation sample files to evaluate")
    df = pd.concat(frames, ignore_index=True)
    if df.empty:
        raise ValueError("validation sample files hold no rows")
    return df[df["step"] == df["step"].max()].reset_index(drop=True)


def responses_from_samples(samples: pd.DataFrame) -> pd.DataFrame:
    """Group per-sample rows (one response each) into evaluation.yaml's responses table.

    Input columns: ``uid, sample_idx, prompt, response, data_source, ground_truth``.
    Output: one row per ``uid`` with ``prompt``, ``responses`` (list of N strings ordered by
    ``sample_idx``), ``data_source`` and ``reward_model = {"style": "rule", "ground_truth": str}``.

    Raises:
        KeyError: a required column is missing.
    """
    needed = ["uid", "sample_idx", "prompt", "response", "data_source", "ground_truth"]
    missing = [c for c in needed if c not in samples.columns]
    if missing:
        raise KeyError(f"validation samples lack columns {missing}")
    rows = []
    for uid, group in samples.sort_values(["uid", "sample_idx"]).groupby("uid", sort=True):
        first = group.iloc[0]
        rows.append({
            "uid": str(uid),
            "prompt": first["prompt"],
            "responses": [str(r) for r in group["response"]],
            "data_source": first["data_source"],
            "reward_model": {"style": "rule", "ground_truth": str(first["ground_truth"])},
        })
    return pd.DataFrame(rows)


def take_rows(src: str, dest: str, n: int | None) -> str:
    """Write the first ``n`` rows of parquet ``src`` to ``dest`` (all rows when n is None or <=0)."""
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    if n and n > 0:
        table = table.slice(0, min(n, table.num_rows))
    with atomic_write(dest) as fh:
        pq.write_table(table, fh)
    return dest


def _squash(text: Any) -> str:
    return "".join(str(text or "").split())


def questions_by_prompt_id(sample_paths: Iterable[str], val_file: str | None) -> dict[str, str]:
    """``{prompt_id: raw question}`` for validation samples, from the validation parquet.

    Validation walks the dataset in order (no shuffle) and repeats each prompt ``n`` times, so in
    each sample file the k-th distinct ``uid`` is row k of ``val_file``. A pairing is kept only when
    the row's ``extra_info.question`` (whitespace removed) occurs in the decoded prompt (whitespace
    removed), so a filtered or reordered dataset yields no wrong question, only a missing one.
    """
    if not val_file or not Path(val_file).exists():
        return {}
    val = pd.read_parquet(val_file)
    if "extra_info" not in val.columns:
        return {}
    questions = [e.get("question") if isinstance(e, dict) else None for e in val["extra_info"]]
    out: dict[str, str] = {}
    for path in sample_paths:
        df = pd.read_parquet(path, columns=["uid", "prompt", "data_source"])
        firsts = df.drop_duplicates("uid", keep="first").reset_index(drop=True)
        for k, row in firsts.iterrows():
            q = questions[k] if k < len(questions) else None
            if q and _squash(q) in _squash(row["prompt"]):
                out[prompt_id(row["prompt"], row["data_source"])] = str(q)
    return out
