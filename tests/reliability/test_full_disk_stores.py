"""A full disk during a results write and an MLflow store on a read-only file system (issue 32, "Disk full and
read-only stores"): one line naming the path and what was kept, never a traceback, and the results store stays
queryable while the disk is full. The disk is real: a 2 MiB tmpfs filled to the last byte (and remounted
read-only for MLflow); the tests skip, saying why, where this process may not mount (they need root)."""
from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_core.storage import StorageError

RLHF = str(Path(sys.executable).parent / "rlhf")


def mounted_tmpfs(mnt: Path, options: str):
    """Mount a fresh tmpfs with ``options`` (``size=2m``, ``size=1m,ro``) at the new folder ``mnt`` and yield it,
    unmounting it afterwards; skips the test where mounting is not allowed (needs root)."""
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    """A fresh 2 MiB tmpfs at ``tmp_path/disk``, unmounted afterwards."""
    yield from mounted_tmpfs(tmp_path / "disk", "size=2m")


def fill(disk: Path) -> Path:
    """Write zeros to ``disk/filler`` until the kernel says ENOSPC; returns the filler (remove it to free the disk)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as fh:
        with pytest.raises(OSError) as info:
            while True:
                fh.write(b"\0" * 65536)
    assert info.value.errno == errno.ENOSPC
    return filler


def _sample_file(path: Path, n: int, text: str = "r") -> str:
    pq.write_table(pa.table({"step": [1] * n, "data_source": ["d"] * n, "uid": [f"u{i}" for i in range(n)],
                             "sample_idx": [0] * n, "prompt": ["q"] * n, "response": [text] * n,
                             "ground_truth": ["1"] * n, "score": [0.5] * n}), path)
    return str(path)


def test_results_store_on_a_full_disk_names_the_file_and_stays_queryable(small_disk, tmp_path, caplog):
    from infra.results import ResultsStore

    home = small_disk / "home"
    store = ResultsStore(home)
    store.register_metrics([{"step": 1, "loss": 0.25}], "run1", "ppo")
    before = sorted(p.name for p in store.root.rglob("*.parquet"))
    fill(small_disk)
    dest = store.root / "samples" / "run_id=run2" / "stage=ppo" / "val_step_1.parquet"
    with pytest.raises(StorageError) as info:  # 2,000 rows of 1 KiB: more than is free (0 bytes)
        store.register_samples([_sample_file(tmp_path / "val_step_1.parquet", 2000, "x" * 1024)], "run2", "ppo")
    assert str(info.value) == (f"[Errno {errno.ENOSPC}] results store: 2000 row(s) to {dest} not written (No space "
                               f"left on device); kept: every file registered before under {store.root} (still "
                               f"queryable), no partial file")
    assert sorted(p.name for p in store.root.rglob("*.parquet")) == before  # nothing half-written
    assert not list(store.root.rglob("*.tmp"))
    with caplog.at_level(logging.WARNING, logger="infra.results"):  # reopening cannot refresh its views: said
        _, rows = ResultsStore(home).sql("SELECT run_id, step, key, value FROM metrics")
    assert rows == [("run1", 1, "loss", 0.25)]  # queries work while the disk is full
    assert "not refreshed (TransactionContext Error: Failed to commit: Could not write file" in caplog.text


def test_rlhf_results_register_on_a_full_disk_is_one_line(small_disk, tmp_path):
    from infra.results import ResultsStore

    home = small_disk / "home"
    ResultsStore(home).register_metrics([{"step": 1, "loss": 0.25}], "run1", "ppo")
    run = tmp_path / "run"
    run.mkdir()
    _sample_file(run / "val_step_1.parquet", 2000, "y" * 1024)
    fill(small_disk)
    env = {**os.environ, "RLHF_HOME": str(home)}
    proc = subprocess.run([RLHF, "results", "register", str(run), "--stage", "ppo"], env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rlhf results: error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"rlhf results: error: [Errno {errno.ENOSPC}] results store: 2000 row(s) to "
                                f"{home}/results/samples/run_id=")
    assert errors[0].endswith(f"not written (No space left on device); kept: every file registered before under "
                              f"{home}/results (still queryable), no partial file")
    proc = subprocess.run([RLHF, "results", "sql", "SELECT count(*) AS n FROM metrics"], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and proc.stdout.splitlines()[2] == "1"  # still queryable, disk still full


def test_metrics_file_on_a_full_disk_keeps_whole_lines_and_names_the_last_step(small_disk):
    from rlhf_core.trainer.tracking import FileSink, read_metrics_jsonl

    path = small_disk / "metrics.jsonl"
    sink = FileSink(str(path))
    sink.log({"actor/pg_loss": 0.5, "critic/score/mean": 0.25}, step=1)
    filler = fill(small_disk)
    os.truncate(filler, os.path.getsize(filler) - 100)  # 100 bytes free: less than one step's lines
    big = {f"metric/{i:04d}": float(i) for i in range(50)}  # ~4 KiB of lines
    with pytest.raises(StorageError) as info:
        sink.log(big, step=2)
    assert str(info.value) == (f"[Errno {errno.ENOSPC}] metrics of step 2 to {path} not written (No space left on "
                               f"device); kept: the metrics of steps up to 1, in whole lines")
    assert read_metrics_jsonl(str(path)) == {1: {"actor/pg_loss": 0.5, "critic/score/mean": 0.25}}
    assert path.read_bytes().endswith(b"}\n")  # the part of step 2 that fitted was cut off again
    sink.finish()


def test_samples_parquet_on_a_full_disk_leaves_the_earlier_files(small_disk):
    from rlhf_core.metrics.samples import write_samples_parquet

    out = small_disk / "val"
    rows = [{"step": 1, "data_source": "d", "uid": f"u{i}", "sample_idx": 0, "prompt": "q", "response": "r",
             "ground_truth": "1", "score": 1.0} for i in range(4)]
    first = write_samples_parquet(rows, str(out), "val_step_1")
    fill(small_disk)
    big = [dict(r, step=2, response="z" * 4096) for r in rows * 100]
    with pytest.raises(StorageError) as info:
        write_samples_parquet(big, str(out), "val_step_2")
    assert str(info.value) == (f"[Errno {errno.ENOSPC}] samples file (400 row(s)) {out}/val_step_2.parquet not "
                               f"written (No space left on device); kept: the sample files already in {out}, "
                               f"unchanged; no partial file")
    assert sorted(os.listdir(out)) == ["val_step_1.parquet"] and pq.read_table(first).num_rows == 4


@pytest.fixture
def read_only_mlflow(small_disk, monkeypatch):
    """An MLflow SQLite store with one experiment, on ``small_disk`` remounted read-only."""
    uri = f"sqlite:///{small_disk}/mlflow.db"
    # in another process: this one would keep the database open, and a busy mount cannot be remounted read-only
    subprocess.run([sys.executable, "-c", "import sys; from mlflow import MlflowClient; "
                    "MlflowClient(tracking_uri=sys.argv[1]).create_experiment('before')", uri], check=True,
                   capture_output=True, timeout=180)
    proc = subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot remount read-only: {proc.stderr.strip()}")
    with pytest.raises(OSError) as info:
        (small_disk / "probe").write_text("x")
    assert info.value.errno == errno.EROFS  # really read-only
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return small_disk / "mlflow.db"


def test_read_only_mlflow_store_degrades_lineage_in_one_warning(read_only_mlflow, tmp_path, monkeypatch, caplog):
    from infra import lineage
    from infra.results import ResultsStore
    from tasks.common import make_context, stage

    monkeypatch.setattr(lineage, "_PROBED", {})
    with caplog.at_level(logging.WARNING, logger="infra.lineage"):
        with lineage.pipeline_run("exp", "flow-1", {"lr": 1e-3}) as parent:
            ctx = make_context(str(tmp_path), "exp", parent, "flow-1", str(tmp_path / "run"))
            with stage("ppo", {"trainer": {"total_epochs": 1}}, ctx) as rid:
                assert lineage.stage_env(rid) == {}  # the core is not pointed at the read-only store
                ResultsStore(tmp_path).register_metrics([{"step": 1, "critic/score/mean": 0.5}], rid, "ppo")
                lineage.log_metrics(rid, {"x": 1.0})
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [f"MLflow store {read_only_mlflow} is not writable (Read-only file system): lineage is "
                        f"degraded — training goes on and results still reach the DuckDB store, but no runs, "
                        f"params, metrics or artifacts are recorded in MLflow; what the store already holds is kept"]
    assert parent.startswith(lineage.OFFLINE_PREFIX) and rid.startswith(lineage.OFFLINE_PREFIX)
    _, rows = ResultsStore(tmp_path).sql(f"SELECT value FROM metrics WHERE run_id = '{rid}'")
    assert rows == [(0.5,)]


def test_rlhf_ppo_with_a_read_only_mlflow_store_is_one_line(read_only_mlflow, tmp_path):
    """The core's mlflow sink is refused at start, before MLflow's client (a SQLAlchemy traceback otherwise)."""
    code = ("import sys; from rlhf_core.cli import run_command; from rlhf_core.trainer.tracking import Tracking\n"
            "sys.exit(run_command('rlhf ppo', lambda a: Tracking('p', 'e', ['console', 'mlflow']), []))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{read_only_mlflow}"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr == (f"rlhf ppo: error: [Errno {errno.EROFS}] MLflow store {read_only_mlflow} not written "
                           f"(Read-only file system); kept: nothing was logged to it (set MLFLOW_TRACKING_URI to a "
                           f"writable store, or drop 'mlflow' from trainer.logger)\n")


@pytest.mark.slow
def test_rlhf_ppo_whose_metrics_file_is_on_a_full_disk_stops_in_one_line(small_disk, tiny_model_dir, tmp_path):
    """A real ``rlhf ppo`` (tiny model, one GRPO step) whose metrics file lies on a full disk: the first metrics
    write fails; the run stops with one line naming the file, exit 1, no traceback."""
    from bad_input_fixtures import good_rows, ppo_overrides, write_parquet

    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    metrics = small_disk / "metrics.jsonl"
    fill(small_disk)
    env = {**os.environ, "RLHF_METRICS_FILE": str(metrics), "CI": "true"}
    env.pop("RLHF_HOME", None)
    proc = subprocess.run([RLHF, "ppo", *ppo_overrides(tiny_model_dir, data, "trainer.total_training_steps=1",
                                                        "trainer.save_freq=-1", "trainer.test_freq=-1")],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rlhf ppo: error:")]
    assert errors == [f"rlhf ppo: error: [Errno {errno.ENOSPC}] metrics of step 1 to {metrics} not written (No "
                      f"space left on device); kept: nothing (no step was logged yet)"]
    assert metrics.read_bytes() == b""
    json.dumps(errors)  # plain text, one line
