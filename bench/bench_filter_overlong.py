"""Time ``filter_overlong_prompts`` on the GSM8K train split with 1 vs 2 worker processes.

    python bench/bench_filter_overlong.py [--gsm8k-dir DIR] [--max-prompt-length 128] [--repeats 2]

Builds the project's tiny tokenizer (BPE trained on GSM8K), preprocesses GSM8K train to the verl parquet
schema, then times :func:`rlhf_core.data.prompts.keep_short_prompts` (render with the chat template +
tokenize, the same code the dataset runs) with 1 and 2 workers; prints both times, the speed-up ratio and
the ideal ratio (the machine's CPU count, capped at 2). It also checks that both keep the same rows.
"""
from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_dir = os.environ.get("GSM8K_DIR", str(REPO_ROOT.parent / "shared" / "data" / "gsm8k"))
    parser.add_argument("--gsm8k-dir", default=default_dir)
    parser.add_argument("--max-prompt-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from transformers import AutoTokenizer

    from rlhf_core.data.gsm8k import preprocess_gsm8k
    from rlhf_core.data.prompts import keep_short_prompts
    from rlhf_core.data.readers import read_parquet_rows
    from rlhf_core.models.tiny import build_tiny_model, gsm8k_texts

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(gsm8k_texts(args.gsm8k_dir, "train", limit=2000), Path(tmp) / "m",
                                     vocab_size=1000)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        train = preprocess_gsm8k(args.gsm8k_dir, str(Path(tmp) / "gsm8k"))["train"]
        prompts = [row["prompt"] for row in read_parquet_rows(train)]
    times: dict[int, float] = {}
    cpu: dict[int, float] = {}
    kept: dict[int, list[int]] = {}
    for workers in (1, 2):
        best = float("inf")
        for _ in range(args.repeats):
            before = _cpu_seconds()
            start = time.perf_counter()
            kept[workers] = keep_short_prompts(tokenizer, prompts, args.max_prompt_length, workers)
            elapsed = time.perf_counter() - start
            if elapsed < best:
                best, cpu[workers] = elapsed, _cpu_seconds() - before
        times[workers] = best
    assert kept[1] == kept[2], "1 and 2 workers kept different rows"
    ideal = min(2, os.cpu_count() or 1)
    print(f"rows: {len(prompts)}  kept (<= {args.max_prompt_length} tokens): {len(kept[1])}")
    for w in (1, 2):
        print(f"{w} worker{'s' if w > 1 else ' '}: {times[w]:.3f} s wall, {cpu[w]:.3f} s CPU (all processes)  "
              f"({len(prompts) / times[w]:.0f} prompts/s)")
    load = os.getloadavg()[0]
    print(f"speed-up 2 vs 1: {times[1] / times[2]:.2f}x  (ideal {ideal}x on {os.cpu_count()} CPUs; "
          f"1-min load average {load:.1f} — the ratio means something only on an otherwise idle machine)")
    return 0


def _cpu_seconds() -> float:
    """User+system CPU of this process and its reaped children (the pool's workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    raise SystemExit(main())
