"""How far each stage of a PPO step is from the machine's limit (issue 38, "the limit, measured").

    OMP_WAIT_POLICY=PASSIVE python bench/bench_limits.py [--sizes 1m,20m,100m] [--device cpu|cuda] [--reps 2]
        [--batch 16] [--prompt-len 64] [--new-tokens 32] [--json FILE]

The limits, at the thread count used (``torch.get_num_threads()``; on CUDA the device):

* GEMM peak in float32 and bf16: the fastest square ``torch.mm`` (n up to 2048 on CPU, 8192 on CUDA), 2·n³ FLOP.
  On CPU it is taken as ``rlhf_core.trainer.mfu`` takes it (the larger of the multi-threaded wall-clock rate and
  threads × the one-thread CPU-time rate), so a loaded machine does not lower the peak the fractions divide by.
* Memory bandwidth: STREAM-like ``copy`` (b = a, 2 × 4 bytes per element) and ``triad`` (a = b + s·c, 3 × 4 bytes)
  on float32 vectors of ``--stream-mb`` MiB each, best of ``--stream-reps``.

The stages, on a random Qwen2 of each ``--sizes`` (the sizes of ``bench_ppo_step.py --size``), float32,
``--batch`` sequences of a ``--prompt-len``-token prompt and ``--new-tokens`` sampled tokens, median of ``--reps``:

* ``decode``: one sampling step with a KV cache, per token step of the batch. Bytes moved per step ≈ the parameter
  bytes (every weight read once) + the KV cache read (2 · layers · kv_heads · head_dim · 4 bytes per cached token
  per sequence, at the mean cache length); fraction = bytes/s over the triad bandwidth (the roofline of a
  memory-bound decode).
* ``log_prob``: a forward over the full sequences without grad; FLOPs = ``mfu.forward_flops`` (verl's count).
* ``update``: forward + backward + AdamW over the full sequences; FLOPs = ``mfu.training_flops``; fraction over the
  float32 GEMM peak is the update's MFU (``perf/mfu/actor``).

Each fraction is given by the wall clock and by the process's CPU time ÷ threads (what the stage would take with
its cores to itself: on a loaded machine the wall clock counts time the process waited for a core). For the stage
furthest from its limit a ``torch.profiler`` summary of its top-5 ops (self CPU time) is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_core.trainer.mfu import forward_flops, gemm_flops_per_s, training_flops  # noqa: E402

from bench_timing import PACKING_SIZES as SIZES  # noqa: E402  (the kernel benchmarks' model sizes)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def gemm_peak(dtype: torch.dtype, device: str, budget_s: float) -> float | None:
    """FLOP/s of the fastest square GEMM in ``dtype`` on ``device`` (see the module docstring); None if unsupported."""
    try:
        if device == "cpu":
            threads = torch.get_num_threads()
            return max(gemm_flops_per_s(dtype, threads, budget_s),
                       threads * gemm_flops_per_s(dtype, 1, budget_s, clock=time.thread_time))
        n, best = 8192, float("inf")
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        torch.mm(a, b)
        for _ in range(10):
            sync(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            sync(device)
            best = min(best, time.perf_counter() - t0)
        return 2.0 * n ** 3 / best
    except RuntimeError as exc:
        print(f"  {dtype} GEMM not measurable on {device}: {exc}")
        return None


def stream(device: str, mb: int, reps: int) -> dict[str, float]:
    """Best bytes/s of a STREAM-like copy and triad on float32 vectors of ``mb`` MiB."""
    n = mb * 2 ** 20 // 4
    a, b, c = (torch.full((n,), v, device=device) for v in (1.0, 2.0, 0.5))
    best = {"copy": float("inf"), "triad": float("inf")}
    for _ in range(reps):
        for name, fn in (("copy", lambda: b.copy_(a)), ("triad", lambda: torch.add(b, c, alpha=3.0, out=a))):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            best[name] = min(best[name], time.perf_counter() - t0)
    return {"copy": 2 * 4 * n / best["copy"], "triad": 3 * 4 * n / best["triad"]}


class Clock:
    """Wall seconds and process CPU seconds ÷ threads of a block (synchronised on CUDA)."""

    def __init__(self, device: str):
        self.device, self.threads = device, torch.get_num_threads()

    def __enter__(self):
        sync(self.device)
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.wall = time.perf_counter() - self.w
        self.cpu = (time.process_time() - self.c) / self.threads if self.device == "cpu" else self.wall


def measure_size(size: str, args, peak32: float, bandwidth: float) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=2000, max_position_embeddings=1024, tie_word_embeddings=True, **SIZES[size])
    model = Qwen2ForCausalLM(cfg).to(args.device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    B, P, R = args.batch, args.prompt_len, args.new_tokens
    prompt = torch.randint(0, 2000, (B, P), device=args.device)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    stages = {"decode": [], "log_prob": [], "update": []}

    def decode():
        with torch.no_grad():
            out = model(prompt, use_cache=True)
            cache, seq, steps = out.past_key_values, [prompt], []
            for _ in range(R):
                with Clock(args.device) as c:
                    tok = torch.multinomial(torch.softmax(out.logits[:, -1].float(), -1), 1)
                    out = model(tok, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                seq.append(tok)
                steps.append(c)
        return torch.cat(seq, 1), steps

    def log_prob(ids):
        with torch.no_grad():
            model(ids)

    def update(ids):
        logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-logp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    ids, _ = decode()  # warm-up of every stage
    log_prob(ids)
    update(ids)
    for _ in range(args.reps):
        ids, steps = decode()
        stages["decode"].append((statistics.median(c.wall for c in steps), statistics.median(c.cpu for c in steps)))
        with Clock(args.device) as c:
            log_prob(ids)
        stages["log_prob"].append((c.wall, c.cpu))
        with Clock(args.device) as c:
            update(ids)
        stages["update"].append((c.wall, c.cpu))
    seqlens = [P + R] * B
    # decode bytes per token step: every weight once + the KV cache at its mean length (P + R/2 tokens)
    kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4 * (P + R / 2) * B
    work = {"decode": params * 4 + kv_bytes, "log_prob": forward_flops(cfg, seqlens),
            "update": training_flops(cfg, seqlens, 1)}
    limit = {"decode": bandwidth, "log_prob": peak32, "update": peak32}
    out = {"params": params, "stages": {}}
    for name, xs in stages.items():
        wall, cpu = statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)
        out["stages"][name] = {"wall_s": wall, "cpu_s": cpu, "spread_s": [min(x[0] for x in xs), max(x[0] for x in xs)],
                               "fraction_wall": work[name] / wall / limit[name],
                               "fraction_cpu": work[name] / cpu / limit[name], "unit": "bytes" if name == "decode"
                               else "FLOP", "work": work[name]}
    worst = min(out["stages"], key=lambda k: out["stages"][k]["fraction_cpu"])
    out["furthest"] = worst
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=acts) as prof:
            {"decode": lambda: decode(), "log_prob": lambda: log_prob(ids), "update": lambda: update(ids)}[worst]()
        out["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=5, max_name_column_width=40)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1m,20m,100m")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--gemm-budget-s", type=float, default=0.5)
    ap.add_argument("--stream-mb", type=int, default=128)
    ap.add_argument("--stream-reps", type=int, default=5)
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    if set(sizes) - set(SIZES):
        raise SystemExit(f"--sizes: unknown {sorted(set(sizes) - set(SIZES))}; use some of {sorted(SIZES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    load0 = os.getloadavg()[0]
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} threads"
    peak32 = gemm_peak(torch.float32, args.device, args.gemm_budget_s)
    peak16 = gemm_peak(torch.bfloat16, args.device, args.gemm_budget_s)
    bw = stream(args.device, args.stream_mb, args.stream_reps)
    print(f"limits on {args.device} ({where}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '-')}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}): GEMM fp32 {peak32 / 1e9:.1f} GFLOP/s, bf16 "
          + (f"{peak16 / 1e9:.1f} GFLOP/s" if peak16 else "n/a")
          + f"; STREAM copy {bw['copy'] / 1e9:.1f} GB/s, triad {bw['triad'] / 1e9:.1f} GB/s; load {load0:.1f}")
    results = {"device": args.device, "where": where, "peak_fp32": peak32, "peak_bf16": peak16, "stream": bw,
               "load_start": load0, "sizes": {}}
    for size in sizes:
        load = os.getloadavg()[0]
        r = measure_size(size, args, peak32, bw["triad"])
        r["load"] = (load, os.getloadavg()[0])
        results["sizes"][size] = r
        print(f"{size} ({r['params'] / 1e6:.1f} M params, {args.batch} x ({args.prompt_len} + {args.new_tokens}) tokens, "
              f"{args.reps} reps, load {load:.1f} -> {os.getloadavg()[0]:.1f}):")
        for name, s in r["stages"].items():
            lim = "triad bandwidth" if name == "decode" else "fp32 GEMM peak"
            print(f"  {name:8s}: {s['wall_s'] * 1e3:9.2f} ms wall ({s['spread_s'][0] * 1e3:.2f}-"
                  f"{s['spread_s'][1] * 1e3:.2f}), {s['cpu_s'] * 1e3:9.2f} ms CPU/threads; "
                  f"{s['work'] / 1e6:10.1f} M{s['unit']} -> {s['fraction_wall']:.3f} of the {lim} by wall clock, "
                  f"{s['fraction_cpu']:.3f} by CPU time" + ("  (per token step)" if name == "decode" else ""))
        if "profile" in r:
            print(f"  top-5 ops of {r['furthest']} (furthest from its limit):\n{r['profile']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
