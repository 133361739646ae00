"""Steps per second on short prompts and small steps: ``rlhf ppo`` against TRL's GRPOTrainer (issue 38).

    python bench/bench_short_prompts.py [--workdir W] [--rounds 5] [--steps 40] [--warmup 5] [--prompts 16] [--n 8]
                                        [--threads 1] [--alternate] [--set KEY=VALUE ...] [--json out.json]

The workload: Countdown (``experiments/countdown.yaml``: its tiny 0.83 M-parameter Qwen2, prompts of 28-33
tokens with the chat template, responses ≤ 12 tokens), warmed up once per ``--workdir`` as ``bench/learning_vs_trl.py`` does; then GRPO
with ``--prompts`` prompts × ``--n`` samples per step and **one** optimizer step per batch (our
``ppo_mini_batch_size`` = ``data.train_batch_size``; TRL's ``steps_per_generation=1``), so one step of either peer
is one generation of the batch, its rewards and one update.

* ``ours``: the real ``rlhf ppo`` path (Ray worker group, driver, file logger) with the experiment's
  ``ppo.overrides`` and the batch shape above (``learning_vs_trl.run_ours``); its step times are the differences of
  ``timing_s/training_elapsed`` (the driver's clock, logged at each step's end) in the run's ``metrics.jsonl``.
* ``trl``: ``GRPOTrainer`` mirroring the same settings (``learning_vs_trl.run_trl``); its step times are the
  differences of the clock read at each ``on_step_end``.

Each peer runs ``--steps`` steps in its own process; its rate is ``(steps - warmup) / (time from the end of step
``warmup`` to the end of the last step)``: everything between steps (data loading, logging, Ray round trips) is
inside. A round runs the two peers **side by side** (default: both at once, ``--threads`` intra-op threads each
and ``OMP_NUM_THREADS`` set to it, so the machine's other load hits both alike) or, with ``--alternate``, one after
the other (order reversed every other round). Prints each round's rates and ratio ``ours ÷ TRL`` (> 1: ours is
faster), the median ratio with quartiles, our per-stage medians (``timing_s/*``), and the ``uptime`` load before
and after each round.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "rlhf-bench-countdown"  # shared by the Countdown benchmarks
STAGES = ("step", "gen", "reward", "old_log_prob", "adv", "update_actor")


def overrides(prompts: int, n: int, extra: list[str]) -> list[str]:
    """Our overrides after the experiment's: ``prompts`` per step, ``n`` samples each, one mini-batch."""
    return [f"data.train_batch_size={prompts}", f"actor_rollout_ref.rollout.n={n}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}", *extra]


def rate(ends: list[float], warmup: int) -> float:
    """Steps per second from step-end clock readings ``ends`` (seconds, one per step, in order) after ``warmup``
    steps: ``(len(ends) - warmup) / (ends[-1] - ends[warmup - 1])``; raises ValueError when too few steps."""
    if warmup < 1 or len(ends) <= warmup:
        raise ValueError(f"{len(ends)} step(s) logged, need more than --warmup {warmup}")
    return (len(ends) - warmup) / (ends[-1] - ends[warmup - 1])


def run_peer(peer: str, work: Path, steps: int, threads: int, extra: list[str], seed: int) -> dict:
    """One peer's run in this process (the child of a round); returns its step-end clock and, for ours, the
    per-step ``timing_s/*`` metrics."""
    sys.path.insert(0, str(HERE))
    import learning_vs_trl as lv

    warm = work / "sft" / "hf_model"
    lr = 3e-4
    if peer == "ours":
        shutil.rmtree(work / f"ours_lr{lr}_s{seed}", ignore_errors=True)
        lv.run_ours(work, warm, 1e9, lr, seed, extra, threads, steps)
        from rlhf_core.trainer.tracking import read_metrics_jsonl

        rows = read_metrics_jsonl(str(work / f"ours_lr{lr}_s{seed}" / "metrics.jsonl"))
        ordered = [rows[s] for s in sorted(rows) if "timing_s/training_elapsed" in rows[s]]
        return {"ends": [r["timing_s/training_elapsed"] for r in ordered],
                "stages": {k: [r.get(f"timing_s/{k}", 0.0) for r in ordered] for k in STAGES}}
    times: list[float] = []
    lv.run_trl(work, warm, 1e9, lr, seed, extra, threads, steps, step_times=times)
    return {"ends": [t - times[0] for t in times[1:]]}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def start(peer: str, args: argparse.Namespace) -> subprocess.Popen:
    """Start one peer's run (``args``: this script's options) in its own process group, as a user would run it:
    ``OMP_NUM_THREADS=args.threads`` and no OpenMP wait policy (``OMP_WAIT_POLICY``/``GOMP_SPINCOUNT`` of this
    process are not passed on: TRL gets libgomp's default, ours what ``rlhf`` sets for its ranks)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update({"OMP_NUM_THREADS": str(args.threads),
                "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    cmd = [sys.executable, __file__, "--workdir", str(args.workdir), "--peer", peer, "--steps", str(args.steps),
           "--threads", str(args.threads), "--prompts", str(args.prompts), "--n", str(args.n),
           *[f"--set={s}" for s in args.set]]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, peer: str, timeout: float | None = None) -> dict:
    """The JSON result a peer's run (from :func:`start`) prints last; raises RuntimeError when it fails or, after
    killing its process group (the peer, ``rlhf``, its Ray processes), when it runs past ``timeout`` seconds."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"peer {peer} ran past {timeout} s; killed") from None
    if proc.returncode != 0:
        raise RuntimeError(f"peer {peer} failed (rc {proc.returncode}): {out[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(median, lower quartile, upper quartile); the quartiles are the extremes when fewer than 4 values."""
    if len(xs) < 4:
        return statistics.median(xs), min(xs), max(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[1], q[0], q[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                   help="the warmed-up Countdown set-up (prepared when missing); default: %(default)s")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=40, help="steps per peer per round")
    p.add_argument("--warmup", type=int, default=5, help="leading steps left out of the rate")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per peer (ours: ray_init.num_cpus)")
    p.add_argument("--alternate", action="store_true", help="peers one after the other instead of side by side")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for ours")
    p.add_argument("--peer", choices=("ours", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    extra = overrides(args.prompts, args.n, args.set)
    if args.peer:
        print(json.dumps(run_peer(args.peer, args.workdir, args.steps, args.threads, extra, 0)))
        return 0
    sys.path.insert(0, str(HERE))
    import learning_vs_trl as lv

    args.workdir.mkdir(parents=True, exist_ok=True)
    lv.prepare(args.workdir)
    rounds = []
    for k in range(args.rounds):
        order = ("ours", "trl") if k % 2 == 0 else ("trl", "ours")
        load0 = uptime()
        if args.alternate:
            res = {peer: finish(start(peer, args), peer) for peer in order}
        else:
            procs = {peer: start(peer, args) for peer in order}
            res = {peer: finish(proc, peer) for peer, proc in procs.items()}
        r = {peer: rate(res[peer]["ends"], args.warmup) for peer in order}
        stages = {s: statistics.median(v[args.warmup:]) for s, v in res["ours"]["stages"].items()}
        rounds.append({"ours": r["ours"], "trl": r["trl"], "ratio": r["ours"] / r["trl"], "stages": stages,
                       "load_before": load0, "load_after": uptime()})
        print(f"round {k + 1}: ours {r['ours']:.2f} steps/s, TRL {r['trl']:.2f} steps/s, ratio "
              f"{r['ours'] / r['trl']:.2f}; ours median s: " + ", ".join(f"{s} {v:.4f}" for s, v in stages.items())
              + f"\n  before: {load0}\n  after:  {rounds[-1]['load_after']}", flush=True)
    med, lo, hi = quartiles([r["ratio"] for r in rounds])
    mode = "one after the other" if args.alternate else f"side by side, {args.threads} thread(s) each"
    print(f"ours ÷ TRL steps/s over {len(rounds)} rounds ({mode}, {args.prompts} prompts × {args.n}, "
          f"{args.steps} steps, first {args.warmup} left out): median {med:.2f} (quartiles {lo:.2f}-{hi:.2f})")
    for peer in ("ours", "trl"):
        m, a, b = quartiles([r[peer] for r in rounds])
        print(f"  {peer}: median {m:.2f} steps/s ({a:.2f}-{b:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "median": med, "quartiles": [lo, hi]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
