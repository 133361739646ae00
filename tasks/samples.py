"""The validation sample files as plain functions (no Prefect, no Ray, no MLflow): the raw question of each
validated prompt (:func:`questions_by_prompt_id`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from infra.results_schema import prompt_id


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
