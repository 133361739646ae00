"""Bad data files, refused through ``run_ppo`` (what ``rlhf ppo`` runs) with the file, row and field named, before
Ray starts — so before any worker or model is loaded — and without writing anything."""
from __future__ import annotations

import textwrap

import pytest

from rlhf_core.data import DataError

from bad_input_fixtures import good_rows, listing, ppo_error, ppo_overrides, verl_row, write_jsonl, write_parquet


def _null_prompt(rows):
    rows[2]["prompt"] = None
    return rows


def _no_content(rows):
    rows[1]["prompt"] = [{"role": "user"}]
    return rows


def _string_reward_model(rows):
    rows[3]["reward_model"] = "42"
    return rows


def _no_ground_truth(rows):
    rows[1]["reward_model"] = {"style": "rule"}
    return rows


@pytest.mark.parametrize("make_rows, expected", [
    # wrong schema: the column named by data.prompt_key is missing (row 0 is the first one read)
    (lambda rows: [{k: v for k, v in r.items() if k != "prompt"} for r in rows],
     "train.parquet row 0: missing column 'prompt' (data.prompt_key)"),
    (_null_prompt, "train.parquet row 2: field 'prompt' must be a non-empty list of chat messages, got NoneType"),
    (_no_content, "train.parquet row 1: field 'prompt'[0] has no 'content'"),
    # parquet cannot hold a string where other rows have a struct: jsonl can (line numbers are 1-based)
    (_string_reward_model, "train.jsonl line 4: field 'reward_model' must be dict, got str"),
    (_no_ground_truth, "train.parquet row 1: the default reward function needs reward_model.ground_truth"),
], ids=["wrong_schema", "null_prompt", "message_without_content", "reward_model_not_a_dict", "no_ground_truth"])
def test_bad_rows_name_file_row_and_field(tiny_model_dir, tmp_path, make_rows, expected):
    import json

    rows = make_rows(good_rows(4))
    name = expected.split(" ")[0]
    data = (write_parquet(tmp_path / name, rows) if name.endswith(".parquet")
            else write_jsonl(tmp_path / name, [json.dumps(r) for r in rows]))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data), DataError)
    assert expected in msg and data in msg
    assert listing(tmp_path) == [name]  # nothing written next to the data


def test_empty_parquet_is_refused(tiny_model_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(good_rows(1)).slice(0, 0), str(path))  # the schema, no rows
    assert ppo_error(ppo_overrides(tiny_model_dir, str(path)), DataError) == f"{path}: the file has no rows"


def test_corrupt_parquet_is_refused(tiny_model_dir, tmp_path):
    path = tmp_path / "train.parquet"
    good = write_parquet(path, good_rows(4))
    path.write_bytes(open(good, "rb").read()[:100])  # truncated mid-file, as a copy that died
    msg = ppo_error(ppo_overrides(tiny_model_dir, str(path)), DataError)
    assert msg.startswith(f"{path}: not a readable parquet file")


def test_missing_data_file_is_named(tiny_model_dir, tmp_path):
    msg = ppo_error(ppo_overrides(tiny_model_dir, str(tmp_path / "nope.parquet")), FileNotFoundError)
    assert msg == f"data file {tmp_path / 'nope.parquet'} does not exist"


def test_unknown_file_format_is_named(tiny_model_dir, tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("prompt,answer\nhi,1\n")
    assert ppo_error(ppo_overrides(tiny_model_dir, str(path)), DataError) == \
        f"{path}: unknown data file format (expected .parquet or .jsonl)"


def test_jsonl_line_that_is_not_json_names_the_line(tiny_model_dir, tmp_path):
    import json

    lines = [json.dumps(r) for r in good_rows(4)]
    lines[2] = '{"prompt": [{"role": "user", "content": "unterminated'
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    assert ppo_error(ppo_overrides(tiny_model_dir, path), DataError).startswith(f"{path} line 3: not valid JSON")


def test_batch_larger_than_the_data_is_refused_before_ray(tiny_model_dir, tmp_path):
    # 3 rows, train_batch_size 4: the loader drops the partial batch, so the run would have no step at all
    data = write_parquet(tmp_path / "train.parquet", good_rows(3))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data), DataError)
    assert msg.startswith(f"data.train_batch_size=4 is larger than the 3 training rows of data.train_files=['{data}']")


def test_custom_dataset_class_that_is_not_a_dataset(tiny_model_dir, tmp_path):
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    mod = tmp_path / "my_data.py"
    mod.write_text(textwrap.dedent("""
        class Prompts:          # not a torch.utils.data.Dataset
            def __init__(self, **kwargs):
                raise AssertionError("must not be constructed")
    """))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, f"data.custom_cls.path={mod}", "data.custom_cls.name=Prompts"),
                    TypeError)
    assert msg.startswith(f"data.custom_cls {mod}:Prompts must be a torch.utils.data.dataset.Dataset subclass")


def test_custom_dataset_file_missing(tiny_model_dir, tmp_path):
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    missing = tmp_path / "absent.py"
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, f"data.custom_cls.path={missing}",
                                  "data.custom_cls.name=Prompts"), FileNotFoundError)
    assert msg == (f"data.custom_cls.path: no such file {str(missing)!r} (looked for {missing}; a file path is "
                   "needed, module names are not looked up on sys.path)")


def test_good_rows_pass_these_checks(tiny_model_dir, tmp_path):
    # the control: the same files without the defect get past every check above (datasets built, no error)
    from rlhf_core.config import load_config
    from rlhf_core.trainer.main_ppo import build_datasets, load_driver_tokenizer

    data = write_parquet(tmp_path / "train.parquet", good_rows(4) + [verl_row("extra", "1", 4)])
    cfg = load_config("ppo_trainer", ppo_overrides(tiny_model_dir, data))
    train, val = build_datasets(cfg, load_driver_tokenizer(cfg))
    assert len(train) == 5 and val is None
