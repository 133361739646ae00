"""GSM8K preprocessing to the verl schema: exact row values, bad rows, remote input, the CLI."""
from __future__ import annotations

import json

import fsspec
import pyarrow.parquet as pq
import pytest

from rlhf_core.data import DataError, RemoteUnavailableError
from rlhf_core.data.cli import main
from rlhf_core.data.gsm8k import extract_solution, preprocess_gsm8k

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Remote copies go to a per-test cache ($RLHF_HOME/cache), never the user's ~/.cache/rlhf."""
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "rlhf_home"))


@pytest.fixture(scope="module")
def prepared(gsm8k_dir, tmp_path_factory):
    return preprocess_gsm8k(str(gsm8k_dir), str(tmp_path_factory.mktemp("gsm8k_out")))


def test_rows_follow_the_verl_schema_exactly(prepared, gsm8k_dir):
    raw = [json.loads(line) for line in (gsm8k_dir / "train.jsonl").read_text().splitlines()]
    table = pq.read_table(prepared["train"])
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert table.num_rows == len(raw) == 7473
    first = table.slice(0, 1).to_pylist()[0]
    # train.jsonl line 1 is Natalia's clips; its answer ends in "#### 72".
    assert first == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": raw[0]["question"] + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 0, "answer": raw[0]["answer"], "question": raw[0]["question"]},
    }
    test = pq.read_table(prepared["test"])
    assert test.num_rows == 1319
    last = test.slice(1318, 1).to_pylist()[0]
    assert last["extra_info"]["split"] == "test" and last["extra_info"]["index"] == 1318


def test_ground_truth_drops_commas_and_keeps_sign():
    assert extract_solution("so 1000+234 = 1,234\n#### 1,234") == "1234"
    assert extract_solution("#### -5") == "-5"
    assert extract_solution("no final answer") is None


def test_every_ground_truth_is_a_number(prepared):
    truths = [r["ground_truth"] for r in pq.read_table(prepared["train"]).column("reward_model").to_pylist()]
    assert all(float(t) == float(t) for t in truths)  # float() raises on anything but a number
    assert not [t for t in truths if "," in t]


def _write_split(d, train_lines, test_lines=None):
    d.mkdir(parents=True, exist_ok=True)
    ok = json.dumps({"question": "q?", "answer": "a\n#### 3"})
    (d / "train.jsonl").write_text("\n".join(train_lines) + "\n")
    (d / "test.jsonl").write_text("\n".join(test_lines or [ok]) + "\n")
    return d


@pytest.mark.parametrize(
    "bad_line, field",
    [
        (json.dumps({"answer": "#### 3"}), "question"),
        (json.dumps({"question": "q", "answer": "no hashes"}), "answer"),
        (json.dumps({"question": 7, "answer": "#### 3"}), "question"),
        ("{not json", "JSON"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, bad_line, field):
    ok = json.dumps({"question": "q?", "answer": "a\n#### 3"})
    src = _write_split(tmp_path / "in", [ok, bad_line])
    with pytest.raises(DataError) as err:
        preprocess_gsm8k(str(src), str(tmp_path / "out"))
    msg = str(err.value)
    assert "train.jsonl line 2" in msg and field in msg
    assert not (tmp_path / "out" / "train.parquet").exists()  # nothing half-written


def test_remote_input_dir_via_fsspec(tmp_path):
    mem = fsspec.filesystem("memory")
    mem.pipe("/gsm_remote/train.jsonl", (json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n").encode())
    mem.pipe("/gsm_remote/test.jsonl", (json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n").encode())
    out = preprocess_gsm8k("memory://gsm_remote", str(tmp_path / "out"))
    row = pq.read_table(out["test"]).to_pylist()[0]
    assert row["reward_model"]["ground_truth"] == "4" and row["prompt"][0]["content"] == "2+2? " + INSTRUCTION


def test_cli(tmp_path, capsys):
    ok = json.dumps({"question": "q?", "answer": "#### 1,000"})
    src = _write_split(tmp_path / "in", [ok])
    assert main(["gsm8k", "--local-dir", str(src), "--out", str(tmp_path / "o")]) == 0
    assert pq.read_table(tmp_path / "o" / "train.parquet").to_pylist()[0]["reward_model"]["ground_truth"] == "1000"
    assert "train:" in capsys.readouterr().out
    _write_split(tmp_path / "bad", [json.dumps({"question": "q"})])
    assert main(["gsm8k", "--local-dir", str(tmp_path / "bad"), "--out", str(tmp_path / "o2")]) == 1  # bad data: one line, exit 1
    assert "line 1" in capsys.readouterr().err
    assert main(["gsm8k"]) == 2  # --out is required
    # verl's spellings of the same flags
    assert main(["gsm8k", "--local_dataset_path", str(src), "--local_save_dir", str(tmp_path / "o3")]) == 0
    assert (tmp_path / "o3" / "test.parquet").exists()


def test_hub_source_when_no_local_dir(tmp_path, monkeypatch):
    """local_dir=None reads the hub's parquet files (here served from memory:// in place of hf://)."""
    import pyarrow as pa

    import rlhf_core.data.gsm8k as gsm8k

    mem = fsspec.filesystem("memory")
    for split, q in (("train", "3*3?"), ("test", "10-1?")):
        with mem.open(f"/hub_gsm8k/{split}-00000-of-00001.parquet", "wb") as f:
            pq.write_table(pa.Table.from_pylist([{"question": q, "answer": "so\n#### 9"}]), f)
    assert gsm8k.HUB_URL == "hf://datasets/openai/gsm8k/main/{split}-00000-of-00001.parquet"
    monkeypatch.setattr(gsm8k, "HUB_URL", "memory://hub_gsm8k/{split}-00000-of-00001.parquet")
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "home"))  # the copy lands in $RLHF_HOME/cache
    out = preprocess_gsm8k(None, str(tmp_path / "out"))
    rows = pq.read_table(out["train"]).to_pylist()
    assert rows[0]["extra_info"] == {"split": "train", "index": 0, "answer": "so\n#### 9", "question": "3*3?"}
    assert (tmp_path / "home" / "cache").is_dir()


def test_hub_unreachable_says_how_to_use_local_files(tmp_path, monkeypatch):
    """No network and no local dir: a RemoteUnavailableError (retried by the pipeline) naming the hub, the cause, GSM8K_DIR and --local-dir."""
    from fsspec.implementations.memory import MemoryFileSystem

    import rlhf_core.data.gsm8k as gsm8k

    def offline(self, *args, **kwargs):
        raise ConnectionError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(MemoryFileSystem, "info", offline)
    monkeypatch.setattr(MemoryFileSystem, "_open", offline)
    monkeypatch.setattr(gsm8k, "HUB_URL", "memory://offline_hub/{split}-00000-of-00001.parquet")
    with pytest.raises(RemoteUnavailableError) as err:
        preprocess_gsm8k(None, str(tmp_path / "out"))
    msg = str(err.value)
    assert "could not read openai/gsm8k from the Hugging Face hub" in msg
    assert "ConnectionError" in msg and "name resolution" in msg
    assert "GSM8K_DIR" in msg and "--local-dir" in msg and "train.jsonl" in msg and "test.jsonl" in msg
    assert isinstance(err.value.__cause__, ConnectionError)
    assert main(["gsm8k", "--out", str(tmp_path / "o")]) == 1  # the CLI prints it without a traceback
