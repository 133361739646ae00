"""The file sink's metrics file across a resume (rlhf_core/trainer/metrics_file.py): the lines of steps after the
resumed checkpoint go, the others stay byte for byte, the file is replaced in one rename, an earlier run's file is
moved aside, and a metric the file holds at its last step is not written twice."""
from __future__ import annotations

import json
import os

import pytest
from omegaconf import OmegaConf

from rlhf_core.trainer import metrics_file
from rlhf_core.trainer.metrics_file import keep_through_step, names_at_last_step, prepare_metrics_file
from rlhf_core.trainer.tracking import FileSink


def _line(step: int, name: str, value: float) -> bytes:
    return (json.dumps({"step": step, "name": name, "value": value, "timestamp": 1.0}) + "\n").encode()


def _killed_run(path) -> bytes:
    """Steps 0..4 (step 0: a validation), two metrics each, then a line torn by the kill; returns the bytes of the
    lines of steps <= 2 (what a resume from step 2 keeps)."""
    kept = _line(0, "val-core/x", 0.25) + b"".join(_line(s, n, s + 0.5 * i) for s in (1, 2)
                                                    for i, n in enumerate(("a", "b")))
    later = b"".join(_line(s, n, 9.0) for s in (3, 4) for n in ("a", "b"))
    path.write_bytes(kept + later + b'{"step": 5, "na')
    return kept


def _config(tmp_path, logger=("file",)):
    return OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path), "logger": list(logger)}})


def test_a_resume_keeps_the_lines_through_its_step_in_one_rename(tmp_path, monkeypatch):
    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    path = tmp_path / "metrics.jsonl"
    kept = _killed_run(path)
    before = path.read_bytes()
    inode = path.stat().st_ino
    prepare_metrics_file(_config(tmp_path), 2)
    # 5 lines of steps 0..2 stay as they were; the 4 of steps 3, 4 and the torn one go
    assert path.read_bytes() == kept
    assert path.stat().st_ino != inode  # a new file renamed over the old one, not the old one cut in place
    # the whole records of steps 3 and 4 are not lost: the file as it was is kept beside it; no temporary file left
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "metrics.jsonl.1"]
    assert (tmp_path / "metrics.jsonl.1").read_bytes() == before
    assert keep_through_step(str(path), 2) == (5, 0, None) and path.read_bytes() == kept  # again: nothing to do
    # only a torn line after the step: nothing worth a copy
    path.write_bytes(kept + b'{"step": 3, "na')
    assert keep_through_step(str(path), 2) == (5, 1, None) and path.read_bytes() == kept


def test_odd_json_lines_are_not_records(tmp_path):
    # any JSON line that is not an object with an integer step (a number, null, a list, a null step) is skipped
    # wherever the file is read, as a torn line is: the sink opens, the last step is the last real record's
    path = tmp_path / "m.jsonl"
    path.write_bytes(_line(1, "a", 0.5) + _line(2, "a", 1.0) + _line(2, "b", 2.0) + b'3\nnull\n[1, 2]\n'
                     + b'{"step": null, "name": "c"}\n')
    assert names_at_last_step(str(path)) == (2, {"a", "b"})
    FileSink(str(path)).finish()
    assert keep_through_step(str(path), 1) == (1, 6, str(path) + ".1")  # kept: step 1; dropped: 2 records, 4 odd


def test_a_failed_rewrite_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    _killed_run(path)
    before = path.read_bytes()

    class Full:  # the temporary file's write fails as on a full disk
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            raise OSError(28, "No space left on device")

        def __exit__(self, *a):
            return False

    monkeypatch.setattr("rlhf_core.atomic.atomic_write", Full)
    with pytest.raises(OSError, match="No space"):
        keep_through_step(str(path), 2)
    assert path.read_bytes() == before


def test_a_fresh_start_moves_an_earlier_file_aside_and_register_reads_only_the_new_one(tmp_path, monkeypatch):
    from infra.run_folders import metric_rows

    monkeypatch.setenv("RLHF_METRICS_FILE", str(tmp_path / "metrics.jsonl"))  # the variable wins over the logger
    path = tmp_path / "metrics.jsonl"
    _killed_run(path)
    first = path.read_bytes()
    prepare_metrics_file(_config(tmp_path, logger=()), None)
    assert not path.exists() and (tmp_path / "metrics.jsonl.1").read_bytes() == first
    path.write_bytes(_line(1, "a", 7.0))
    prepare_metrics_file(_config(tmp_path, logger=()), None)
    assert (tmp_path / "metrics.jsonl.2").read_bytes() == _line(1, "a", 7.0)  # .1 is kept
    path.write_bytes(_line(1, "a", 3.0))
    # rlhf results register reads metrics*.jsonl: the current file only, not the ones moved aside
    assert [(r["step"], r["name"], r["value"]) for r in metric_rows(tmp_path)] == [(1, "a", 3.0)]


def test_no_file_sink_or_a_validation_only_run_leaves_the_file_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    path = tmp_path / "metrics.jsonl"
    _killed_run(path)
    before = path.read_bytes()
    prepare_metrics_file(_config(tmp_path, logger=("console",)), 2)  # no file sink: not its file
    prepare_metrics_file(_config(tmp_path), 2, val_only=True)
    prepare_metrics_file(_config(tmp_path), None, val_only=True)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]


def test_the_sink_skips_a_metric_the_file_holds_at_its_last_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(_line(1, "a", 1.0) + _line(2, "a", 2.0) + _line(2, "val-core/x", 0.5))
    # a block smaller than one line: the reader goes back block by block until it sees step 1
    assert names_at_last_step(str(path), block=16) == (2, {"a", "val-core/x"})
    sink = FileSink(str(path))
    sink.log({"val-core/x": 0.75, "val-aux/y": 3.0}, step=2)  # a resumed run validating again at step 2
    sink.log({"a": 4.0, "val-core/x": 0.25}, step=3)
    sink.finish()
    rows = [(r["step"], r["name"], r["value"]) for r in map(json.loads, path.read_text().splitlines())]
    assert rows == [(1, "a", 1.0), (2, "a", 2.0), (2, "val-core/x", 0.5), (2, "val-aux/y", 3.0),
                    (3, "a", 4.0), (3, "val-core/x", 0.25)]
    assert names_at_last_step(str(tmp_path / "none.jsonl")) == (None, set())


def test_planned_file_is_the_variable_else_the_default_with_a_file_logger(tmp_path, monkeypatch):
    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    assert metrics_file.planned_metrics_file(_config(tmp_path)) == str(tmp_path / "metrics.jsonl")
    assert metrics_file.planned_metrics_file(_config(tmp_path, logger=("console", "mlflow"))) is None
    monkeypatch.setenv("RLHF_METRICS_FILE", "/x/m.jsonl")
    assert metrics_file.planned_metrics_file(_config(tmp_path, logger=("console",))) == "/x/m.jsonl"
