"""``rlhf data ...`` commands. ``main(argv)`` receives the arguments after ``data``.

    rlhf data gsm8k --local-dir DIR --out OUT [--multiturn]

(verl's ``examples/data_preprocess/gsm8k.py --local_dataset_path DIR --local_save_dir OUT`` spellings are
accepted too.)
"""
from __future__ import annotations

import argparse
import sys

from rlhf_core.data import DataError, RemoteUnavailableError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf data", description="Prepare datasets in the verl parquet schema.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gsm8k", help="GSM8K → {train,test}.parquet")
    g.add_argument("--local-dir", "--local_dataset_path", dest="local_dir", default=None,
                   help="folder or fsspec URL with train.jsonl/test.jsonl; omitted: read from the HF hub")
    g.add_argument("--out", "--local_save_dir", dest="out", required=True, help="output folder")
    g.add_argument("--multiturn", action="store_true",
                   help="verl's multi-turn tool schema (gsm8k_multiturn_w_tool.py): tool_agent, tools_kwargs")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a data command; returns the process exit code (0 ok, 2 bad data or arguments)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.command == "gsm8k":
        from rlhf_core.data.gsm8k import preprocess_gsm8k

        try:
            paths = preprocess_gsm8k(args.local_dir, args.out, multiturn=args.multiturn)
        except (DataError, FileNotFoundError, RemoteUnavailableError) as exc:
            print(f"rlhf data gsm8k: {exc}", file=sys.stderr)
            return 2
        for split, path in paths.items():
            print(f"{split}: {path}")
        return 0
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
