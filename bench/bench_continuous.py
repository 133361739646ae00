"""Rollout throughput with skewed response lengths: continuous batching (``hf_continuous.ContinuousDecoder``, a
finished request's slot refilled at the next step) vs sub-batch decoding (``hf_decode.decode`` on sub-batches of
``--slots`` rows, each running until its longest row ends: the fully async rollouter's sub-batches before continuous
batching), in the same run.

    OMP_NUM_THREADS=1 python bench/bench_continuous.py [--size 1m|20m] [--prompts 16] [--n 4] [--slots 8]
        [--short 8] [--long 128] [--reps 3] [--threads 1]

Model: a randomly initialised Qwen2 of the demo's tiny sizes (``--size 1m``: hidden 128, 4 layers, vocabulary 2,000,
~1 M parameters; ``20m`` as ``bench_ppo_step.py``), float32, SDPA. Prompts: random ids of 20-60 tokens, each repeated
``--n`` times (``rollout.n``). Half the requests (alternating) stop after ``--short`` tokens, half after ``--long``:
per-request budgets in the continuous engine; a sub-batch decodes ``max`` of its rows' budgets (a row that ended
keeps its slot until the sub-batch ends, as at an EOS; every sub-batch here holds a long row). Sampling at
temperature 1, no EOS. Variants: ``continuous``; ``subbatch`` (``decode(fast=False)``: the model's own forward, as
the continuous engine runs it); ``subbatch_fast`` (``decode``'s default grouped-attention / reordered-weight step,
which the continuous engine does not have). Prints, per variant, median / min / max seconds over ``--reps`` runs of
all requests (one warm-up each, variants taken in turn) and responses/s at the median; the rate ratios per rep
(variants of one rep run back to back, so a shared machine's load drifts less between them) and of the medians;
then ``uptime``.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZES = {"1m": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2),
         "20m": dict(hidden_size=384, intermediate_size=1152, num_hidden_layers=11, num_attention_heads=6,
                     num_key_value_heads=2)}


def build(args):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=2000, max_position_embeddings=512, pad_token_id=0,
                                         attn_implementation="sdpa", **SIZES[args.size])).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 2000, (int(torch.randint(20, 61, (1,), generator=g)),), generator=g)
               for _ in range(args.prompts)]
    requests = [p for p in prompts for _ in range(args.n)]
    budgets = [args.short if i % 2 == 0 else args.long for i in range(len(requests))]
    return model, requests, budgets


def continuous(model, requests, budgets, slots):
    from rlhf_core.workers.rollout.hf_continuous import ContinuousDecoder

    engine = ContinuousDecoder(model, slots, [], do_sample=True)
    for i, (p, t) in enumerate(zip(requests, budgets)):
        engine.submit(p, t, seed=i)
    done = engine.run()
    assert sorted(len(f.tokens) for f in done) == sorted(budgets)
    return engine.step_index


def subbatch(model, requests, budgets, slots, fast):
    from rlhf_core.workers.rollout.hf_decode import decode

    steps = 0
    for lo in range(0, len(requests), slots):
        rows, T = requests[lo:lo + slots], max(budgets[lo:lo + slots])
        P = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), P), dtype=torch.long)
        mask = torch.zeros((len(rows), P), dtype=torch.long)
        for j, r in enumerate(rows):
            ids[j, P - len(r):], mask[j, P - len(r):] = r, 1
        with torch.no_grad():
            out, _ = decode(model, ids, mask, T, [], 0, True, fast=fast)
        steps += out.shape[1]
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="1m")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--long", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from rlhf_core import kernels

    kernels.install()  # decode's grouped attention (subbatch_fast) needs it, as the rollout worker installs it
    model, requests, budgets = build(args)
    variants = {"continuous": lambda: continuous(model, requests, budgets, args.slots),
                "subbatch": lambda: subbatch(model, requests, budgets, args.slots, fast=False),
                "subbatch_fast": lambda: subbatch(model, requests, budgets, args.slots, fast=True)}
    times = {k: [] for k in variants}
    steps = {k: f() for k, f in variants.items()}  # warm-up, and the decode steps each variant runs
    for _ in range(args.reps):
        for k, f in variants.items():
            start = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - start)
    print(f"{len(requests)} requests ({args.prompts} prompts x n={args.n}), budgets {args.short}/{args.long} "
          f"alternating, {args.slots} slots / sub-batch rows, size {args.size}, {args.threads} thread(s)")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"{k:>14}: {steps[k]:4d} steps  median {med:7.3f} s  (min {min(ts):.3f}, max {max(ts):.3f})  "
              f"{len(requests) / med:7.2f} responses/s")
    for peer in ("subbatch", "subbatch_fast"):  # per rep: the two variants ran back to back (less load drift)
        ratios = sorted(p / c for p, c in zip(times[peer], times["continuous"]))
        print(f"continuous rate / {peer} rate: median {statistics.median(ratios):.2f}x of the per-rep ratios "
              f"({', '.join(f'{r:.2f}' for r in ratios)}); of the medians "
              f"{statistics.median(times[peer]) / statistics.median(times['continuous']):.2f}x")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
