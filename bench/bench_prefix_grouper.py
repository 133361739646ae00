"""``actor_rollout_ref.actor.use_prefix_grouper`` against the plain forward, measured in the same run.

    python bench/bench_prefix_grouper.py [--prompt 512] [--response 32] [--n 8] [--prompts 1] [--rounds 7]
                                         [--threads 2] [--hidden 256] [--layers 4] [--vocab 2000]

The workload: ``--prompts`` prompts of ``--prompt`` tokens, each with ``--n`` responses of ``--response // 4`` to
``--response`` tokens (right-padded), one micro-batch, through the actor's own response-logits function
(``rlhf_core.workers.actor.forward_response_logits``) on a float32 Qwen2 built from a config (``--hidden``,
``--layers``, SDPA attention; random weights: the timing does not depend on them). Two passes, as the trainer runs
them: the log-prob pass (eval, no gradients) and the update pass (train, forward + log-probs + backward of their
masked sum). Three paths, each timed once per round, their order rotated every round so load changes hit all alike:

* ``plain``: every row's prompt and response through the model (``n × (P + T)`` tokens per prompt);
* ``grouped``: ``use_prefix_grouper`` (``kernels/prefix_grouper.py``): one row of ``P + n·T`` tokens per prompt;
* ``kv-shared``: for reference, the KV-cache shared prefix this project takes by default on CPU when prompts repeat
  (``kernels/shared_prefix.py``; two model calls, and not under activation checkpointing).

Printed: per round the seconds of each path and pass; per pass the median ratio ``plain ÷ grouped`` (> 1: the
grouped forward is faster) with its quartiles over rounds, the same for ``kv-shared ÷ grouped``; and the 1-minute
load average (``os.getloadavg``) before and after the run.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """``(lower quartile, median, upper quartile)`` of ``xs`` (``statistics.quantiles``, inclusive method)."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


def workload(args: argparse.Namespace) -> dict:
    """The micro-batch: ``prompts × n`` rows of ``prompt + response`` columns, prompts left-padded (none here),
    responses right-padded; a ``uid`` per prompt."""
    import numpy as np

    g = torch.Generator().manual_seed(0)
    b, P, T = args.prompts * args.n, args.prompt, args.response
    prompts = torch.randint(3, args.vocab, (args.prompts, P), generator=g).repeat_interleave(args.n, 0)
    lens = torch.randint(max(1, T // 4), T + 1, (b,), generator=g)
    rmask = (torch.arange(T)[None, :] < lens[:, None]).long()
    responses = torch.randint(3, args.vocab, (b, T), generator=g) * rmask
    mask = torch.cat([torch.ones(b, P, dtype=torch.long), rmask], 1)
    return {"input_ids": torch.cat([prompts, responses], 1), "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "responses": responses, "response_mask": rmask,
            "uid": np.repeat(np.arange(args.prompts), args.n).astype(str).astype(object)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--response", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlhf_core.algos.utils import logprobs_from_logits
    from rlhf_core.protocol import Batch
    from rlhf_core.workers.actor import choose_response_forward, forward_response_logits

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 256), max_position_embeddings=args.prompt + args.response + 8,
        attn_implementation="sdpa"))
    data = workload(args)
    mb = Batch({k: v for k, v in data.items() if k != "uid"}, {"uid": data["uid"]})
    T = args.response
    base = choose_response_forward(model, False)
    paths = {"plain": dataclasses.replace(base, shared_prefix=False, prefix_grouper=False),
             "grouped": dataclasses.replace(base, shared_prefix=False, prefix_grouper=True),
             "kv-shared": dataclasses.replace(base, shared_prefix=True, prefix_grouper=False)}

    def log_prob_pass(path) -> float:
        model.eval()
        start = time.perf_counter()
        with torch.no_grad():
            logprobs_from_logits(forward_response_logits(model, mb, T, path=path).float(), mb["responses"])
        return time.perf_counter() - start

    def update_pass(path) -> float:
        model.train()
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        lp = logprobs_from_logits(forward_response_logits(model, mb, T, path=path).float(), mb["responses"])
        (lp * mb["response_mask"]).sum().backward()
        return time.perf_counter() - start

    params = sum(p.numel() for p in model.parameters())
    b = args.prompts * args.n
    print(f"model: Qwen2 {params / 1e6:.2f} M parameters (hidden {args.hidden}, {args.layers} layers), float32, "
          f"{args.threads} threads; micro-batch: {args.prompts} prompt(s) x n={args.n}, prompt {args.prompt} tokens, "
          f"responses {int(mb['response_mask'].sum(-1).min())}-{int(mb['response_mask'].sum(-1).max())} of {T}; "
          f"tokens per pass: plain {b * (args.prompt + T)}, grouped {args.prompts * (args.prompt + args.n * T)}")
    load0 = os.getloadavg()[0]
    for name in paths:  # warm-up: one of each, not timed
        log_prob_pass(paths[name]), update_pass(paths[name])
    times = {(name, p): [] for name in paths for p in ("log_prob", "update")}
    names = list(paths)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            times[name, "log_prob"].append(log_prob_pass(paths[name]))
            times[name, "update"].append(update_pass(paths[name]))
        print(f"round {r + 1}: " + "; ".join(f"{name} {times[name, 'log_prob'][-1] * 1e3:.1f} / "
                                             f"{times[name, 'update'][-1] * 1e3:.1f} ms" for name in names)
              + "  (log-prob / update pass)")
    load1 = os.getloadavg()[0]
    for p in ("log_prob", "update"):
        for other in ("plain", "kv-shared"):
            ratios = [a / g for a, g in zip(times[other, p], times["grouped", p])]
            lo, med, hi = quartiles(ratios)
            print(f"{p:8s} pass: {other} / grouped = {med:.2f}x (quartiles {lo:.2f}-{hi:.2f}); median "
                  f"{statistics.median(times[other, p]) * 1e3:.1f} ms vs {statistics.median(times['grouped', p]) * 1e3:.1f} ms")
    print(f"1-min load average: {load0:.2f} before, {load1:.2f} after")


if __name__ == "__main__":
    main()
