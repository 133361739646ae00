"""DuckDB results store: per-sample generations, per-step metrics and a run index.

Writers never hold a database lock: they append parquet files under ``<home>/results/``
(each written to a temporary name and renamed into place, so a reader never sees half a
file and a dying writer loses nothing already registered). The DuckDB file
``<home>/results.duckdb`` holds only VIEWS over those files:

- ``samples``: one row per generated response, with its ``score``, ``prompt_id``, ``question`` and ``checkpoint``;
- ``metrics``: ``run_id, stage, step, key, value``;
- ``runs``: one row per run id (a flow run or a stage run),

and views derived from them (``prompt_scores``, ``compare_pairs``): every column in :mod:`infra.results_schema`.

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

import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import duckdb
import filelock
import pyarrow as pa
import pyarrow.parquet as pq

from infra.results_schema import (DERIVED_VIEWS, TABLES, label_suite, metrics_table, prompt_id, view_sql,
                                  with_sample_ids)
from infra.results_sql import confined_connection, refuse_writes
from rlhf_core.atomic import atomic_write
from rlhf_core.redact import redact_json
from rlhf_core.storage import is_storage_error, storage_error

# re-exported: tests import prompt_id from here (tests/infra, tests/tasks, tests/reliability); code uses results_schema
__all__ = ["ResultsStore", "prompt_id"]

logger = logging.getLogger(__name__)
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+$")
# the longest wait for another connection of this store (a long query of the results CLI)
_LOCK_TIMEOUT_S = 60.0


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
                        con.execute(view_sql(table, self._glob(table) if globbed else None))
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
        questions: Mapping[str, str] | None = None, suite: str | None = None, step: int | None = None,
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
            step: the training step every row belongs to, replacing the file's ``step`` column (the evaluation of
                a final checkpoint: ``rlhf eval`` writes step 0, knowing no training step); None keeps the file's.

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
            table = with_sample_ids(pq.read_table(path), checkpoint, questions or {})
            if suite is not None:
                table = label_suite(table, suite)
            n = table.num_rows
            if step is not None:
                column = pa.array([int(step)] * n, pa.int64())
                index = table.column_names.index("step") if "step" in table.column_names else None
                table = (table.set_column(index, "step", column) if index is not None
                         else table.append_column("step", column))
            for col in ("run_id", "stage"):
                if col in table.column_names:
                    table = table.drop_columns([col])
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
        table = metrics_table(rows, run_id, stage)
        _atomic_write(table, self.root / "metrics" / f"run_id={run_id}" / f"stage={stage}" / f"{name}.parquet",
                      self.root)
        self._after_write("metrics")
        return table.num_rows

    def index_run(
        self, run_id: str, flow_run_id: str | None, stage: str, status: str,
        started_at: Any, ended_at: Any | None, params_json: str,
        name: str | None = None, kind: str = "stage",
    ) -> None:
        """Write (or replace) the run-index row of ``run_id``: one row per run id, ever.

        Args:
            run_id: a stage's MLflow run id, or (``kind="flow"``) the Prefect flow-run id.
            stage: the stage name (``flow`` for a flow run).
            status: ``RUNNING``, ``FINISHED`` or ``FAILED``; a flow run that a resumed run continued and finished:
                ``RESUMED`` (``flows.resume.mark_resumed``).
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

        Only read statements run (:data:`infra.results_sql.READ_STATEMENTS`: ``SELECT``, ``WITH``, ``FROM``,
        ``SHOW``, ``DESCRIBE``, ``SUMMARIZE``, ``VALUES``, and ``EXPLAIN`` of those); the query reads no file outside
        ``<home>/results/`` and writes none.

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
                refuse_writes(con, query)
                rel = con.execute(query)
                names = [d[0] for d in rel.description] if rel.description else []
                return names, rel.fetchall()
            finally:
                con.close()

    def _confined_connection(self) -> duckdb.DuckDBPyConnection:
        """A read-only connection to ``db_path`` that reads files only under ``<home>/results/`` and cannot be
        re-configured (:func:`infra.results_sql.confined_connection`)."""
        return confined_connection(self.db_path, self.root)

    def sql_arrow(self, query: str) -> pa.Table:
        """Like :meth:`sql` but returns a ``pyarrow.Table``."""
        names, rows = self.sql(query)
        return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})

