"""Read parquet / jsonl rows (local or remote) into plain Python dicts, with errors that name file and row."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlhf_core.atomic import atomic_write
from rlhf_core.data import DataError
from rlhf_core.data.fs import copy_to_local


@dataclass(frozen=True)
class RowSource:
    """Where a row came from: the file as the user named it and the 0-based row (jsonl: 1-based line)."""

    file: str
    row: int
    is_line: bool = False

    def __str__(self) -> str:
        return f"{self.file} {'line' if self.is_line else 'row'} {self.row}"


def _format(path: str) -> str:
    lower = path.lower()
    if lower.endswith((".jsonl", ".json", ".jsonl.gz")):
        return "jsonl"
    if lower.endswith(".parquet") or lower.endswith(".pq"):
        return "parquet"
    raise DataError(f"{path}: unknown data file format (expected .parquet or .jsonl)")


def read_parquet_rows(path: str, display: str | None = None) -> list[dict[str, Any]]:
    """All rows of a local parquet file as dicts (structs become dicts, lists of structs lists of dicts).

    Raises:
        DataError: when the file is not readable parquet (names the file).
    """
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{display or path}: not a readable parquet file ({exc})") from exc
    return table.to_pylist()


def read_jsonl_rows(path: str, display: str | None = None) -> tuple[list[dict[str, Any]], list[int]]:
    """Rows of a local jsonl file and their 1-based line numbers (blank lines skipped).

    Raises:
        DataError: on a line that is not UTF-8, not JSON, or not a JSON object (names file and line).
    """
    name = display or path
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{name} line {lineno}: not valid UTF-8 ({exc})") from exc
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(f"{name} line {lineno}: not valid JSON ({exc})") from exc
            if not isinstance(obj, dict):
                raise DataError(f"{name} line {lineno}: expected a JSON object, got {type(obj).__name__}")
            rows.append(obj)
            lines.append(lineno)
    return rows, lines


def read_rows(files: str | list[str], cache_dir: str | None = None) -> tuple[list[dict[str, Any]], list[RowSource]]:
    """Read and concatenate every file (parquet or jsonl; local path or fsspec URL).

    Returns:
        ``(rows, sources)``, equal length; ``sources[i]`` says where ``rows[i]`` came from.

    Raises:
        DataError: unknown format, unreadable / corrupt file, bad jsonl line, or an empty file.
        FileNotFoundError: a file that does not exist.
    """
    files = [files] if isinstance(files, str) else list(files)
    if not files:
        raise DataError("no data files given")
    rows: list[dict[str, Any]] = []
    sources: list[RowSource] = []
    for name in files:
        fmt = _format(name)
        local = copy_to_local(str(name), cache_dir=cache_dir)
        if not os.path.exists(local):
            raise FileNotFoundError(f"data file {name} does not exist")
        if fmt == "parquet":
            got = read_parquet_rows(local, display=name)
            srcs = [RowSource(name, i) for i in range(len(got))]
        else:
            got, lines = read_jsonl_rows(local, display=name)
            srcs = [RowSource(name, ln, is_line=True) for ln in lines]
        if not got:
            raise DataError(f"{name}: the file has no rows")
        rows.extend(got)
        sources.extend(srcs)
    return rows, sources


def write_parquet_atomic(rows: list[dict[str, Any]], path: str) -> None:
    """Write ``rows`` to ``path`` as parquet atomically (:func:`rlhf_core.atomic.atomic_write`)."""
    with atomic_write(os.path.expanduser(path)) as fh:
        pq.write_table(pa.Table.from_pylist(rows), fh)
