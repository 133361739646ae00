"""``rlhf data ...`` commands. ``main(argv)`` receives the arguments after ``data``.

    rlhf data gsm8k --local-dir DIR --out OUT

(verl's ``examples/data_preprocess/gsm8k.py --local_dataset_path DIR --local_save_dir OUT`` spellings are
accepted too.)
"""
from __future__ import annotations

import argparse
import sys

from rlhf_core.cli import run_command
from rlhf_core.data.gsm8k import preprocess_gsm8k


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf data", description="Prepare datasets in the verl parquet schema.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gsm8k", help="GSM8K → {train,test}.parquet")
    g.add_argument("--local-dir", "--local_dataset_path", dest="local_dir", default=None,
                   help="folder or fsspec URL with train.jsonl/test.jsonl; omitted: read from the HF hub")
    g.add_argument("--out", "--local_save_dir", dest="out", required=True, help="output folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a data command; returns the exit code (0 ok, 1 bad or unreachable data: one line on stderr, 2 bad
    command line; see :mod:`rlhf_core.cli`)."""
    def command(args: list[str]) -> int:
        ns = _parser().parse_args(args)
        for split, path in preprocess_gsm8k(ns.local_dir, ns.out).items():  # the only command: gsm8k
            print(f"{split}: {path}")
        return 0

    return run_command("rlhf data", command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
