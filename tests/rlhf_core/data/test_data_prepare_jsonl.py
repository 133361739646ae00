"""The pipeline's data stages read parquet only: a verl jsonl file (which `rlhf ppo` reads) is refused with the
conversion that makes it parquet, in prepare_data and in the dry run, and that conversion yields a file they take."""
from __future__ import annotations

import re

import pandas as pd
import pytest
from tests.fixtures.data_fixtures import verl_row, write_jsonl

from rlhf_core.data import DataError
from rlhf_core.data.prepare import gather


def test_jsonl_is_refused_with_a_conversion_that_works(tmp_path):
    from flows.preflight import _rl_file

    src = write_jsonl(tmp_path / "train.jsonl", [verl_row("What is 2+2?", "4", 0), verl_row("1+1?", "2", 1)])
    for check in (lambda: gather([src], str(tmp_path / "out.parquet"), -1), lambda: _rl_file(src, "prompt")):
        with pytest.raises(DataError) as err:  # before: "not a readable parquet file (Parquet magic bytes ...)"
            check()
        assert str(err.value).startswith(f"{src}: the pipeline reads parquet files only")
    command = re.search(r'python -c "(.*)" and list', str(err.value)).group(1)
    exec(command)  # noqa: S102 - the very line the message tells the user to run
    converted = tmp_path / "train.parquet"
    out = gather([str(converted)], str(tmp_path / "out.parquet"), -1)
    assert out["rows"] == 2 and "all 2 rows in verl's RL schema" in _rl_file(str(converted), "prompt")
    assert pd.read_parquet(converted)["prompt"][0][0]["content"] == "What is 2+2?"
