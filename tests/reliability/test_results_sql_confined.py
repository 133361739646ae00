"""`rlhf results sql` is read-only and confined to the store (issue 32, "The results store is read-only for SQL"),
and model text is printed with its control characters escaped. Every attack runs for real against a real DuckDB
store through the CLI's entry; its effect (a file written, a file read) is looked for on disk and in the output."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra.results import ResultsStore
from infra.results_cli import escape_control, main as results_main

HOSTILE = "ok\x1b[2J\x1b]0;pwned\x07\nsecond line\r\tend\u202e"


def _sample_file(path: Path, response: str) -> str:
    cols = {"step": [1], "data_source": ["gsm8k"], "uid": ["u0"], "sample_idx": [0], "prompt": ["q"],
            "response": [response], "ground_truth": ["42"], "score": [1.0]}
    pq.write_table(pa.table(cols), path)
    return str(path)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def store(tmp_path, monkeypatch) -> ResultsStore:
    home = tmp_path / "home"
    monkeypatch.setenv("RLHF_HOME", str(home))
    s = ResultsStore(home)
    s.register_samples([_sample_file(tmp_path / "val_step_1.parquet", HOSTILE)], "run1", "ppo")
    return s


def _run(query: str, capsys) -> tuple[int, str, str]:
    rc = results_main(["sql", query])
    out, err = capsys.readouterr()
    return rc, out, err


def test_views_over_the_store_parquet_files_still_work(store, capsys):
    rc, out, _ = _run("SELECT run_id, stage, step, score FROM samples", capsys)
    assert rc == 0 and out.splitlines()[2] == "run1   | ppo   | 1    | 1.0"
    rc, out, _ = _run(f"SELECT count(*) AS n FROM read_parquet('{store.root}/samples/**/*.parquet')", capsys)
    assert rc == 0 and out.splitlines()[2] == "1"  # a file inside the store may be read directly
    assert store.sql("EXPLAIN SELECT * FROM metrics")[0] == ["explain_key", "explain_value"]


def test_sql_cannot_write_files_or_the_store(store, tmp_path, capsys):
    before = _tree(store.home)
    outside = tmp_path / "outside"
    attacks = {
        f"COPY (SELECT 1 AS a) TO '{outside}.csv'": "the query is of type COPY",
        # inside the store's folder too: a parquet dropped there would join the `samples` view
        f"COPY (SELECT * FROM samples) TO '{store.root}/samples/evil.parquet' (FORMAT parquet)":
            "the query is of type COPY",
        f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{store.root}/metrics/evil.parquet' (FORMAT parquet)":
            "the query is of type EXPLAIN COPY",  # EXPLAIN ANALYZE runs what it explains
        f"EXPORT DATABASE '{outside}_export'": "the query is of type EXPORT",
        "CREATE TABLE t AS SELECT 1": "the query is of type CREATE",
        "CREATE OR REPLACE VIEW samples AS SELECT 1": "the query is of type CREATE",
        "INSERT INTO samples SELECT * FROM samples": "the query is of type INSERT",
        "SELECT 1; DROP VIEW samples": "statement 2 of 2 is of type DROP",  # nothing of it runs
    }
    for query, what in attacks.items():
        rc, out, err = _run(query, capsys)
        assert (rc, out) == (1, ""), query
        assert err == (f"rlhf results: error: the results store is read-only: {what}; only queries run here (SELECT, WITH, FROM, "
                       "SHOW, DESCRIBE, SUMMARIZE, and EXPLAIN of those)\n"), query
    assert _tree(store.home) == before and not any(p.name.startswith("outside") for p in tmp_path.iterdir())
    assert store.sql("SELECT count(*) FROM samples")[1] == [(1,)]  # the view is intact


def test_sql_cannot_read_outside_the_store_nor_lift_the_limits(store, tmp_path, capsys):
    secret = tmp_path / "secret.csv"
    secret.write_text("name,password\nalice,SECRET-VALUE-123\n")
    other_db = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other_db))
    con.execute("CREATE TABLE creds AS SELECT 'SECRET-VALUE-123' AS pw")
    con.close()
    parquet_outside = _sample_file(tmp_path / "outside.parquet", "SECRET-VALUE-123")
    for query in [f"SELECT * FROM read_csv('{secret}')", "SELECT * FROM read_csv('/etc/passwd')",
                  f"SELECT * FROM read_parquet('{parquet_outside}')", f"SELECT * FROM '{secret}'",
                  f"SELECT * FROM read_text('{store.root}/../../secret.csv')",  # `..` out of the store
                  f"SELECT * FROM glob('{tmp_path}/*')"]:
        rc, out, err = _run(query, capsys)
        assert rc == 1 and out == "" and "SECRET-VALUE-123" not in err and "root:" not in err, query
        assert err.startswith("rlhf results: error: Permission Error: Cannot access file") and "disabled by configuration" in err
    for query, message in [(f"ATTACH '{other_db}' AS o", "of type ATTACH"),
                           ("SET enable_external_access = true", "of type SET"),
                           ("SET allowed_directories = ['/']", "of type SET"),
                           ("RESET lock_configuration", "of type SET"),
                           ("INSTALL httpfs", "of type LOAD"), ("LOAD httpfs", "of type LOAD")]:
        rc, out, err = _run(query, capsys)
        assert rc == 1 and out == "" and message in err, query
    # a statement that slipped past the type check still meets DuckDB's locked configuration
    con = store._confined_connection()
    try:
        with pytest.raises(duckdb.InvalidInputException, match="the configuration has been locked"):
            con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"ATTACH '{other_db}' AS o")
    finally:
        con.close()


def test_model_text_is_printed_with_control_characters_escaped(store, tmp_path):
    env = {**os.environ, "RLHF_HOME": str(store.home)}
    proc = subprocess.run([str(Path(sys.executable).parent / "rlhf"), "results", "sql",
                           "SELECT response, 'x' || chr(27) || '[31m' AS \"col\x1b[1m\" FROM samples",
                           "--max-width", "200"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout and "\u202e" not in proc.stdout
    header, _, row, count = proc.stdout.splitlines()
    # hand-escaped: ESC → \x1b, BEL → \x07, newline → \n, CR → \r, tab → \t, U+202E (right-to-left) → \u202e
    assert row.split(" | ")[0].rstrip() == r"ok\x1b[2J\x1b]0;pwned\x07\nsecond line\r\tend\u202e"
    assert row.split(" | ")[1] == r"x\x1b[31m" and header.split(" | ")[1] == r"col\x1b[1m"
    assert count == "(1 row)"


def test_escape_control_keeps_ordinary_text():
    assert escape_control("héllo 世界 🙂 a\\b") == "héllo 世界 🙂 a\\b"
    assert escape_control("\x00\x7f\x85\u2066") == r"\x00\x7f\x85\u2066"


@pytest.mark.parametrize("char, shown", [
    ("\u2028", r"\u2028"), ("\u2029", r"\u2029"),  # line and paragraph separators (Zl, Zp)
    ("\u200b", r"\u200b"), ("\u200c", r"\u200c"), ("\u200d", r"\u200d"), ("\u200e", r"\u200e"),
    ("\u200f", r"\u200f"),  # zero-width space/non-joiner/joiner, LRM, RLM
    ("\u00ad", r"\xad"), ("\ufeff", r"\ufeff"),  # soft hyphen, BOM
    ("\u202a", r"\u202a"), ("\u202b", r"\u202b"), ("\u202c", r"\u202c"), ("\u202d", r"\u202d"),
    ("\u202e", r"\u202e"), ("\u2066", r"\u2066"), ("\u2067", r"\u2067"), ("\u2068", r"\u2068"),
    ("\u2069", r"\u2069"),  # bidi embeddings, overrides and isolates
    ("\U000e0041", r"\U000e0041"), ("\ud800", r"\ud800"),  # a tag character (Cf, above U+FFFF), a lone surrogate
])
def test_format_and_separator_characters_are_escaped(char, shown):
    assert escape_control(f"a{char}b") == f"a{shown}b"


def test_a_cell_cannot_fake_a_column_or_a_row(store, capsys):
    # each cell hides a column border or a line break; the header too. Printed, every ' | ' is a border (two per
    # line for three columns) and the table is exactly header, rule, one row, count.
    rc, out, err = _run("SELECT 'a | b' AS \"x | y\", 'c' || chr(10) || 'd | e' AS p, "
                        "'f' || chr(8232) || 'g' || chr(8233) || 'h|' AS q", capsys)
    assert (rc, err) == (0, "")
    header, rule, row, count = out.splitlines()
    assert header.split(" | ") == [r"x \| y", "p" + " " * 8, "q"]  # widths: 6, 9 (c \ n d _ \ | _ e), 17
    assert row.split(" | ") == [r"a \| b", r"c\nd \| e", r"f\u2028g\u2029h\|"]
    assert rule == "-" * 6 + "-+-" + "-" * 9 + "-+-" + "-" * 17 and count == "(1 row)"
