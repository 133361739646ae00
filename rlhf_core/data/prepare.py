"""Data preparation for an experiment: copy (fsspec), check verl's RL schema, cut, filter overlong prompts, digest.

Plain functions (no Prefect, no MLflow): ``tasks.stages.prepare_data`` and ``filter_prompts`` call them, and
``rlhf pipeline --dry-run`` calls :func:`check_rl_table` (:mod:`rlhf_core.data.rl_schema`: verl's RL schema, every
row, with pyarrow compute) on every file.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from rlhf_core.atomic import atomic_write
from rlhf_core.data import DataError
from rlhf_core.data.fs import copy_to_local
from rlhf_core.data.rl_schema import check_rl_table


def file_sha256(path: str) -> str:
    """sha256 of a local file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def refuse_jsonl(name: str) -> None:
    """The pipeline's data stages read parquet only (``rlhf ppo`` reads jsonl too, as verl 0.9): a ``.jsonl`` /
    ``.json`` file is refused with the one-line conversion instead of "not a readable parquet file".

    Raises:
        DataError: naming the file and the command that converts it.
    """
    if str(name).lower().endswith((".jsonl", ".json", ".jsonl.gz")):
        stem = str(name).rsplit(".json", 1)[0]
        raise DataError(f"{name}: the pipeline reads parquet files only (rlhf ppo also reads jsonl); convert it: "
                        f"python -c \"import pandas as pd; pd.read_json('{name}', lines=True)"
                        f".to_parquet('{stem}.parquet')\" and list the .parquet file")


def read_table(name: str, local: str, limit: int | None = None) -> pa.Table:
    """The parquet file ``local`` (shown as ``name`` in errors), its first ``limit`` rows when given.

    Raises:
        DataError: a jsonl file (:func:`refuse_jsonl`), not a readable parquet file, or no rows (names the file).
    """
    refuse_jsonl(name)
    try:
        if limit is None:
            table = pq.read_table(local)
        else:
            reader = pq.ParquetFile(local)
            table = next(reader.iter_batches(batch_size=limit), None)
            table = pa.Table.from_batches([table]) if table is not None else reader.schema_arrow.empty_table()
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{name}: not a readable parquet file ({exc})") from exc
    if table.num_rows == 0:
        raise DataError(f"{name}: the file has no rows")
    return table


def gather(files: Sequence[str], dest: str, max_samples: int, prompt_key: str = "prompt",
           check: bool = True, cache_dir: str | None = None) -> dict[str, Any]:
    """Copy ``files`` (paths or fsspec URLs) once into the cache, check each (:func:`check_rl_table` when
    ``check``), concatenate them in order, keep the first ``max_samples`` rows (``<= 0``: all) and write ``dest``.

    Returns:
        ``{"path": dest, "rows": rows written, "sha256": dest's digest, "inputs": [{"file", "sha256", "rows"}]}``
        (``sha256`` of each input file's bytes).

    Raises:
        FileNotFoundError: a file that does not exist (naming it). DataError: :func:`read_table` /
        :func:`check_rl_table`, or no files.
    """
    if not files:
        raise DataError(f"{dest}: no data files given")
    tables, inputs = [], []
    for name in files:
        try:
            local = copy_to_local(str(name), cache_dir=cache_dir)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"data file {name} does not exist") from exc
        if not os.path.exists(local):
            raise FileNotFoundError(f"data file {name} does not exist")
        table = read_table(str(name), local)
        if check:
            check_rl_table(table, str(name), prompt_key)
        tables.append(table)
        inputs.append({"file": str(name), "sha256": file_sha256(local), "rows": table.num_rows})
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")
    if max_samples > 0:
        table = table.slice(0, min(max_samples, table.num_rows))
    with atomic_write(dest) as fh:
        pq.write_table(table, fh)
    return {"path": dest, "rows": table.num_rows, "sha256": file_sha256(dest), "inputs": inputs}


def filter_overlong(src: str, dest: str, tokenizer: Any, max_prompt_length: int, workers: int = 1,
                    prompt_key: str = "prompt", template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Keep the rows of ``src`` whose prompt, rendered with the tokenizer's chat template, has at most
    ``max_prompt_length`` tokens (verl's ``filter_overlong_prompts``; ``workers`` processes:
    ``rlhf_core.data.prompts.keep_short_prompts``), in order, and write them to ``dest``.

    Returns:
        ``{"path": dest, "kept": n, "dropped": m, "sha256": dest's digest}``.
    """
    from rlhf_core.data.prompts import keep_short_prompts

    table = pq.read_table(src)
    prompts = table.column(prompt_key).to_pylist()
    kept = keep_short_prompts(tokenizer, prompts, max_prompt_length, workers, template_kwargs)
    out = table.take(pa.array(kept, type=pa.int64()))
    with atomic_write(dest) as fh:
        pq.write_table(out, fh)
    return {"path": dest, "kept": len(kept), "dropped": table.num_rows - len(kept), "sha256": file_sha256(dest)}
