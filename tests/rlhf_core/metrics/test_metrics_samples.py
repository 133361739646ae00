"""Per-sample parquet files: schema, types, atomic replace, row building."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_core.metrics.samples import make_sample_rows, render_prompt, write_samples_parquet


def test_rows_written_with_fixed_types(tmp_path):
    rows = make_sample_rows(
        step=3, data_sources=["gsm", "gsm", "gsm"], uids=["u1", "u1", "u2"],
        prompts=[[{"role": "user", "content": "2+2?"}], [{"role": "user", "content": "2+2?"}], "plain"],
        responses=["4", "5", "x"], ground_truths=["4", "4", ["a", "b"]], scores=[1.0, 0, 1],
        extra={"acc": [True, False, None], "pred": ["4", 5, None], "score": [9, 9, 9]},
    )
    assert [r["sample_idx"] for r in rows] == [0, 1, 0]  # counted within each uid
    path = write_samples_parquet(rows, str(tmp_path / "out"), "val_step_3")
    assert path == str(tmp_path / "out" / "val_step_3.parquet")
    table = pq.read_table(path)
    assert table.column_names == ["step", "data_source", "uid", "sample_idx", "prompt", "response",
                                  "ground_truth", "score", "acc", "pred"]  # extra "score" does not clash
    schema = table.schema
    assert schema.field("step").type == pa.int64() and schema.field("score").type == pa.float64()
    assert schema.field("acc").type == pa.float64()  # bools and None → float with nulls
    assert schema.field("pred").type == pa.string()  # mixed str/int → text
    d = table.to_pydict()
    assert d["prompt"][0] == "user: 2+2?" and d["prompt"][2] == "plain"
    assert d["ground_truth"] == ["4", "4", '["a", "b"]']
    assert d["acc"] == [1.0, 0.0, None] and d["pred"] == ["4", "5", None]
    assert d["score"] == [1.0, 0.0, 1.0]
    assert os.listdir(tmp_path / "out") == ["val_step_3.parquet"]  # no temporary file left behind


def test_rewrite_replaces_and_errors(tmp_path):
    row = {"step": 0, "data_source": "d", "uid": "0", "sample_idx": 0, "prompt": "p", "response": "r",
           "ground_truth": "g", "score": 0.5}
    write_samples_parquet([row, row], str(tmp_path), "eval.parquet")
    write_samples_parquet([row], str(tmp_path), "eval")
    assert pq.read_table(tmp_path / "eval.parquet").num_rows == 1
    with pytest.raises(ValueError, match="score"):
        write_samples_parquet([{k: v for k, v in row.items() if k != "score"}], str(tmp_path), "bad")
    assert not (tmp_path / "bad.parquet").exists()
    empty = pq.read_table(write_samples_parquet([], str(tmp_path), "empty"))
    assert empty.num_rows == 0 and "score" in empty.column_names
    with pytest.raises(ValueError, match="length"):
        make_sample_rows(0, ["d"], ["u", "v"], ["p"], ["r"], ["g"], [1.0])


def test_render_prompt_forms():
    assert render_prompt([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]) == "system: s\nuser: q"
    assert render_prompt(None) == ""


def test_dataframe_input(tmp_path):
    import pandas as pd

    df = pd.DataFrame({"step": [1, 1], "data_source": ["d", "d"], "uid": [7, 7], "sample_idx": [0, 1],
                       "prompt": ["p", "p"], "response": ["a", "b"], "ground_truth": [4, 4],
                       "score": [1, 0], "pred": ["4", "5"]})
    d = pq.read_table(write_samples_parquet(df, str(tmp_path), "df")).to_pydict()
    # ints become the schema's text / float columns: uid 7 → "7", ground truth 4 → "4", score 1 → 1.0
    assert d["uid"] == ["7", "7"] and d["ground_truth"] == ["4", "4"] and d["score"] == [1.0, 0.0]
    assert d["pred"] == ["4", "5"]
