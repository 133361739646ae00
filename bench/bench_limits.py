"""How far each stage of a PPO step is from the machine's limit (issue 38, "the limit, measured").

    OMP_WAIT_POLICY=PASSIVE python bench/bench_limits.py [--sizes 1m,20m,100m] [--device cpu|cuda] [--reps 2]
        [--batch 16] [--prompt-len 64] [--new-tokens 32] [--decode-variants hf,ref,bf16] [--stages decode,...]
        [--no-profile] [--estimate-only] [--json FILE]

The limits, at the thread count used (``torch.get_num_threads()``; on CUDA the device):

* GEMM peak in float32 and bf16: the fastest square ``torch.mm`` (n up to 2048 on CPU, 8192 on CUDA), 2·n³ FLOP.
  On CPU it is taken as ``rlhf_core.trainer.mfu`` takes it (the larger of the multi-threaded wall-clock rate and
  threads × the one-thread CPU-time rate), so a loaded machine does not lower the peak the fractions divide by.
* Memory bandwidth: STREAM-like ``copy`` (b = a, 2 × 4 bytes per element) and ``triad`` (a = b + s·c, 3 × 4 bytes)
  on float32 vectors of ``--stream-mb`` MiB each, best of ``--stream-reps``. On CPU the default size follows
  STREAM's rule, each vector at least 4 × the last-level cache (:func:`last_level_cache_bytes`; 128 MiB at least),
  so that the copy measures the memory and not the cache: a 2-vCPU VM may report a 480 MiB L3, which 128 MiB
  vectors fit in. A model whose weights fit that cache can decode faster than this roofline (fraction > 1).

The stages, on a random Qwen2 of each ``--sizes`` (the sizes of ``bench_ppo_step.py --size``), float32,
``--batch`` sequences of a ``--prompt-len``-token prompt and ``--new-tokens`` sampled tokens, median of ``--reps``:

* ``decode``: one token step of **our rollout's decode** (``workers/rollout/hf_decode.decode``, what ``rlhf ppo`` runs
  with ``rollout.name=hf``: the grouped cache layout, ``decode_step`` on weights reordered for oneDNN, inverse-
  transform sampling), timed between its per-step ``should_stop`` calls: each interval is one forward of the
  ``--batch`` new tokens, the sampling and the loop's bookkeeping; median over the steps, then over ``--reps``.
  Bytes moved per step (the same model for every decode line): every parameter once for the whole batch
  (``params × bytes per element``: the tied embedding is read whole by the LM head) + the KV cache read by the
  attention (``2 · layers · kv_heads · head_dim · bytes`` per cached token per row, at the mean cache length
  ``prompt + new/2``; the prompts are distinct, so each row reads its own). Not counted: the new token's K/V write,
  activations (``batch × hidden`` per op, cache-resident), logits and sampling (``batch × vocab``), and any
  copy a cache makes (transformers' dynamic cache re-concatenates itself every step: overhead, not needed
  traffic). Fraction = bytes/s over the triad bandwidth (the roofline of a memory-bound decode).
  ``--decode-variants`` adds lines on the same prompts: ``hf`` (``decode_hf``: transformers' forward with its
  dynamic cache and ``torch.multinomial``, the per-token work of ``generate``, which this stage timed before),
  ``ref`` (``decode_ref``: our loop's reference path, ``fast=False``: per-row preallocated cache, the model's own
  forward) and ``bf16`` (``decode_bf16``: our decode on a bf16 copy of the model, as the rollout runs under
  ``actor.fsdp_config.mixed_precision.param_dtype=bf16``; bytes at 2 per element).
* ``log_prob``: a forward over the full sequences without grad; FLOPs = ``mfu.forward_flops`` (verl's count).
* ``update``: forward + backward + AdamW over the full sequences; FLOPs = ``mfu.training_flops``; fraction over the
  float32 GEMM peak is the update's MFU (``perf/mfu/actor``).

Each fraction is given by the wall clock and by the process's CPU time ÷ threads (what the stage would take with
its cores to itself: on a loaded machine the wall clock counts time the process waited for a core). For every stage
one more run under ``torch.profiler`` gives the op that dominates it: its top-5 ops by self time (CPU; on CUDA the
device's) with their shares of the stage's total (``--no-profile`` leaves it out).

Bounded memory and time: before a size is built, its peak memory is estimated (:func:`memory_estimate`: weights,
gradients and AdamW's two moments, plus every tensor the update's forward saves for its backward, counted on the
``meta`` device without computing anything) and the run stops with an error naming the options to lower when the
estimate exceeds the memory available (``MemAvailable`` of ``/proc/meminfo``); the printed time at the limits
(the stages' work over the peaks, times the passes run) is a lower bound of the size's duration. The peak resident
memory of the process during each size (``VmHWM``, reset before the size) is printed next to the estimate.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_core import kernels  # noqa: E402
from rlhf_core.trainer.mfu import forward_flops, gemm_flops_per_s, training_flops  # noqa: E402
from rlhf_core.workers.rollout import hf_decode  # noqa: E402

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


def last_level_cache_bytes() -> int | None:
    """Size of CPU 0's highest-level cache in bytes (``/sys/devices/system/cpu/cpu0/cache/index*/size``, e.g.
    ``491520K``); None where it cannot be read."""
    best = None
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, size = int((d / "level").read_text()), (d / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(size[-1:], 1)
        if size.rstrip("KMG").isdigit() and (best is None or level >= best[0]):
            best = (level, int(size.rstrip("KMG")) * scale)
    return best[1] if best else None


def default_stream_mb(device: str) -> int:
    """``--stream-mb`` when not given: 128 on CUDA; on CPU 4 × the last-level cache in MiB (at least 128), capped so
    that the three vectors take at most a quarter of the memory available."""
    if device == "cuda":
        return 128
    llc, avail = last_level_cache_bytes(), available_bytes()
    mb = max(128, 4 * (llc or 0) // 2 ** 20)
    return int(min(mb, avail / 12 / 2 ** 20)) if avail else mb


def memory_estimate(cfg, batch: int, seqlen: int) -> dict[str, float]:
    """Bytes a float32 update of the Qwen2 ``cfg`` on ``batch`` × ``seqlen`` tokens holds at its peak, estimated
    without computing: ``state`` = parameters × 16 (weights, gradients, AdamW's ``exp_avg`` and ``exp_avg_sq``);
    ``saved`` = the bytes of every tensor the forward (and the loss's log-softmax) saves for the backward, counted
    by ``torch.autograd.graph.saved_tensors_hooks`` on a model built on the ``meta`` device (an upper bound: a
    tensor that two ops save is counted twice); ``total`` = their sum. The decode's KV cache (``2 · layers ·
    kv_heads · head_dim · 4`` bytes per token) is far smaller at these sizes and not counted."""
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
        ids = torch.zeros(batch, seqlen, dtype=torch.long)
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])
    state = 16.0 * sum(p.numel() for p in model.parameters())
    return {"state": state, "saved": float(saved[0]), "total": state + saved[0]}


def available_bytes() -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None where there is no such file (not Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            return next(float(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def resident_bytes(field: str = "VmRSS") -> float:
    """This process's resident memory now (``VmRSS``) or at its peak (``VmHWM``) from ``/proc/self/status``; the
    peak since the process started (``ru_maxrss``) where there is no such file."""
    try:
        with open("/proc/self/status") as fh:
            return next(float(line.split()[1]) * 1024 for line in fh if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def reset_peak_resident() -> None:
    """Reset this process's ``VmHWM`` to its current resident memory (``5`` to ``/proc/self/clear_refs``, Linux
    4.0+), so that the next peak is a stage's own and not the STREAM vectors'; nothing where that is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def top_ops(prof, device: str, n: int = 5) -> list[tuple[str, float]]:
    """The ``n`` ops of a ``torch.profiler`` run with the most self time (CPU; on CUDA the device's) and each one's
    share of the run's total self time, largest first."""
    attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    rows = [(e.key, getattr(e, attr)) for e in prof.key_averages()]
    total = sum(t for _, t in rows) or 1.0
    return [(k, t / total) for k, t in sorted(rows, key=lambda r: -r[1])[:n]]


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
    kernels.install()  # the grouped decode attention our rollout registers (HFRollout does this at start-up)
    cfg = Qwen2Config(vocab_size=2000, max_position_embeddings=1024, tie_word_embeddings=True, **SIZES[size])
    model = Qwen2ForCausalLM(cfg).to(args.device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    B, P, R = args.batch, args.prompt_len, args.new_tokens
    prompt = torch.randint(0, 2000, (B, P), device=args.device)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    run = set(args.stages)

    def decode_ours(m=model, fast=True, prof=None):
        stamps = []

        def stamp():  # asked after every sampled token, before the next step's forward
            sync(args.device)
            stamps.append((time.perf_counter(), time.process_time()))
            if prof is not None and len(stamps) == 1:
                prof.start()  # the profile covers the token steps, not the prefill and the weights' reorder
            return False

        tokens, _ = hf_decode.decode(m, prompt, torch.ones_like(prompt), R, [], 0, True, should_stop=stamp,
                                     fast=fast)
        if prof is not None:
            prof.stop()
        threads = torch.get_num_threads() if args.device == "cpu" else None
        steps = [(b[0] - a[0], (b[1] - a[1]) / threads if threads else b[0] - a[0])
                 for a, b in zip(stamps, stamps[1:])]
        return torch.cat([prompt, tokens], 1), steps

    def decode_hf(prof=None):
        with torch.no_grad():
            out = model(prompt, use_cache=True)
            cache, seq, steps = out.cache, [prompt], []
            if prof is not None:
                prof.start()
            for _ in range(R):
                with Clock(args.device) as c:
                    tok = torch.multinomial(torch.softmax(out.logits[:, -1].float(), -1), 1)
                    out = model(tok, cache=cache, use_cache=True)
                cache = out.cache
                seq.append(tok)
                steps.append((c.wall, c.cpu))
            if prof is not None:
                prof.stop()
        return torch.cat(seq, 1), steps

    decoders = {"decode": decode_ours, "decode_hf": decode_hf,
                "decode_ref": lambda prof=None: decode_ours(fast=False, prof=prof)}
    if "bf16" in args.decode_variants:
        model16 = copy.deepcopy(model).to(torch.bfloat16).eval()
        decoders["decode_bf16"] = lambda prof=None: decode_ours(model16, prof=prof)
    decoders = {k: v for k, v in decoders.items() if k == "decode" or k[7:] in args.decode_variants}

    def log_prob(ids):
        with torch.no_grad():
            model(ids)

    def update(ids):
        logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-logp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    stages = {k: [] for k in decoders if "decode" in run}
    stages.update({k: [] for k in ("log_prob", "update") if k in run})
    for fn in (decoders.values() if "decode" in run else [decode_ours]):  # warm-up of every stage
        ids, _ = fn()
    if "log_prob" in run:
        log_prob(ids)
    if "update" in run:
        update(ids)
    for _ in range(args.reps):
        for name in stages:
            if name.startswith("decode"):
                ids, steps = decoders[name]()
                stages[name].append((statistics.median(w for w, _ in steps), statistics.median(c for _, c in steps)))
                continue
            with Clock(args.device) as c:
                (log_prob if name == "log_prob" else update)(ids)
            stages[name].append((c.wall, c.cpu))
    seqlens = [P + R] * B
    # decode bytes per token step: every weight once + the KV cache at its mean length (P + R/2 tokens), per row
    kv_elems = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * (P + R / 2) * B
    work = {"log_prob": forward_flops(cfg, seqlens), "update": training_flops(cfg, seqlens, 1)}
    for name in decoders:
        work[name] = (params + kv_elems) * (2 if name == "decode_bf16" else 4)
    out = {"params": params, "stages": {}}
    for name, xs in stages.items():
        limit = bandwidth if name.startswith("decode") else peak32
        wall, cpu = statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)
        out["stages"][name] = {"wall_s": wall, "cpu_s": cpu, "spread_s": [min(x[0] for x in xs), max(x[0] for x in xs)],
                               "fraction_wall": work[name] / wall / limit,
                               "fraction_cpu": work[name] / cpu / limit,
                               "unit": "bytes" if name.startswith("decode") else "FLOP", "work": work[name]}
    main = [k for k in ("decode", "log_prob", "update") if k in out["stages"]]
    out["furthest"] = min(main, key=lambda k: out["stages"][k]["fraction_cpu"])
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        for name in stages:
            prof = profile(activities=acts)
            if name.startswith("decode"):  # the decode's token steps only (the decoder starts and stops it)
                decoders[name](prof=prof)
            else:
                with prof:
                    log_prob(ids) if name == "log_prob" else update(ids)
            out["stages"][name]["top_ops"] = top_ops(prof, args.device)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1m,20m,100m")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--decode-variants", default="hf",
                    help="more decode lines, comma-separated: hf (transformers' dynamic cache), ref (our reference "
                         "path), bf16 (our decode in bf16); empty: ours only")
    ap.add_argument("--stages", default="decode,log_prob,update", help="the stages to run (comma-separated)")
    ap.add_argument("--gemm-budget-s", type=float, default=0.5)
    ap.add_argument("--stream-mb", type=int, default=None,
                    help="MiB per STREAM vector (default: 4 x the last-level cache on CPU, 128 on CUDA)")
    ap.add_argument("--stream-reps", type=int, default=5)
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--estimate-only", action="store_true",
                    help="measure the limits and print each size's memory and time estimates, run no stage")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    args.decode_variants = [v for v in args.decode_variants.split(",") if v]
    args.stages = [v for v in args.stages.split(",") if v]
    for opt, got, known in (("--decode-variants", args.decode_variants, {"hf", "ref", "bf16"}),
                            ("--stages", args.stages, {"decode", "log_prob", "update"})):
        if set(got) - known:
            raise SystemExit(f"{opt}: unknown {sorted(set(got) - known)}; use some of {sorted(known)}")
    if set(sizes) - set(SIZES):
        raise SystemExit(f"--sizes: unknown {sorted(set(sizes) - set(SIZES))}; use some of {sorted(SIZES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    load0 = os.getloadavg()[0]
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} threads"
    peak32 = gemm_peak(torch.float32, args.device, args.gemm_budget_s)
    peak16 = gemm_peak(torch.bfloat16, args.device, args.gemm_budget_s)
    if args.stream_mb is None:
        args.stream_mb = default_stream_mb(args.device)
    bw = stream(args.device, args.stream_mb, args.stream_reps)
    print(f"limits on {args.device} ({where}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '-')}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}): GEMM fp32 {peak32 / 1e9:.1f} GFLOP/s, bf16 "
          + (f"{peak16 / 1e9:.1f} GFLOP/s" if peak16 else "n/a")
          + f"; STREAM ({args.stream_mb} MiB vectors; last-level cache {(last_level_cache_bytes() or 0) / 2**20:.0f}"
          f" MiB) copy {bw['copy'] / 1e9:.1f} GB/s, triad {bw['triad'] / 1e9:.1f} GB/s; load {load0:.1f}")
    results = {"device": args.device, "where": where, "peak_fp32": peak32, "peak_bf16": peak16, "stream": bw,
               "stream_mb": args.stream_mb, "load_start": load0, "sizes": {}}
    from transformers import Qwen2Config

    passes = 1 + args.reps + args.profile  # the warm-up, the measured reps, the profiled run
    for size in sizes:
        cfg = Qwen2Config(vocab_size=2000, max_position_embeddings=1024, tie_word_embeddings=True, **SIZES[size])
        mem, avail = memory_estimate(cfg, args.batch, args.prompt_len + args.new_tokens), available_bytes()
        if args.device == "cpu" and avail is not None and mem["total"] > avail:
            raise SystemExit(f"--sizes {size}: the update needs about {mem['total'] / 2**30:.1f} GiB (state "
                             f"{mem['state'] / 2**30:.1f} + activations {mem['saved'] / 2**30:.1f}), "
                             f"{avail / 2**30:.1f} GiB available; lower --batch, --prompt-len or --new-tokens")
        params, seqlens = mem["state"] / 16, [args.prompt_len + args.new_tokens] * args.batch
        at_limit = passes * (args.new_tokens * max(4 * params / bw["triad"], 2 * params * args.batch / peak32)
                             + (forward_flops(cfg, seqlens) + training_flops(cfg, seqlens, 1)) / peak32)
        reset_peak_resident()
        mem["rss_before"] = resident_bytes()
        print(f"{size}: estimated peak memory {mem['total'] / 2**30:.2f} GiB (state {mem['state'] / 2**30:.2f} + "
              f"saved activations {mem['saved'] / 2**30:.2f}) over the process's {mem['rss_before'] / 2**30:.2f} GiB; "
              f"{avail / 2**30 if avail else float('nan'):.1f} GiB available; {passes} passes of every stage take "
              f">= {at_limit:.0f} s at the limits", flush=True)
        if args.estimate_only:
            continue
        load = os.getloadavg()[0]
        r = measure_size(size, args, peak32, bw["triad"])
        r["load"] = (load, os.getloadavg()[0])
        r["memory"] = {**mem, "max_rss": resident_bytes("VmHWM")}
        results["sizes"][size] = r
        print(f"{size} ({r['params'] / 1e6:.1f} M params, {args.batch} x ({args.prompt_len} + {args.new_tokens}) tokens, "
              f"{args.reps} reps, load {load:.1f} -> {os.getloadavg()[0]:.1f}):")
        for name, s in r["stages"].items():
            lim = "triad bandwidth" if name.startswith("decode") else "fp32 GEMM peak"
            print(f"  {name:8s}: {s['wall_s'] * 1e3:9.2f} ms wall ({s['spread_s'][0] * 1e3:.2f}-"
                  f"{s['spread_s'][1] * 1e3:.2f}), {s['cpu_s'] * 1e3:9.2f} ms CPU/threads; "
                  f"{s['work'] / 1e6:10.1f} M{s['unit']} -> {s['fraction_wall']:.3f} of the {lim} by wall clock, "
                  f"{s['fraction_cpu']:.3f} by CPU time" + ("  (per token step)" if name.startswith("decode") else ""))
            if "top_ops" in s:
                print(f"            top ops (share of self {'device' if args.device == 'cuda' else 'CPU'} time): "
                      + ", ".join(f"{k} {v:.0%}" for k, v in s["top_ops"]))
        print(f"  furthest from its limit: {r['furthest']}; peak resident memory of the process "
              f"{r['memory']['max_rss'] / 2**30:.2f} GiB (estimated "
              f"{(r['memory']['rss_before'] + r['memory']['total']) / 2**30:.2f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
