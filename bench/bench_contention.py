"""A tiny-model PPO-like step alone and under a competing CPU load, per OpenMP thread setting (issue 38, contention).

    python bench/bench_contention.py [--settings default,ours,1thread] [--rounds 3] [--steps 4] [--burners 1]

Each setting runs the same step in a fresh interpreter whose OpenMP environment is set before torch loads:

* ``default``: torch's defaults, as a peer that sets nothing runs (TRL's ``GRPOTrainer`` process sets no OpenMP
  variable on one CPU process): ``OMP_NUM_THREADS`` unset → one thread per core, libgomp's default wait policy
  (an idle thread spins for a while before it sleeps).
* ``ours``: the same thread count, ``OMP_WAIT_POLICY=PASSIVE`` (an idle thread sleeps at once, leaving its core to
  whoever else runs): what our ranks got before 20fe255, and what a rank of several CPU threads falls back to while
  other processes want its cores (``rlhf_core.distributed.threads.SpinSwitch``, which this script does not run).
* ``1thread``: one intra-op thread (``OMP_NUM_THREADS=1``), for reference.

The step: a random Qwen2 of the ``--size`` of ``bench_ppo_step.py`` (1 M: hidden 128, 4 layers, vocab 2000);
sampling ``--new-tokens`` tokens for ``--batch`` sequences of a ``--prompt-len``-token prompt with a KV cache, one
forward + backward over the full sequences and an AdamW step. Rounds alternate: in each round every setting runs
alone, then every setting runs while ``--burners`` processes spin (``while True: pass``), the settings' order
reversed every other round. Printed per setting: median step seconds alone and loaded (quartiles), the slowdown
loaded/alone per round (median and range), and the 1-minute load average when each measurement started.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ("default", "ours", "1thread")


def setting_env(name: str, cpus: int) -> dict[str, str]:
    """The OpenMP environment of a setting (see the module docstring); the rest of the environment unchanged."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if name == "ours":
        sys.path.insert(0, str(REPO))
        from rlhf_core.distributed.threads import omp_env

        env.update(omp_env(cpus))
    elif name == "1thread":
        env["OMP_NUM_THREADS"] = "1"
    return env


def worker(args) -> None:
    """Run ``--steps`` + 1 steps (the first a warm-up) and print one JSON line of the measured step seconds."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sizes = {"1m": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2),
             "20m": dict(hidden_size=384, intermediate_size=1152, num_hidden_layers=11, num_attention_heads=6,
                         num_key_value_heads=2)}[args.size]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=2000, max_position_embeddings=1024, tie_word_embeddings=True,
                                         **sizes))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    prompt = torch.randint(0, 2000, (args.batch, args.prompt_len))
    times = []
    for _ in range(args.steps + 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model(prompt, use_cache=True)
            cache, tok, seq = out.past_key_values, None, [prompt]
            for _ in range(args.new_tokens):
                probs = torch.softmax(out.logits[:, -1].float(), -1)
                tok = torch.multinomial(probs, 1)
                seq.append(tok)
                out = model(tok, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
        ids = torch.cat(seq, 1)
        logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-logp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"threads": torch.get_num_threads(), "wait_policy": os.environ.get("OMP_WAIT_POLICY", "-"),
                      "step_s": times[1:]}))


def run_setting(name: str, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--steps", str(args.steps), "--size", args.size, "--batch",
           str(args.batch), "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens)]
    load = os.getloadavg()[0]
    proc = subprocess.run(cmd, env=setting_env(name, args.cpus), capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "load": load}


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--burners", type=int, default=1)
    ap.add_argument("--size", default="1m", choices=("1m", "20m"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--cpus", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    settings = [s for s in args.settings.split(",") if s]
    if set(settings) - set(SETTINGS):
        raise SystemExit(f"--settings: unknown {sorted(set(settings) - set(SETTINGS))}; use some of {SETTINGS}")
    res = {s: {"alone": [], "loaded": [], "ratio": [], "loads": []} for s in settings}
    for r in range(args.rounds):
        order = settings if r % 2 == 0 else settings[::-1]
        alone = {s: run_setting(s, args) for s in order}
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
        try:
            time.sleep(1.0)
            loaded = {s: run_setting(s, args) for s in order}
        finally:
            for b in burners:
                b.kill()
                b.wait()
        for s in settings:
            a, b = statistics.median(alone[s]["step_s"]), statistics.median(loaded[s]["step_s"])
            res[s]["alone"] += alone[s]["step_s"]
            res[s]["loaded"] += loaded[s]["step_s"]
            res[s]["ratio"].append(b / a)
            res[s]["loads"].append((alone[s]["load"], loaded[s]["load"]))
            print(f"round {r + 1} {s:8s} ({alone[s]['threads']} threads, OMP_WAIT_POLICY={alone[s]['wait_policy']}): "
                  f"alone {a:.3f} s (load {alone[s]['load']:.1f}), with {args.burners} burner(s) {b:.3f} s "
                  f"(load {loaded[s]['load']:.1f}): x{b / a:.2f}", flush=True)
    print(f"step: {args.size} Qwen2, {args.batch} x ({args.prompt_len} prompt + {args.new_tokens} sampled) tokens, "
          f"fwd+bwd+AdamW; {args.rounds} rounds x {args.steps} steps; {args.cpus} CPUs; {args.burners} burner(s)")
    for s in settings:
        a, b = quartiles(res[s]["alone"]), quartiles(res[s]["loaded"])
        rr = res[s]["ratio"]
        print(f"  {s:8s}: alone median {a[1]:.3f} s (quartiles {a[0]:.3f}-{a[2]:.3f}); loaded {b[1]:.3f} s "
              f"({b[0]:.3f}-{b[2]:.3f}); slowdown per round median x{statistics.median(rr):.2f} "
              f"(range {min(rr):.2f}-{max(rr):.2f}); load averages (alone, loaded) "
              + ", ".join(f"({x:.1f}, {y:.1f})" for x, y in res[s]["loads"]))
    cores_lost = args.burners / args.cpus
    print(f"target: slowdown <= 1 / (1 - {cores_lost:.2f}) x 1.25 = x{1.25 / (1 - cores_lost):.2f} if the burners "
          f"take {args.burners} of {args.cpus} cores from an otherwise idle machine")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
