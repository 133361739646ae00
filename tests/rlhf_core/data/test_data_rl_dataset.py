"""RLHFDataset: every data.* key, the overlong filter, bad input, custom_cls, collate_fn, verl parquet parity."""
from __future__ import annotations

import json
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pytest
import torch

from tests.fixtures.data_fixtures import ppo_data_cfg, verl_row, write_jsonl, write_parquet  # noqa: E402

from rlhf_core.data import DataError  # noqa: E402
from rlhf_core.data.gsm8k import INSTRUCTION, preprocess_gsm8k  # noqa: E402
from rlhf_core.data.prompts import truncate_ids  # noqa: E402
from rlhf_core.data.factory import create_rl_dataset  # noqa: E402
from rlhf_core.data.rl_dataset import RLHFDataset, collate_fn, render_prompt  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Remote copies go to a per-test cache ($RLHF_HOME/cache), never the user's ~/.cache/rlhf."""
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "rlhf_home"))


def ids_of(tok, question: str) -> list[int]:
    """The reference rendering: chat template with generation prompt, then ids without special tokens."""
    text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                   tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


QUESTIONS = ["How many apples?", "Tom has 3 cats and 2 dogs. How many pets does he have in total?",
             "A train leaves at noon going 60 miles per hour; when does it arrive 150 miles away at the station?"]


@pytest.fixture
def small_parquet(tmp_path):
    return write_parquet(tmp_path / "small.parquet", [verl_row(q, str(i), index=100 + i) for i, q in
                                                       enumerate(QUESTIONS)])


def test_left_padding_mask_and_positions(tiny_tokenizer, small_parquet):
    ref = ids_of(tiny_tokenizer, QUESTIONS[0])
    n = len(ref)
    # rows 1 and 2 are longer than n + 3: truncate them so the dataset builds; row 0 is not truncated
    ds = RLHFDataset(small_parquet, tiny_tokenizer, ppo_data_cfg(max_prompt_length=n + 3, truncation="left"))
    item = ds[0]
    pad = tiny_tokenizer.pad_token_id
    assert item["input_ids"].dtype == torch.int64 and item["input_ids"].shape == (n + 3,)
    assert item["input_ids"].tolist() == [pad] * 3 + ref
    assert item["attention_mask"].tolist() == [0, 0, 0] + [1] * n
    # clamp(cumsum(mask) - 1, 0): three pads at 0, then 0, 1, ..., n-1
    assert item["position_ids"].tolist() == [0, 0, 0] + list(range(n))
    assert item["raw_prompt_ids"] == ref
    assert item["data_source"] == "openai/gsm8k" and item["ability"] == "math"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "0"}
    assert item["index"] == 100  # from extra_info.index
    assert "raw_prompt" not in item and "full_prompts" not in item and "raw_input_ids" not in item
    assert "prompt" not in item


def test_return_flags(tiny_tokenizer, small_parquet):
    cfg = ppo_data_cfg(max_prompt_length=64, return_raw_chat=True, return_full_prompt=True,
                       return_raw_input_ids=True)
    item = RLHFDataset(small_parquet, tiny_tokenizer, cfg)[1]
    messages = [{"role": "user", "content": QUESTIONS[1]}]
    assert item["raw_prompt"] == messages
    assert item["full_prompts"] == render_prompt(tiny_tokenizer, messages)
    assert item["full_prompts"].endswith("<|im_start|>assistant\n")
    # un-templated: just the question's ids, without <|im_start|>user etc.
    assert item["raw_input_ids"] == tiny_tokenizer(QUESTIONS[1], add_special_tokens=False)["input_ids"]


def test_truncate_ids_examples():
    ids = list(range(10))
    assert truncate_ids(ids, 5, "middle") == [0, 1, 7, 8, 9]  # first 5//2=2, last 5-2=3
    assert truncate_ids(ids, 5, "left") == [5, 6, 7, 8, 9]
    assert truncate_ids(ids, 5, "right") == [0, 1, 2, 3, 4]
    assert truncate_ids(ids, 10, "error") == ids  # exactly at the limit is fine
    with pytest.raises(DataError, match="row 7"):
        truncate_ids(ids, 9, "error", where="f.parquet row 7")
    with pytest.raises(ValueError):
        truncate_ids(ids, 5, "sideways")


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_applies_to_every_view(tiny_tokenizer, small_parquet, mode):
    full = ids_of(tiny_tokenizer, QUESTIONS[2])
    L = 9
    expected = {"left": full[-L:], "right": full[:L], "middle": full[:4] + full[-5:]}[mode]
    item = RLHFDataset(small_parquet, tiny_tokenizer, ppo_data_cfg(max_prompt_length=L, truncation=mode))[2]
    assert item["input_ids"].tolist() == expected  # no pads: the prompt fills all L slots
    assert item["attention_mask"].tolist() == [1] * L
    assert item["raw_prompt_ids"] == expected  # the rollout engine sees the same truncation


def test_truncation_error_names_the_row_at_construction(tiny_tokenizer, small_parquet):
    # truncation=error fails when the dataset is built (before any model is loaded), naming the first overlong row
    lengths = [len(ids_of(tiny_tokenizer, q)) for q in QUESTIONS]
    limit = lengths[1]  # rows 0 and 1 fit (lengths increase), row 2 is longer
    with pytest.raises(DataError, match=rf"small.parquet row 2: prompt has {lengths[2]} tokens > "
                                        rf"data.max_prompt_length={limit}"):
        RLHFDataset(small_parquet, tiny_tokenizer, ppo_data_cfg(max_prompt_length=limit))
    ds = RLHFDataset(small_parquet, tiny_tokenizer, ppo_data_cfg(max_prompt_length=lengths[2]))
    assert len(ds) == 3  # exactly at the limit is fine


def test_filter_keeps_prompt_exactly_at_limit(tiny_tokenizer, small_parquet):
    lengths = [len(ids_of(tiny_tokenizer, q)) for q in QUESTIONS]
    assert lengths[0] < lengths[1] < lengths[2]
    cfg = ppo_data_cfg(max_prompt_length=lengths[1], filter_overlong_prompts=True)
    ds = RLHFDataset(small_parquet, tiny_tokenizer, cfg)
    assert ds.row_numbers == [0, 1]  # length == L kept, length L+k dropped
    assert ds[1]["attention_mask"].sum().item() == lengths[1]
    cfg.max_prompt_length = lengths[1] - 1
    assert RLHFDataset(small_parquet, tiny_tokenizer, cfg).row_numbers == [0]


def test_filter_two_workers_equals_one(tiny_tokenizer, gsm8k_dir, tmp_path):
    test_file = preprocess_gsm8k(str(gsm8k_dir), str(tmp_path))["test"]
    lengths = [len(ids_of(tiny_tokenizer, r["content"]))
               for r in (row["prompt"][0] for row in pd.read_parquet(test_file).to_dict("records"))]
    L = int(np.median(lengths))
    rows = {}
    for workers in (1, 2):
        cfg = ppo_data_cfg(max_prompt_length=L, filter_overlong_prompts=True, filter_overlong_prompts_workers=workers)
        rows[workers] = RLHFDataset(test_file, tiny_tokenizer, cfg).row_numbers
    assert rows[1] == rows[2] == [i for i, n in enumerate(lengths) if n <= L]
    assert 0 < len(rows[1]) < 1319


def test_max_samples_subset(tiny_tokenizer, tmp_path):
    path = write_parquet(tmp_path / "m.parquet", [verl_row(f"q{i}", index=i) for i in range(20)])
    ds = RLHFDataset(path, tiny_tokenizer, ppo_data_cfg(shuffle=False), max_samples=5)
    assert [ds[i]["index"] for i in range(len(ds))] == [0, 1, 2, 3, 4]
    ds = RLHFDataset(path, tiny_tokenizer, ppo_data_cfg(shuffle=True, seed=3), max_samples=5)
    expected = np.random.default_rng(3).choice(20, size=5, replace=False).tolist()
    assert ds.row_numbers == expected and expected != [0, 1, 2, 3, 4]
    again = RLHFDataset(path, tiny_tokenizer, ppo_data_cfg(shuffle=True, seed=3), max_samples=5)
    assert again.row_numbers == expected  # seeded: the same subset every time
    assert len(RLHFDataset(path, tiny_tokenizer, ppo_data_cfg(), max_samples=-1)) == 20


def test_index_falls_back_to_row_number_and_jsonl_and_remote(tiny_tokenizer, tmp_path):
    row = verl_row("What is 2+2?")
    del row["extra_info"]
    path = write_jsonl(tmp_path / "x.jsonl", [row, row])
    assert RLHFDataset(path, tiny_tokenizer, ppo_data_cfg())[1]["index"] == 1
    fsspec.filesystem("memory").pipe("/rl_remote/x.jsonl", Path(path).read_bytes())
    remote = RLHFDataset("memory://rl_remote/x.jsonl", tiny_tokenizer, ppo_data_cfg())
    assert remote[0]["raw_prompt_ids"] == ids_of(tiny_tokenizer, "What is 2+2?")
    both = RLHFDataset([path, "memory://rl_remote/x.jsonl"], tiny_tokenizer, ppo_data_cfg())
    assert len(both) == 4


def test_custom_prompt_key(tiny_tokenizer, tmp_path):
    row = verl_row("hello")
    row["chat"] = row.pop("prompt")
    path = write_jsonl(tmp_path / "k.jsonl", [row])
    item = RLHFDataset(path, tiny_tokenizer, ppo_data_cfg(prompt_key="chat", return_raw_chat=True))[0]
    assert item["raw_prompt"] == [{"role": "user", "content": "hello"}] and "chat" not in item


GOOD = json.dumps(verl_row("fine"))


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"data_source": "x"}, r"bad.jsonl line 2: missing column 'prompt'"),
        ({**verl_row("q"), "data_source": 5}, r"bad.jsonl line 2: field 'data_source' must be str"),
        ({**verl_row("q"), "reward_model": "42"}, r"bad.jsonl line 2: field 'reward_model' must be dict"),
        ({**verl_row("q"), "prompt": "just a string"}, r"line 2: field 'prompt' must be a non-empty list"),
        ({**verl_row("q"), "prompt": []}, r"line 2: field 'prompt' must be a non-empty list"),
        ({**verl_row("q"), "prompt": [{"content": "hi"}]}, r"line 2: field 'prompt'\[0\] has no 'role'"),
        ({**verl_row("q"), "prompt": [{"role": "user"}]}, r"line 2: field 'prompt'\[0\] has no 'content'"),
        ({**verl_row("q"), "prompt": ["hi"]}, r"line 2: field 'prompt'\[0\] must be a dict"),
    ],
)
def test_bad_rows_fail_at_construction(tiny_tokenizer, tmp_path, bad, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=needle):
        RLHFDataset(str(path), tiny_tokenizer, ppo_data_cfg())


def test_a_row_with_other_fields_is_refused_by_line(tiny_tokenizer, tmp_path):
    # line 3 lacks data_source, which line 1 has: without the check the dataset loads and collate_fn fails on the
    # first batch holding it, naming its place in the batch ("item k"), not the file and line
    rows = [verl_row("a"), verl_row("b"), verl_row("c")]
    del rows[2]["data_source"]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    with pytest.raises(DataError, match=r"mixed.jsonl line 3: the row has no field 'data_source', unlike "
                                        r"\S*mixed.jsonl line 1"):
        RLHFDataset(path, tiny_tokenizer, ppo_data_cfg())
    rows = [verl_row("a"), {**verl_row("b"), "answer": "4"}]
    path = write_jsonl(tmp_path / "extra.jsonl", rows)
    with pytest.raises(DataError, match=r"extra.jsonl line 2: the row has a field 'answer', unlike"):
        RLHFDataset(path, tiny_tokenizer, ppo_data_cfg())


def test_bad_files(tiny_tokenizer, tmp_path):
    cfg = ppo_data_cfg()
    (tmp_path / "utf.jsonl").write_bytes(GOOD.encode() + b"\n" + b'{"prompt": "\xff\xfe"}\n')
    with pytest.raises(DataError, match=r"utf.jsonl line 2: not valid UTF-8"):
        RLHFDataset(str(tmp_path / "utf.jsonl"), tiny_tokenizer, cfg)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match=r"empty.jsonl: the file has no rows"):
        RLHFDataset(str(tmp_path / "empty.jsonl"), tiny_tokenizer, cfg)
    empty_pq = write_parquet(tmp_path / "empty.parquet", [])
    with pytest.raises(DataError, match=r"empty.parquet: the file has no rows"):
        RLHFDataset(empty_pq, tiny_tokenizer, cfg)
    (tmp_path / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(DataError, match=r"corrupt.parquet: not a readable parquet file"):
        RLHFDataset(str(tmp_path / "corrupt.parquet"), tiny_tokenizer, cfg)
    with pytest.raises(DataError, match=r"unknown data file format"):
        RLHFDataset(str(tmp_path / "x.csv"), tiny_tokenizer, cfg)
    with pytest.raises(FileNotFoundError):
        RLHFDataset(str(tmp_path / "missing.parquet"), tiny_tokenizer, cfg)
    with pytest.raises(ValueError, match="truncation"):
        RLHFDataset(write_jsonl(tmp_path / "ok.jsonl", [verl_row("q")]), tiny_tokenizer, ppo_data_cfg(truncation="x"))


CUSTOM = '''
from torch.utils.data import Dataset
class MyDataset(Dataset):
    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        self.files, self.max_samples = data_files, max_samples
    def __len__(self):
        return 7
    def __getitem__(self, i):
        return {"i": i}
NotADataset = dict
'''


def test_custom_cls(tiny_tokenizer, tmp_path, small_parquet):
    (tmp_path / "my_ds.py").write_text(CUSTOM)
    custom = {"path": str(tmp_path / "my_ds.py"), "name": "MyDataset"}
    ds = create_rl_dataset(small_parquet, tiny_tokenizer, ppo_data_cfg(custom_cls=custom), max_samples=3)
    assert type(ds).__name__ == "MyDataset" and len(ds) == 7 and ds.max_samples == 3
    assert isinstance(create_rl_dataset(small_parquet, tiny_tokenizer, ppo_data_cfg()), RLHFDataset)
    with pytest.raises(AttributeError, match="defines no 'Missing'"):
        create_rl_dataset(small_parquet, tiny_tokenizer, ppo_data_cfg(custom_cls={**custom, "name": "Missing"}))
    with pytest.raises(TypeError, match="Dataset subclass"):
        create_rl_dataset(small_parquet, tiny_tokenizer, ppo_data_cfg(custom_cls={**custom, "name": "NotADataset"}))
    with pytest.raises(FileNotFoundError, match="nope.py"):
        create_rl_dataset(small_parquet, tiny_tokenizer,
                          ppo_data_cfg(custom_cls={"path": str(tmp_path / "nope.py"), "name": "X"}))


def test_collate_fn_builds_a_batch(tiny_tokenizer, small_parquet):
    ds = RLHFDataset(small_parquet, tiny_tokenizer, ppo_data_cfg(max_prompt_length=64, return_raw_chat=True))
    batch = collate_fn([ds[0], ds[1], ds[2]])
    assert batch["input_ids"].shape == (3, 64) and batch["position_ids"].dtype == torch.int64
    assert torch.equal(batch["attention_mask"][1], ds[1]["attention_mask"])
    assert batch["reward_model"].dtype == object and batch["reward_model"][2] == {"style": "rule", "ground_truth": "2"}
    assert batch["raw_prompt_ids"][0] == ds[0]["raw_prompt_ids"]  # lists stay whole, not broadcast
    assert list(batch["index"]) == [100, 101, 102]
    with pytest.raises(ValueError, match="keys"):
        collate_fn([ds[0], {"input_ids": ds[0]["input_ids"]}])


def test_verl_prepared_parquet_loads_unchanged(tiny_tokenizer, gsm8k_dir, tmp_path):
    """A parquet written the way verl's examples/data_preprocess/gsm8k.py writes it (pandas, its own code)."""
    raw = [json.loads(line) for line in (gsm8k_dir / "test.jsonl").read_text().splitlines()[:6]]
    verl_rows = []
    for idx, ex in enumerate(raw):  # verl's make_map_fn, verbatim in spirit
        solution = ex["answer"].split("#### ")[1].replace(",", "")
        verl_rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": ex["question"] + " " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": solution},
            "extra_info": {"split": "test", "index": idx, "answer": ex["answer"], "question": ex["question"]},
        })
    verl_file = tmp_path / "verl_test.parquet"
    pd.DataFrame(verl_rows).to_parquet(verl_file)  # pandas adds its own index metadata; must not matter
    ours = preprocess_gsm8k(str(gsm8k_dir), str(tmp_path / "ours"))["test"]
    cfg = ppo_data_cfg(max_prompt_length=256, return_raw_chat=True)
    a = RLHFDataset(str(verl_file), tiny_tokenizer, cfg)
    cfg.shuffle = False  # max_samples without shuffle: the first 6 rows of our own test split
    b = RLHFDataset(ours, tiny_tokenizer, cfg, max_samples=6)
    assert len(a) == len(b) == 6
    for i in range(6):
        x, y = a[i], b[i]
        assert set(x) == set(y)
        for key in x:
            assert (torch.equal(x[key], y[key]) if isinstance(x[key], torch.Tensor) else x[key] == y[key]), key
    assert a[0]["reward_model"]["ground_truth"] == raw[0]["answer"].split("#### ")[1].replace(",", "")
