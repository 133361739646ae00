"""The read-only, confined connection ``rlhf results sql`` queries run on (:meth:`infra.results.ResultsStore.sql`):
only read statements run (:func:`refuse_writes`), and the connection reads no file outside the store's
``<home>/results/`` and cannot be re-configured (:func:`confined_connection`).
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb


def confined_connection(db_path: Path, root: Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to ``db_path`` that can read files only under ``root`` (the views'
    parquet files) and cannot change that: DuckDB's ``allowed_directories`` = that folder,
    ``enable_external_access=false`` (no other file, URL, ``ATTACH``, extension install or load) and
    ``lock_configuration=true`` (no later ``SET``/``RESET`` undoes them). ``allowed_directories`` grants writes
    too, so :meth:`infra.results.ResultsStore.sql` also refuses every statement that is not a read
    (:func:`refuse_writes`). DuckDB refuses ``allowed_directories`` in ``connect(config=...)`` ("before the
    database is started"), hence the ``SET`` statements, in this order, before anything else runs."""
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        con.execute("SET allowed_directories = [?]", [f"{root}/"])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


READ_STATEMENTS = frozenset({"SELECT"})
"""DuckDB statement types :meth:`infra.results.ResultsStore.sql` runs (``SHOW``, ``DESCRIBE``, ``SUMMARIZE``,
``VALUES`` and ``FROM x`` parse as ``SELECT``); ``EXPLAIN [ANALYZE]`` runs when what it explains is one of these
(``EXPLAIN ANALYZE COPY ... TO`` writes the file)."""
_EXPLAIN = re.compile(r"^\s*EXPLAIN(\s+ANALYZE)?(\s*\([^)]*\))?\s*", re.IGNORECASE)


def refuse_writes(con: duckdb.DuckDBPyConnection, query: str) -> None:
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

