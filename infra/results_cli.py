"""``rlhf results sql "SELECT ..."`` and ``rlhf results path``: query the results store."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

EXAMPLE_QUERY = (
    "SELECT stage, step, data_source, avg(score) AS mean_score, count(*) AS n "
    "FROM samples GROUP BY ALL ORDER BY stage, step"
)


def format_table(names: list[str], rows: list[tuple], max_width: int = 60) -> str:
    """Render ``rows`` as a fixed-width text table; cells longer than ``max_width`` are cut with '…'."""

    def cell(value: object) -> str:
        text = "NULL" if value is None else str(value).replace("\n", "\\n")
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    line = lambda vals: " | ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [line(names), "-+-".join("-" * w for w in widths)] + [line(r) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point. Returns the process exit status (0 ok, 1 query error, 2 usage error)."""
    parser = argparse.ArgumentParser(prog="rlhf results", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("sql", help="run a SQL query over the views samples, metrics, runs")
    q.add_argument("query", nargs="?", default=EXAMPLE_QUERY)
    q.add_argument("--max-width", type=int, default=60, help="cut cells longer than this (chars)")
    sub.add_parser("path", help="print the DuckDB database file")
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return int(exc.code or 0)

    import os
    from pathlib import Path

    from infra.home import rlhf_home
    from infra.results import ResultsStore

    expected = Path(os.environ.get("RLHF_HOME") or ".rlhf").expanduser().resolve()
    if not (expected / "results").exists():
        # a query from another folder would silently see an empty store: say where we looked
        print(f"note: no results under {expected} yet (set RLHF_HOME, or run from the folder the flow ran in)",
              file=sys.stderr)
    store = ResultsStore(rlhf_home())
    if args.cmd == "path":
        print(store.db_path)
        return 0
    import duckdb

    try:
        names, rows = store.sql(args.query)
    except duckdb.Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_table(names, rows, args.max_width))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
