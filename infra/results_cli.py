"""Query the results store: ``rlhf results sql "SELECT ..."``, ``rlhf results path``,
``rlhf results compare RUN_A RUN_B [--show regressed]`` and ``rlhf results register PATH``."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from infra.text import escape_control

EXAMPLE_QUERY = (
    "SELECT stage, step, data_source, avg(score) AS mean_score, count(*) AS n "
    "FROM samples GROUP BY ALL ORDER BY stage, step"
)


def format_table(names: list[str], rows: list[tuple], max_width: int = 60) -> str:
    """Render ``rows`` as a fixed-width text table, columns joined by `` | ``; column names and cells are escaped
    (:func:`escape_control`, and ``|`` as ``\\|``, so every ``|`` of a row line is a column border and every line
    one row), and cells longer than ``max_width`` (after escaping) are cut with '…'."""

    def escaped(value: object) -> str:
        return escape_control(str(value)).replace("|", "\\|")

    def cell(value: object) -> str:
        text = "NULL" if value is None else escaped(value)
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    names = [escaped(n) for n in names]
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
    c = sub.add_parser("compare", help="compare the evaluation of two runs prompt by prompt")
    c.add_argument("run_a", help="baseline: flow-run id, MLflow run id, latest or previous")
    c.add_argument("run_b", help="candidate: flow-run id, MLflow run id, latest or previous")
    c.add_argument("--show", choices=["regressed", "improved", "failing"], help="list those prompts")
    c.add_argument("--limit", type=int, default=20, help="prompts listed per data source")
    c.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    c.add_argument("--n-boot", type=int, default=10000, help="bootstrap resamples")
    r = sub.add_parser("register", help="add an existing run folder (rlhf ppo / rlhf eval output)")
    r.add_argument("path", help="folder with sample parquet files (val_step_*.parquet, eval_samples.parquet) "
                                "and optionally metrics.jsonl")
    r.add_argument("--stage", choices=["ppo", "evaluate", "sft"], help="default: guessed from the files")
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return int(exc.code or 0)

    import os
    from pathlib import Path

    from infra.home import rlhf_home
    from infra.results import ResultsStore

    if args.cmd == "register":  # a refused folder creates nothing: no home folder, no store
        from infra.run_folders import check_run_folder

        try:
            check_run_folder(args.path)
        except (FileNotFoundError, ValueError) as exc:
            print(f"rlhf results: error: {exc}", file=sys.stderr)
            return 1
    expected = Path(os.environ.get("RLHF_HOME") or ".rlhf").expanduser().resolve()
    if not (expected / "results").exists():
        # a query from another folder would silently see an empty store: say where we looked
        print(f"rlhf results: note: no results under {expected} yet (set RLHF_HOME, or run from the folder the flow ran in)",
              file=sys.stderr)
    store = ResultsStore(rlhf_home())
    if args.cmd == "path":
        print(store.db_path)
        return 0
    if args.cmd == "compare":
        from infra.compare import RunNotFoundError, compare_runs, format_comparison

        try:
            cmp = compare_runs(store, args.run_a, args.run_b, seed=args.seed, n_boot=args.n_boot)
        except RunNotFoundError as exc:
            print(f"rlhf results: error: {exc}", file=sys.stderr)
            return 1
        print(format_comparison(cmp, show=args.show, limit=args.limit))
        return 0
    if args.cmd == "register":
        from infra.run_folders import register_folder

        try:
            info = register_folder(store, args.path, stage=args.stage)
        except (FileNotFoundError, ValueError) as exc:
            print(f"rlhf results: error: {exc}", file=sys.stderr)
            return 1
        print(f"registered {info['samples']} samples and {info['metrics']} metric values of "
              f"{args.path} as run {info['run_id']} (stage {info['stage']})")
        return 0
    import duckdb

    try:
        names, rows = store.sql(args.query)
    except duckdb.Error as exc:
        print(f"rlhf results: error: {exc}", file=sys.stderr)
        return 1
    print(format_table(names, rows, args.max_width))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
