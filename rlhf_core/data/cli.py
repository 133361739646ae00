"""``rlhf data ...`` commands. ``main(argv)`` receives the arguments after ``data``.

    rlhf data gsm8k --local-dir DIR --out OUT
    rlhf data countdown --out OUT [--train-size 20000 --test-size 500 --seed 0 --min-numbers 3 --max-numbers 3
                                   --max-number 9]

(verl's ``examples/data_preprocess/gsm8k.py --local_dataset_path DIR --local_save_dir OUT`` spellings are
accepted too.)
"""
from __future__ import annotations

import argparse
import sys

from rlhf_core.cli import run_command
from rlhf_core.data import DataError
from rlhf_core.data.countdown import generate_countdown
from rlhf_core.data.gsm8k import preprocess_gsm8k


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf data", description="Prepare datasets in the verl parquet schema.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gsm8k", help="GSM8K → {train,test}.parquet")
    g.add_argument("--local-dir", "--local_dataset_path", dest="local_dir", default=None,
                   help="folder or fsspec URL with train.jsonl/test.jsonl; omitted: read from the HF hub")
    g.add_argument("--out", "--local_save_dir", dest="out", required=True, help="output folder")
    c = sub.add_parser("countdown", help="Countdown (reach a target with + - *) → {train,test}.parquet, fixed seed")
    c.add_argument("--out", required=True, help="output folder")
    c.add_argument("--train-size", type=int, default=20000, help="train rows")
    c.add_argument("--test-size", type=int, default=500, help="test rows (distinct, never in train)")
    c.add_argument("--seed", type=int, default=0, help="random seed: same arguments, same files")
    c.add_argument("--min-numbers", type=int, default=3, help="fewest numbers in a problem")
    c.add_argument("--max-numbers", type=int, default=3, help="most numbers in a problem")
    c.add_argument("--max-number", type=int, default=9, help="numbers are drawn from 1..max-number")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a data command; returns the exit code (0 ok, 1 bad or unreachable data or bad generator arguments: one
    line on stderr, 2 bad command line; see :mod:`rlhf_core.cli`)."""
    def command(args: list[str]) -> int:
        ns = _parser().parse_args(args)
        if ns.command == "countdown":
            try:
                paths = generate_countdown(ns.out, ns.train_size, ns.test_size, ns.seed, ns.min_numbers,
                                           ns.max_numbers, ns.max_number)
            except ValueError as exc:
                raise DataError(f"rlhf data countdown: {exc}") from exc
        else:
            paths = preprocess_gsm8k(ns.local_dir, ns.out)
        for split, path in paths.items():
            print(f"{split}: {path}")
        return 0

    return run_command("rlhf data", command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
