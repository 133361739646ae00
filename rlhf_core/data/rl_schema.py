"""verl's RL schema checked on every row of a parquet table with pyarrow compute (no Python loop over rows), so a
1 M-row file checks in about a second; the first failing row is named (file, row index, field).

verl's RL schema (``verl/utils/dataset/rl_dataset.py``): ``prompt`` (``data.prompt_key``) a non-empty list of chat
messages ``{"role": str, "content": str}``, ``data_source`` a string, ``reward_model`` a struct whose
``ground_truth`` is set. Only these cheap checks run here; rendering the chat template and tokenising (the data
stage's ``filter_overlong_prompts``, ``rlhf_core.data.prompts``) are not part of it.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlhf_core.data import DataError

_FALLBACK_ROWS = 65_536  # rows per batch of the row-by-row check (columns of another type than the schema's)


def rl_columns(prompt_key: str = "prompt") -> list[str]:
    """The columns the schema check reads: ``[prompt_key, "data_source", "reward_model"]``."""
    return [prompt_key, "data_source", "reward_model"]


def check_rl_schema(schema: pa.Schema, name: str, prompt_key: str = "prompt") -> None:
    """The columns of verl's RL schema are there, and ``reward_model`` is a struct with ``ground_truth``.

    Raises:
        DataError: naming the file ``name`` and the missing column or field (with the columns the file has).
    """
    columns = set(schema.names)
    for column in rl_columns(prompt_key):
        if column not in columns:
            raise DataError(f"{name}: missing column {column!r} (verl's RL schema: {prompt_key}, data_source, "
                            f"reward_model.ground_truth); the file has {sorted(columns)}")
    rm_type = schema.field("reward_model").type
    if not pa.types.is_struct(rm_type) or rm_type.get_field_index("ground_truth") < 0:
        raise DataError(f"{name}: column 'reward_model' has no field 'ground_truth' (type {rm_type})")


def check_rl_table(table: pa.Table, name: str, prompt_key: str = "prompt") -> None:
    """Check a table against verl's RL schema, every row (:func:`check_rl_schema`, then the rows).

    Columns of the schema's types (``prompt`` a list of structs with string ``role`` and ``content``,
    ``data_source`` a string) are checked with pyarrow compute; a column of another type is checked row by row in
    Python, ``_FALLBACK_ROWS`` rows at a time (it fails at its first row that breaks the schema).

    Raises:
        DataError: one line naming the file, the first failing row and the field: a missing column (no row); a
            prompt that is a string where verl has a list of chat messages, an empty or null prompt, or a message
            without a string role/content (with its index); a ``data_source`` that is not a string; an empty
            ``reward_model.ground_truth``. Within a row, the prompt is checked first, then data_source, then
            reward_model (as a row-by-row check would).
    """
    check_rl_schema(table.schema, name, prompt_key)
    schema = table.schema
    if not (_messages_typed(schema.field(prompt_key).type) and _string_typed(schema.field("data_source").type)):
        _check_rows_in_python(table, name, prompt_key)
        return
    prompts = _combined(table.column(prompt_key))
    rm = _combined(table.column("reward_model"))
    messages = pc.list_flatten(prompts)  # every message of every row; list_parent_indices maps them to rows
    bad_message = _first_true(pc.or_kleene(pc.is_null(messages), _null_fields(messages)))
    empty = pc.equal(pc.list_value_length(prompts), 0)
    rows = [_first_true(pc.or_kleene(pc.is_null(prompts), empty)),  # a null or [] prompt
            None if bad_message is None else int(pc.list_parent_indices(prompts)[bad_message].as_py()),
            _first_true(pc.is_null(table.column("data_source"))),
            _first_true(pc.or_kleene(pc.is_null(rm), pc.is_null(pc.struct_field(rm, "ground_truth"))))]
    found = [r for r in rows if r is not None]
    if found:  # the first failing row's message comes from the row-by-row check of that row
        row = min(found)
        _check_rows_in_python(table.slice(row, 1), name, prompt_key, first_row=row)
        # a safety net, never reached while the search above agrees with the row check: the rest, row by row
        _check_rows_in_python(table.slice(row), name, prompt_key, first_row=row)


def distinct_first_rows(column: pa.Array | pa.ChunkedArray) -> tuple[list[Any], list[int]]:
    """``(values, rows)``: the distinct values of ``column`` (nulls included, as None) in first-seen order, and the
    row of each one's first occurrence (pyarrow's dictionary encoding and ``numpy.unique``: no Python loop)."""
    encoded = pc.dictionary_encode(_combined(column), null_encoding="encode")
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    _, first = np.unique(codes, return_index=True)  # codes are numbered in first-seen order
    return encoded.dictionary.to_pylist(), [int(i) for i in first]


def _check_rows_in_python(table: pa.Table, name: str, prompt_key: str, first_row: int = 0) -> None:
    from rlhf_core.data.rl_dataset import validate_messages

    offset = first_row
    for batch in table.select(rl_columns(prompt_key)).to_batches(max_chunksize=_FALLBACK_ROWS):
        rows = zip(*(batch.column(i).to_pylist() for i in range(3)))
        for i, (prompt, source, rm) in enumerate(rows, start=offset):
            where = f"{name} row {i}"
            if isinstance(prompt, str):
                raise DataError(f"{where}: column {prompt_key!r} is a string where verl has a list of chat messages "
                                f"[{{role, content}}] (got {prompt[:40]!r})")
            validate_messages(prompt, where, prompt_key)
            if not isinstance(source, str):
                raise DataError(f"{where}: column 'data_source' must be a string, got {type(source).__name__}")
            if not isinstance(rm, dict) or rm.get("ground_truth") is None:
                raise DataError(f"{where}: column 'reward_model.ground_truth' is empty")
        offset += batch.num_rows


def _messages_typed(t: pa.DataType) -> bool:
    """A list of structs whose ``role`` and ``content`` are strings (the type pandas/verl write for chat prompts)."""
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
        return False
    fields = t.value_type
    return all(fields.get_field_index(k) >= 0 and _string_typed(fields.field(k).type) for k in ("role", "content"))


def _string_typed(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _null_fields(messages: pa.Array) -> pa.Array:
    return pc.or_kleene(pc.is_null(pc.struct_field(messages, "role")), pc.is_null(pc.struct_field(messages, "content")))


def _combined(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks else pa.array([], type=column.type)
    return column


def _first_true(mask: pa.Array | pa.ChunkedArray) -> int | None:
    """The index of the first true value of a boolean array (nulls count as false), or None."""
    i = pc.index(pc.fill_null(mask, False), True).as_py()
    return None if i < 0 else int(i)
