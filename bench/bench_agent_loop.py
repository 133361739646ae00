"""Async (continuous batching) vs sync (static batches) agent-loop scheduling when trajectory lengths differ widely.

    PYTHONPATH=. python bench/bench_agent_loop.py [--requests 16] [--slots 4] [--long 96] [--short 8]

A random-initialised tiny Qwen2 model (no download) serves ``--requests`` requests: one in four asks for
``--long`` tokens, the rest for ``--short`` (no EOS, so the lengths are exact). Both schedules run on the same
engine with the same seeds; the script checks they sample identical tokens, then prints wall time, decoding
steps and the sync/async time ratio (> 1 means async is faster).
"""
from __future__ import annotations

import argparse
import asyncio
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlhf_core.agent.engine import SamplingParams, StepEngine


def run(model, schedule: str, budgets: list[int], slots: int):
    engine = StepEngine(model, [], 0, SamplingParams(temperature=1.0), seed=0, max_num_seqs=slots, schedule=schedule)
    prompts = [[1 + (i * 7) % 500, 2, 3, 4 + i] for i in range(len(budgets))]

    async def go():
        return await asyncio.gather(*(engine.generate(p, b, f"req{i}") for i, (p, b) in enumerate(zip(prompts, budgets))))

    start = time.perf_counter()
    outs = asyncio.run(go())
    return time.perf_counter() - start, engine.steps, [o.token_ids for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--long", type=int, default=96)
    parser.add_argument("--short", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                         tie_word_embeddings=True)).eval()
    budgets = [args.long if i % 4 == 0 else args.short for i in range(args.requests)]
    t_async, s_async, tok_async = run(model, "continuous", budgets, args.slots)
    t_sync, s_sync, tok_sync = run(model, "static", budgets, args.slots)
    assert tok_async == tok_sync, "async and sync sampled different tokens"
    print(f"requests={args.requests} slots={args.slots} lengths: {budgets.count(args.long)}x{args.long}, "
          f"{budgets.count(args.short)}x{args.short} (identical tokens in both modes)")
    print(f"async (continuous): {t_async:.2f} s, {s_async} steps")
    print(f"sync  (static):     {t_sync:.2f} s, {s_sync} steps")
    print(f"sync/async time ratio: {t_sync / t_async:.2f}")


if __name__ == "__main__":
    main()
