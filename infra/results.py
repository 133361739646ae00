"""DuckDB results store: per-sample generations, per-step metrics and a run index.

Writers never hold a database lock: they append parquet files under ``<home>/results/``
(each written to a temporary name and renamed into place, so a reader never sees half a
file and a dying writer loses nothing already registered). The DuckDB file
``<home>/results.duckdb`` holds only VIEWS over those files:

- ``samples``: ``run_id, stage, step, data_source, uid, sample_idx, prompt, response,
  ground_truth, score, prompt_id, question, checkpoint`` plus any extra columns the core wrote
  (``acc``, ``pred``, ...; ``num_turns``, ``tool_calls``, ``tool_failures`` for multi-turn tool rollouts,
  ``rlhf_core.metrics.samples.trajectory_columns``). ``prompt_id`` (:func:`prompt_id`) is a hash of the rendered prompt
  and ``data_source``, the same for the same prompt in every run;
- ``metrics``: ``run_id, stage, step, key, value``;
- ``runs``: ``run_id, flow_run_id, stage, status, started_at, ended_at, params_json, name, kind``:
  one row per run id (``kind`` ``flow`` for a flow run, whose ``run_id`` is the Prefect flow-run
  id; ``stage`` for a stage run, whose ``run_id`` is its MLflow run id).

Derived views (:data:`DERIVED_VIEWS`): ``prompt_scores`` (one row per run, stage, step and
prompt: mean score over its samples) and ``compare_pairs`` (evaluation prompt scores of two
runs side by side, paired by ``prompt_id``; filter on ``run_a``/``run_b`` or ``flow_a``/``flow_b``).

Views are (re)created with a brief write connection when the store is opened and when a
table gets its first file; queries use a read-only connection that runs only read statements and reads no file
outside ``<home>/results/`` (:meth:`ResultsStore.sql`: what ``rlhf results sql`` runs). While a table has no file,
its view selects from a typed empty relation, so queries work on an empty store.

DuckDB lets one process write a database file, or several read it, never both: every connection this
store opens is taken under one ``filelock`` (``<home>/results.duckdb.lock``), so the flow's processes and the
``rlhf results`` CLI wait their turn instead of failing. A client outside this store (an interactive
``duckdb results.duckdb``) does not take that lock: while it holds the file, view refreshes are deferred
(the parquet files are already safe) and queries fail with DuckDB's error, which names the file and the process
holding it. A database file DuckDB cannot read (corrupt) is moved aside and rebuilt on the next refresh: it holds
only views.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import logging

import duckdb
import filelock
import pyarrow as pa
import pyarrow.parquet as pq

from rlhf_core.atomic import atomic_write
from rlhf_core.redact import redact_json
from rlhf_core.storage import is_storage_error, storage_error

TABLES: dict[str, dict[str, str]] = {
    "samples": {
        "run_id": "VARCHAR", "stage": "VARCHAR", "step": "BIGINT", "data_source": "VARCHAR",
        "uid": "VARCHAR", "sample_idx": "BIGINT", "prompt": "VARCHAR", "response": "VARCHAR",
        "ground_truth": "VARCHAR", "score": "DOUBLE", "prompt_id": "VARCHAR", "question": "VARCHAR",
        "checkpoint": "VARCHAR",
    },
    "metrics": {
        "run_id": "VARCHAR", "stage": "VARCHAR", "step": "BIGINT", "key": "VARCHAR", "value": "DOUBLE",
    },
    "runs": {
        "run_id": "VARCHAR", "flow_run_id": "VARCHAR", "stage": "VARCHAR", "status": "VARCHAR",
        "started_at": "TIMESTAMP", "ended_at": "TIMESTAMP", "params_json": "VARCHAR",
        "name": "VARCHAR", "kind": "VARCHAR",
    },
}
# Views over the three tables. ``runs`` may hold several rows for one run id in a store written
# before runs were keyed by run id alone, hence the GROUP BY in ``_run_index``.
DERIVED_VIEWS: dict[str, str] = {
    "prompt_scores": """
        WITH run_index AS (
            SELECT run_id, any_value(flow_run_id) AS flow_run_id, min(started_at) AS started_at
            FROM runs GROUP BY run_id)
        SELECT s.run_id, any_value(r.flow_run_id) AS flow_run_id, s.stage, s.step, s.data_source,
               coalesce(s.prompt_id, s.uid) AS prompt_id, any_value(s.question) AS question,
               any_value(s.prompt) AS prompt, any_value(s.checkpoint) AS checkpoint,
               avg(s.score) AS score, count(*) AS n_samples, any_value(r.started_at) AS started_at
        FROM samples s LEFT JOIN run_index r ON r.run_id = s.run_id
        GROUP BY s.run_id, s.stage, s.step, s.data_source, coalesce(s.prompt_id, s.uid)""",
    "compare_pairs": """
        SELECT a.run_id AS run_a, b.run_id AS run_b, a.flow_run_id AS flow_a, b.flow_run_id AS flow_b,
               a.data_source, a.prompt_id, coalesce(b.question, a.question) AS question,
               a.score AS score_a, b.score AS score_b, b.score - a.score AS diff
        FROM prompt_scores a JOIN prompt_scores b
          ON a.data_source = b.data_source AND a.prompt_id = b.prompt_id AND a.run_id <> b.run_id
        WHERE a.stage = 'evaluate' AND b.stage = 'evaluate'""",
}
logger = logging.getLogger(__name__)
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+$")
# the longest wait for another connection of this store (a long query of the results CLI)
_LOCK_TIMEOUT_S = 60.0


def prompt_id(prompt: str | None, data_source: str | None) -> str:
    """Stable id of a prompt across runs: the first 16 hex digits of sha256(data_source, NUL, prompt).

    ``prompt`` is the prompt as rendered (the text the model saw); ``None`` counts as ``""``.
    """
    blob = f"{data_source or ''}\0{prompt or ''}".encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def _check_name(kind: str, value: str) -> str:
    if not value or not _SAFE.match(value):
        raise ValueError(f"{kind} {value!r} must match {_SAFE.pattern} (it becomes a folder name)")
    return value


def _atomic_write(table: pa.Table, dest: Path, root: Path) -> None:
    """Write ``table`` to ``dest`` (a file under the store's ``root``) atomically
    (:func:`rlhf_core.atomic.atomic_write`).

    Raises:
        StorageError: a full disk or a read-only file system: no partial file is left and every file already in
            the store stays (queries keep working); the message names ``dest`` and says so.
    """
    try:
        with atomic_write(dest) as fh:
            pq.write_table(table, fh)
    except OSError as exc:
        if is_storage_error(exc):
            raise storage_error(exc, f"results store: {table.num_rows} row(s) to", dest,
                                f"every file registered before under {root} (still queryable), no partial "
                                f"file") from exc
        raise


class ResultsStore:
    """Parquet files + DuckDB views under ``home`` (see the module docstring).

    Args:
        home: the project home (``infra.home.rlhf_home()``); created when missing.
    """

    def __init__(self, home: Path | str):
        self.home = Path(home).expanduser().resolve()
        self.root = self.home / "results"
        self.db_path = self.home / "results.duckdb"
        for table in TABLES:
            (self.root / table).mkdir(parents=True, exist_ok=True)
        self._globbed: dict[str, bool] = {}
        self.refresh_views(strict=False)

    def _db_lock(self) -> filelock.FileLock:
        """The lock every connection of this store to ``db_path`` is opened under (one at a time, any process)."""
        return filelock.FileLock(f"{self.db_path}.lock", timeout=_LOCK_TIMEOUT_S)

    # ----------------------------------------------------------------- views
    def _glob(self, table: str) -> str:
        return str(self.root / table / "**" / "*.parquet")

    def _has_files(self, table: str) -> bool:
        return any(self.root.joinpath(table).rglob("*.parquet"))

    def _view_sql(self, table: str, globbed: bool) -> str:
        if globbed:
            src = (f"read_parquet('{self._glob(table)}', union_by_name=true, "
                   f"hive_partitioning=false)")
            return f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM {src}"
        cols = ", ".join(f"CAST(NULL AS {typ}) AS {name}" for name, typ in TABLES[table].items())
        return f"CREATE OR REPLACE VIEW {table} AS SELECT {cols} WHERE false"

    def refresh_views(self, strict: bool = True) -> bool:
        """(Re)create the three views in the database file with a brief write connection.

        Args:
            strict: raise when the database cannot be opened for writing; otherwise log a warning and
                return False (the parquet files are safe either way; views are refreshed next time).

        Returns:
            True when the views were written.

        Raises:
            filelock.Timeout: ``strict`` and another connection of this store kept the lock ``_LOCK_TIMEOUT_S``.
            duckdb.IOException: ``strict`` and a client outside this store holds the database file.
            duckdb.TransactionException, OSError: ``strict`` and the disk is full (or read-only).
        """
        state = {t: self._has_files(t) for t in TABLES}
        try:
            with self._db_lock():
                con = self._connect_rebuilding_corrupt()
                try:
                    for table, globbed in state.items():
                        con.execute(self._view_sql(table, globbed))
                    for name, body in DERIVED_VIEWS.items():
                        try:
                            con.execute(f"CREATE OR REPLACE VIEW {name} AS {body}")
                        except duckdb.BinderException as exc:  # a store too old for this view
                            logger.warning("results: view %s not created (%s)", name, exc)
                finally:
                    con.close()
        except (filelock.Timeout, duckdb.IOException, duckdb.TransactionException, OSError) as exc:
            if strict:
                raise
            # a client outside this store holds the file, or the disk is full ("Failed to commit: Could not write
            # file ...wal": DuckDB rolls back, the old views stay); the parquet files are safe either way
            logger.warning("results: views in %s not refreshed (%s); will retry",
                           self.db_path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return False
        self._globbed = state
        return True

    def _connect_rebuilding_corrupt(self) -> duckdb.DuckDBPyConnection:
        """A write connection to ``db_path``. A file DuckDB cannot read ("not a valid DuckDB database file":
        truncated, overwritten) holds only views, so it is moved aside to ``<db>.corrupt-<unix time>`` with a
        warning naming both files, and a fresh database is created (the caller rebuilds the views from the parquet
        files; nothing is lost). Called under :meth:`_db_lock`.

        Raises:
            duckdb.IOException: any other I/O error, e.g. a client outside this store holds the file.
        """
        try:
            return duckdb.connect(str(self.db_path))
        except duckdb.IOException as exc:
            if "not a valid DuckDB database file" not in str(exc):
                raise
            aside = self.db_path.with_name(f"{self.db_path.name}.corrupt-{int(time.time())}")
            os.replace(self.db_path, aside)
            logger.warning("results: %s is not a valid DuckDB database (%s); moved it to %s and rebuilt its views "
                           "from the parquet files under %s (nothing lost: the file holds only views)",
                           self.db_path, exc, aside, self.root)
            return duckdb.connect(str(self.db_path))

    def _after_write(self, table: str) -> None:
        if not self._globbed.get(table):
            self.refresh_views(strict=False)

    # ---------------------------------------------------------------- writers
    def register_samples(
        self, parquet_paths: Iterable[str], run_id: str, stage: str,
        checkpoint: str | Mapping[int, str] | None = None,
        questions: Mapping[str, str] | None = None, suite: str | None = None,
    ) -> int:
        """Copy sample parquet files into the store, adding ``run_id``, ``stage``, ``prompt_id``,
        ``question`` and ``checkpoint`` columns.

        Each file lands at ``results/samples/run_id=<id>/stage=<stage>/<name>.parquet``;
        registering the same file again replaces only that copy (retries are idempotent).

        Args:
            parquet_paths: local parquet files with the core's sample columns.
            run_id: MLflow run id of the stage (letters, digits, ``_.-``).
            stage: stage name, e.g. ``ppo`` or ``evaluate``.
            checkpoint: the checkpoint the samples came from: one path for every row, or
                ``{step: path}`` (rows of other steps get NULL). A file's own ``checkpoint``
                column is kept where this gives none.
            questions: ``{prompt_id: raw question}``; a file's own ``question`` column is kept
                for rows this does not cover.
            suite: an evaluation suite: each row's ``data_source`` becomes ``<suite>/<data_source>`` (so
                comparisons and the regression gate, which group by ``data_source``, work per suite) and a ``suite``
                column is added; ``prompt_id`` stays that of the original data source (a prompt keeps its id).

        Returns:
            Number of rows registered.

        Raises:
            ValueError: ``run_id`` or ``stage`` is not a safe folder name.
            StorageError: a full disk or a read-only file system (one line naming the file; nothing half-written,
                every file registered before kept).
            FileNotFoundError: a path does not exist.
        """
        _check_name("run_id", run_id)
        _check_name("stage", stage)
        dest_dir = self.root / "samples" / f"run_id={run_id}" / f"stage={stage}"
        total = 0
        for path in parquet_paths:
            table = _with_sample_ids(pq.read_table(path), checkpoint, questions or {})
            if suite is not None:
                sources = [f"{suite}/{d}" for d in table.column("data_source").to_pylist()]
                table = table.set_column(table.column_names.index("data_source"), "data_source",
                                         pa.array(sources, pa.string()))
                table = table.drop_columns([c for c in ("suite",) if c in table.column_names])
                table = table.append_column("suite", pa.array([suite] * table.num_rows, pa.string()))
            for col in ("run_id", "stage"):
                if col in table.column_names:
                    table = table.drop_columns([col])
            n = table.num_rows
            table = table.add_column(0, "stage", pa.array([stage] * n, pa.string()))
            table = table.add_column(0, "run_id", pa.array([run_id] * n, pa.string()))
            _atomic_write(table, dest_dir / Path(path).name, self.root)
            total += n
        self._after_write("samples")
        return total

    def register_metrics(
        self, rows: Iterable[Mapping[str, Any]], run_id: str, stage: str, name: str = "metrics"
    ) -> int:
        """Store per-step metrics in long form (``run_id, stage, step, key, value``).

        Args:
            rows: either long rows ``{"step", "key"|"name", "value"}`` (the core's jsonl
                file sink writes ``name``) or wide rows
                ``{"step": 3, "actor/pg_loss": 0.1, ...}`` (the core's jsonl file sink);
                non-numeric values are skipped.
            run_id, stage: as in :meth:`register_samples`.
            name: file name stem, so several batches of one stage can coexist
                (e.g. ``segment_2``); the same name replaces the earlier file.

        Returns:
            Number of (step, key, value) rows written.

        Raises:
            ValueError: unsafe ``run_id``/``stage``/``name``, or a row without ``step``.
            StorageError: a full disk or a read-only file system (one line naming the file; nothing half-written,
                every file registered before kept).
        """
        _check_name("run_id", run_id)
        _check_name("stage", stage)
        _check_name("name", name)
        steps, keys, values = [], [], []
        for row in rows:
            if "step" not in row:
                raise ValueError(f"metrics row without 'step': {dict(row)!r:.200}")
            step = int(row["step"])
            long_key = "key" if "key" in row else "name" if "name" in row else None
            items = [(row[long_key], row.get("value"))] if long_key else [
                (k, v) for k, v in row.items() if k != "step"]
            for key, value in items:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                steps.append(step)
                keys.append(str(key))
                values.append(float(value))
        n = len(steps)
        table = pa.table({
            "run_id": pa.array([run_id] * n, pa.string()),
            "stage": pa.array([stage] * n, pa.string()),
            "step": pa.array(steps, pa.int64()),
            "key": pa.array(keys, pa.string()),
            "value": pa.array(values, pa.float64()),
        })
        _atomic_write(table, self.root / "metrics" / f"run_id={run_id}" / f"stage={stage}" / f"{name}.parquet",
                      self.root)
        self._after_write("metrics")
        return n

    def index_run(
        self, run_id: str, flow_run_id: str | None, stage: str, status: str,
        started_at: Any, ended_at: Any | None, params_json: str,
        name: str | None = None, kind: str = "stage",
    ) -> None:
        """Write (or replace) the run-index row of ``run_id``: one row per run id, ever.

        Args:
            run_id: a stage's MLflow run id, or (``kind="flow"``) the Prefect flow-run id.
            stage: the stage name (``flow`` for a flow run).
            status: ``RUNNING``, ``FINISHED`` or ``FAILED``.
            started_at, ended_at: ``datetime`` (naive UTC) or ``None`` for a running run.
            params_json: the run's whole resolved config (a stage) or parameters (a flow) as JSON; stored
                with secret values redacted (:func:`rlhf_core.redact.redact_json`).
            name: a readable name (the Prefect flow-run name, the MLflow run name).
            kind: ``flow`` or ``stage``.

        Raises:
            ValueError: unsafe ``run_id`` or ``stage``, or an unknown ``kind``.
            StorageError: a full disk or a read-only file system (one line naming the file; nothing half-written,
                every file registered before kept).
        """
        _check_name("run_id", run_id)
        _check_name("stage", stage)
        if kind not in ("flow", "stage"):
            raise ValueError(f"kind must be 'flow' or 'stage', got {kind!r}")
        table = pa.table({
            "run_id": pa.array([run_id], pa.string()),
            "flow_run_id": pa.array([flow_run_id], pa.string()),
            "stage": pa.array([stage], pa.string()),
            "status": pa.array([status], pa.string()),
            "started_at": pa.array([started_at], pa.timestamp("us")),
            "ended_at": pa.array([ended_at], pa.timestamp("us")),
            "params_json": pa.array([redact_json(params_json)], pa.string()),
            "name": pa.array([name], pa.string()),
            "kind": pa.array([kind], pa.string()),
        })
        _atomic_write(table, self.root / "runs" / f"run_id={run_id}.parquet", self.root)
        self._after_write("runs")

    def forget_run(self, run_id: str) -> None:
        """Remove the run-index row of ``run_id`` (a run refused before it did anything: ``rlhf_cli.tracked``);
        no-op when there is none. Samples and metrics are not touched. Raises ValueError for an unsafe id."""
        (self.root / "runs" / f"run_id={_check_name('run_id', run_id)}.parquet").unlink(missing_ok=True)
        self.refresh_views(strict=False)  # the runs view may have lost its last file

    # ---------------------------------------------------------------- readers
    def sql(self, query: str) -> tuple[list[str], list[tuple]]:
        """Run ``query`` on a short-lived, read-only and confined connection (:meth:`_confined_connection`).

        Only read statements run (:data:`READ_STATEMENTS`: ``SELECT``, ``WITH``, ``FROM``, ``SHOW``, ``DESCRIBE``,
        ``SUMMARIZE``, ``VALUES``, and ``EXPLAIN`` of those); the query reads no file outside ``<home>/results/``
        and writes none.

        Returns:
            ``(column_names, rows)``.

        Raises:
            duckdb.PermissionException: a statement that is not a read (``COPY``, ``EXPORT``, ``ATTACH``, ``SET``,
                ``CREATE``, ``INSERT``, ``INSTALL``...), named with its position; nothing of the query ran. Also
                DuckDB's own, for a file outside ``<home>/results/`` (``read_csv('/etc/passwd')``).
            duckdb.Error: the query is invalid, or a client outside this store holds the database file.
            filelock.Timeout: another connection of this store kept the lock ``_LOCK_TIMEOUT_S``.
        """
        if any(self._has_files(t) and not self._globbed.get(t) for t in TABLES):
            self.refresh_views(strict=False)
        with self._db_lock():
            con = self._confined_connection()
            try:
                _refuse_writes(con, query)
                rel = con.execute(query)
                names = [d[0] for d in rel.description] if rel.description else []
                return names, rel.fetchall()
            finally:
                con.close()

    def _confined_connection(self) -> duckdb.DuckDBPyConnection:
        """A read-only connection to ``db_path`` that can read files only under ``<home>/results/`` (the views'
        parquet files) and cannot change that: DuckDB's ``allowed_directories`` = that folder,
        ``enable_external_access=false`` (no other file, URL, ``ATTACH``, extension install or load) and
        ``lock_configuration=true`` (no later ``SET``/``RESET`` undoes them). ``allowed_directories`` grants writes
        too, so :meth:`sql` also refuses every statement that is not a read (:func:`_refuse_writes`).
        DuckDB refuses ``allowed_directories`` in ``connect(config=...)`` ("before the database is started"),
        hence the ``SET`` statements, in this order, before anything else runs."""
        con = duckdb.connect(str(self.db_path), read_only=True)
        try:
            con.execute("SET allowed_directories = [?]", [f"{self.root}/"])
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
        except BaseException:
            con.close()
            raise
        return con

    def sql_arrow(self, query: str) -> pa.Table:
        """Like :meth:`sql` but returns a ``pyarrow.Table``."""
        names, rows = self.sql(query)
        return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})


READ_STATEMENTS = frozenset({"SELECT"})
"""DuckDB statement types :meth:`ResultsStore.sql` runs (``SHOW``, ``DESCRIBE``, ``SUMMARIZE``, ``VALUES`` and
``FROM x`` parse as ``SELECT``); ``EXPLAIN [ANALYZE]`` runs when what it explains is one of these
(``EXPLAIN ANALYZE COPY ... TO`` writes the file)."""
_EXPLAIN = re.compile(r"^\s*EXPLAIN(\s+ANALYZE)?(\s*\([^)]*\))?\s*", re.IGNORECASE)


def _refuse_writes(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Raise ``duckdb.PermissionException`` naming the first statement of ``query`` whose type is not in
    :data:`READ_STATEMENTS` (an ``EXPLAIN`` counts as what it explains), before any statement runs
    (``SELECT 1; COPY ...`` runs neither).

    Raises:
        duckdb.ParserException: ``query`` does not parse.
    """
    statements = con.extract_statements(query)
    for i, statement in enumerate(statements, 1):
        kind = statement.type.name
        if kind == "EXPLAIN":
            inner = con.extract_statements(_EXPLAIN.sub("", statement.query, count=1))
            kind = "EXPLAIN " + (inner[0].type.name if len(inner) == 1 else "MULTI")
            if kind == "EXPLAIN SELECT":
                continue
        if kind not in READ_STATEMENTS:
            where = f"statement {i} of {len(statements)}" if len(statements) > 1 else "the query"
            raise duckdb.PermissionException(
                f"the results store is read-only: {where} is of type {kind}; only queries run here "
                f"(SELECT, WITH, FROM, SHOW, DESCRIBE, SUMMARIZE, and EXPLAIN of those)")


def _with_sample_ids(table: pa.Table, checkpoint: str | Mapping[int, str] | None,
                     questions: Mapping[str, str]) -> pa.Table:
    """``table`` with ``prompt_id`` (computed from ``prompt`` and ``data_source``), ``question`` and
    ``checkpoint`` columns (see :meth:`ResultsStore.register_samples`)."""
    cols = table.column_names
    n = table.num_rows
    prompts = table.column("prompt").to_pylist() if "prompt" in cols else [None] * n
    sources = table.column("data_source").to_pylist() if "data_source" in cols else [None] * n
    ids = [prompt_id(p, d) for p, d in zip(prompts, sources)]
    own_q = table.column("question").to_pylist() if "question" in cols else [None] * n
    own_c = table.column("checkpoint").to_pylist() if "checkpoint" in cols else [None] * n
    steps = table.column("step").to_pylist() if "step" in cols else [None] * n
    if isinstance(checkpoint, Mapping):
        ckpts = [checkpoint.get(int(s)) if s is not None else None for s in steps]
    else:
        ckpts = [checkpoint] * n
    new = {
        "prompt_id": pa.array(ids, pa.string()),
        "question": pa.array([questions.get(i, q) for i, q in zip(ids, own_q)], pa.string()),
        "checkpoint": pa.array([c if c is not None else o for c, o in zip(ckpts, own_c)], pa.string()),
    }
    for name, arr in new.items():
        if name in table.column_names:
            table = table.drop_columns([name])
        table = table.append_column(name, arr)
    return table
