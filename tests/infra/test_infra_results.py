"""DuckDB results store against real files: empty store, registration, concurrent readers."""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import subprocess
import sys

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest_services import *  # noqa: F401,F403
from infra.results import ResultsStore
from infra.results_cli import format_table, main as results_main


def _samples(path, step, n=4, extra=False):
    cols = {
        "step": [step] * n, "data_source": ["openai/gsm8k"] * n, "uid": [f"u{i // 2}" for i in range(n)],
        "sample_idx": [i % 2 for i in range(n)], "prompt": ["q"] * n, "response": [f"r{i}" for i in range(n)],
        "ground_truth": ["42"] * n, "score": [float(i % 2) for i in range(n)],
    }
    if extra:
        cols["acc"] = [bool(i % 2) for i in range(n)]
    pq.write_table(pa.table(cols), path)
    return str(path)


def test_empty_store_views_are_typed_and_empty(results_store):
    names, rows = results_store.sql("SELECT * FROM samples")
    assert rows == []
    assert names[:3] == ["run_id", "stage", "step"] and "score" in names
    assert results_store.sql("SELECT count(*) FROM metrics")[1] == [(0,)]
    assert results_store.sql("SELECT count(*) FROM runs")[1] == [(0,)]
    # the database file is queryable by any DuckDB client
    con = duckdb.connect(str(results_store.db_path), read_only=True)
    assert con.execute("SELECT count(*) FROM samples").fetchall() == [(0,)]
    con.close()


def test_register_samples_adds_run_and_stage_and_unions_columns(results_store, tmp_path):
    a = _samples(tmp_path / "val_step1.parquet", 1)
    b = _samples(tmp_path / "val_step2.parquet", 2, extra=True)
    assert results_store.register_samples([a, b], "run1", "ppo") == 8
    names, rows = results_store.sql(
        "SELECT run_id, stage, step, count(*), sum(score), count(acc) FROM samples GROUP BY ALL ORDER BY step")
    # step 1 has no acc column: union_by_name fills NULL, so count(acc) is 0 there
    assert rows == [("run1", "ppo", 1, 4, 2.0, 0), ("run1", "ppo", 2, 4, 2.0, 4)]
    dest = results_store.root / "samples" / "run_id=run1" / "stage=ppo" / "val_step1.parquet"
    assert dest.exists()
    # registering again (a retried task) replaces the copy instead of duplicating rows
    results_store.register_samples([a], "run1", "ppo")
    assert results_store.sql("SELECT count(*) FROM samples")[1] == [(8,)]
    # another run's files are untouched
    results_store.register_samples([a], "run2", "evaluate")
    assert results_store.sql("SELECT run_id, count(*) FROM samples GROUP BY 1 ORDER BY 1")[1] == [
        ("run1", 8), ("run2", 4)]


def test_register_samples_step_replaces_the_files_step(results_store, tmp_path):
    """The pipeline's evaluation scores the final checkpoint of step 19; rlhf eval wrote step 0 (it knows no step):
    the rows are stored under step 19, next to that step's metrics."""
    a = _samples(tmp_path / "suite.parquet", 0)
    results_store.register_samples([a], "run1", "evaluate", step=19)
    assert results_store.sql("SELECT step, count(*) FROM samples GROUP BY 1")[1] == [(19, 4)]
    assert pq.read_table(a).column("step").to_pylist() == [0] * 4  # the user's file is not changed


def test_unsafe_names_are_refused(results_store, tmp_path):
    a = _samples(tmp_path / "x.parquet", 1)
    with pytest.raises(ValueError, match="run_id"):
        results_store.register_samples([a], "../evil", "ppo")
    with pytest.raises(ValueError, match="stage"):
        results_store.register_metrics([{"step": 1, "a": 1.0}], "r", "a/b")


def test_register_metrics_long_and_wide_rows(results_store):
    n = results_store.register_metrics(
        [{"step": 1, "name": "actor/pg_loss", "value": 0.5, "timestamp": 1.0},
         {"step": 1, "actor/entropy": 2.0, "note": "text", "flag": True}], "r1", "ppo", name="segment_1")
    assert n == 2  # the string and the bool are skipped
    _, rows = results_store.sql("SELECT step, key, value FROM metrics ORDER BY key")
    assert rows == [(1, "actor/entropy", 2.0), (1, "actor/pg_loss", 0.5)]
    with pytest.raises(ValueError, match="step"):
        results_store.register_metrics([{"a": 1.0}], "r1", "ppo")


def test_index_run_replaces_its_row(results_store):
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0)
    results_store.index_run("r1", "f1", "sft", "RUNNING", t0, None, "{}")
    assert results_store.sql("SELECT status, ended_at FROM runs")[1] == [("RUNNING", None)]
    results_store.index_run("r1", "f1", "sft", "FINISHED", t0, t0 + dt.timedelta(seconds=5), '{"a": 1}')
    _, rows = results_store.sql("SELECT status, ended_at - started_at, params_json FROM runs")
    assert rows == [("FINISHED", dt.timedelta(seconds=5), '{"a": 1}')]


def _reader(db_path: str, home: str, rounds: int, out: mp.Queue) -> None:
    store = ResultsStore(home)
    counts = []
    for _ in range(rounds):
        counts.append(store.sql("SELECT count(*) FROM samples")[1][0][0])
    out.put(counts)


def test_concurrent_reader_while_registering(results_store, tmp_path):
    files = [_samples(tmp_path / f"s{i}.parquet", i) for i in range(12)]
    results_store.register_samples(files[:1], "r1", "ppo")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_reader, args=(str(results_store.db_path), str(results_store.home), 40, q))
    proc.start()
    for f in files[1:]:
        results_store.register_samples([f], "r1", "ppo")
    counts = q.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    # every read saw whole files only (multiples of 4 rows) and never went backwards
    assert all(c % 4 == 0 for c in counts) and counts == sorted(counts)
    assert results_store.sql("SELECT count(*) FROM samples")[1] == [(48,)]


def test_register_while_another_process_locks_the_database(results_store, tmp_path):
    # someone keeps a write connection open (e.g. an interactive `duckdb results.duckdb`)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('locked', flush=True); "
        "time.sleep(8)"), str(results_store.db_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    # registration still succeeds: the parquet file is written, the view refresh is deferred
    assert results_store.register_samples([_samples(tmp_path / "a.parquet", 1)], "r1", "ppo") == 4
    assert holder.poll() is None  # the lock really was held during the write
    holder.wait(timeout=30)
    assert results_store.sql("SELECT count(*) FROM samples")[1] == [(4,)]


def test_cli_sql_and_path(rlhf_env, results_store, tmp_path, capsys):
    results_store.register_samples([_samples(tmp_path / "v.parquet", 3)], "r9", "ppo")
    assert results_main(["sql", "SELECT run_id, step, avg(score) AS s FROM samples GROUP BY ALL"]) == 0
    out = capsys.readouterr().out
    assert "run_id | step | s" in out and "r9     | 3    | 0.5" in out and "(1 row)" in out
    assert results_main(["path"]) == 0
    assert capsys.readouterr().out.strip() == str(results_store.db_path)
    assert results_main(["sql", "SELECT nope FROM samples"]) == 1


def test_format_table_cuts_long_cells():
    text = format_table(["a"], [("x" * 100,), (None,)], max_width=10)
    assert "xxxxxxxxx…" in text and "NULL" in text and "(2 rows)" in text


def _writer(home: str, tag: str, src_dir: str, rounds: int, start, out: mp.Queue) -> None:
    store = ResultsStore(home)
    start.wait(timeout=60)
    counts: list = []
    try:
        for i in range(rounds):
            store.register_samples([_samples(f"{src_dir}/{tag}_{i}.parquet", i)], f"run_{tag}", "ppo")
            store.refresh_views(strict=True)  # a write connection every round: raises if it ever collides
            counts.append(store.sql(f"SELECT count(*) FROM samples WHERE run_id = 'run_{tag}'")[1][0][0])
    except Exception as exc:  # reported to the test instead of a silent dead process
        counts.append(repr(exc))
    out.put((tag, counts))


def test_two_processes_writing_at_once(results_store, tmp_path):
    # both processes open write connections (view refreshes) and read connections in a tight loop, started
    # together; DuckDB refuses a second process while one writes, so without the store's lock they collide
    ctx = mp.get_context("spawn")
    start, q = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(results_store.home), tag, str(tmp_path), 15, start, q))
             for tag in ("a", "b")]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=180) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    # each process saw its own 4 new rows after every round: 4, 8, ..., 60
    assert got == {"a": list(range(4, 61, 4)), "b": list(range(4, 61, 4))}
    assert results_store.sql("SELECT count(*) FROM samples")[1] == [(120,)]
