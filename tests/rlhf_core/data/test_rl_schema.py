"""verl's RL schema checked on every row with pyarrow (rlhf_core/data/rl_schema.py): the first failing row named,
the same verdict as the row-by-row check, and the distinct data sources with their first rows."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from rlhf_core.data import DataError
from rlhf_core.data.rl_schema import _check_rows_in_python, check_rl_table, distinct_first_rows


def _rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"what is {i}+1?"}],
             "data_source": "toy", "reward_model": {"style": "rule", "ground_truth": str(i + 1)}} for i in range(n)]


TYPE = pa.schema([("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
                  ("data_source", pa.string()),
                  ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())]))])


def _table(rows: list[dict], chunk: int | None = None) -> pa.Table:
    """``rows`` in the schema's types; ``chunk``: built from tables of that many rows (several row groups)."""
    if chunk is None:
        return pa.Table.from_pylist(rows, schema=TYPE)
    return pa.concat_tables([pa.Table.from_pylist(rows[i:i + chunk], schema=TYPE) for i in range(0, len(rows), chunk)])


def _error(table: pa.Table, check=check_rl_table) -> str | None:
    try:
        check(table, "f.parquet", "prompt")
    except DataError as exc:
        return str(exc)
    return None


BREAKS = {  # what breaks a row -> the message naming the row, the field (and the message index)
    "null prompt": (lambda r: r.update(prompt=None),
                    "field 'prompt' must be a non-empty list of chat messages, got NoneType"),
    "empty prompt": (lambda r: r.update(prompt=[]),
                     "field 'prompt' must be a non-empty list of chat messages, got list"),
    "null message": (lambda r: r["prompt"].__setitem__(1, None),
                     "field 'prompt'[1] must be a dict with role and content, got NoneType"),
    "no role": (lambda r: r["prompt"][1].update(role=None), "field 'prompt'[1] has no 'role'"),
    "no content": (lambda r: r["prompt"][0].update(content=None), "field 'prompt'[0] has no 'content'"),
    "null data_source": (lambda r: r.update(data_source=None), "column 'data_source' must be a string, got NoneType"),
    "null reward_model": (lambda r: r.update(reward_model=None), "column 'reward_model.ground_truth' is empty"),
    "no ground_truth": (lambda r: r["reward_model"].update(ground_truth=None),
                        "column 'reward_model.ground_truth' is empty"),
}


@pytest.mark.parametrize("kind", sorted(BREAKS))
def test_a_bad_row_far_past_the_first_rows_is_named(kind):
    rows = _rows(3000)
    BREAKS[kind][0](rows[2718])  # past the 5 rows the dry run read before, in the third of 1000-row chunks
    assert _error(_table(rows, chunk=1000)) == f"f.parquet row 2718: {BREAKS[kind][1]}"


def test_the_first_failing_row_wins_and_within_a_row_the_prompt_comes_first():
    rows = _rows(50)
    rows[40]["prompt"] = []           # a later row with a prompt fault
    rows[30]["data_source"] = None    # row 30: both its reward_model and its data_source fail ...
    rows[30]["reward_model"] = None
    rows[30]["prompt"][1]["role"] = None  # ... and its prompt, which the row-by-row order reports first
    assert _error(_table(rows)) == "f.parquet row 30: field 'prompt'[1] has no 'role'"
    rows[30]["prompt"][1]["role"] = "user"
    assert _error(_table(rows)) == "f.parquet row 30: column 'data_source' must be a string, got NoneType"


def test_other_column_types_are_checked_row_by_row_with_the_same_messages():
    rows = _rows(4)
    table = pa.Table.from_pylist([{**r, "data_source": 7} for r in rows])  # int column: not the schema's type
    assert _error(table) == "f.parquet row 0: column 'data_source' must be a string, got int"
    table = pa.Table.from_pylist([{**r, "prompt": "what is 1+1?"} for r in rows])
    assert _error(table) == ("f.parquet row 0: column 'prompt' is a string where verl has a list of chat messages "
                             "[{role, content}] (got 'what is 1+1?')")
    with_list_content = [{**r, "prompt": [{"role": "user", "content": ["a"]}]} for r in rows]
    assert _error(pa.Table.from_pylist(with_list_content)) == ("f.parquet row 0: field 'prompt'[0].content must be a "
                                                               "string, got list")
    assert _error(_table(rows)) is None
    assert _error(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "data_source"} for r in rows])).startswith(
        "f.parquet: missing column 'data_source' (verl's RL schema: prompt, data_source, reward_model.ground_truth)")


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_check_gives_the_row_by_row_verdict(seed):
    # random faults at random rows of a multi-chunk table: the pyarrow check names exactly what the plain loop names
    rng = random.Random(seed)
    rows = _rows(400)
    for _ in range(rng.randint(0, 3)):
        BREAKS[rng.choice(sorted(BREAKS))][0](rows[rng.randrange(400)])
    table = _table(rows, chunk=rng.choice([None, 7, 128]))
    assert _error(table) == _error(table, _check_rows_in_python)


def test_distinct_first_rows_in_first_seen_order_across_chunks():
    column = pa.chunked_array([["gsm8k", "toy"], ["gsm8k", None, "math", "toy"]])
    # rows 0..5: gsm8k first at 0, toy at 1, null at 3, math at 4 (first-seen order)
    assert distinct_first_rows(column) == (["gsm8k", "toy", None, "math"], [0, 1, 3, 4])
