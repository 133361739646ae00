"""Our step and TRL's under the same competing load: steps/s alone and with a CPU burner (issue 38, contention).

    python bench/bench_contention_trl.py [--workdir W] [--rounds 3] [--steps 40] [--warmup 5] [--prompts 16] [--n 8]
                                         [--threads 2] [--burners 1] [--peer-timeout 900] [--set KEY=VALUE ...]
                                         [--json out.json]

The workload and the two peers are those of ``bench/bench_short_prompts.py`` (its runners are used here): Countdown
with the experiment's tiny Qwen2, ``--prompts`` prompts × ``--n`` samples and one optimizer step per step, ``ours``
through ``rlhf ppo`` (Ray worker group, driver) and ``trl`` TRL's ``GRPOTrainer``, each in its own process from the
checkpoint warmed up once per ``--workdir`` (``python bench/learning_vs_trl.py --workdir W --peers none`` prepares
it; this script does too when it is missing). A peer's rate is ``bench_short_prompts.rate``: steps/s after the first
``--warmup`` steps, by the peer's own clock.

Threads, as a user runs each peer on this machine: ``--threads`` (default: the CPUs this process may use) intra-op
threads each, ``OMP_NUM_THREADS`` set to it. No OpenMP wait policy is passed on (``bench_short_prompts.start``
drops ``OMP_WAIT_POLICY``/``GOMP_SPINCOUNT``): TRL runs with libgomp's default (threads spin before they sleep),
ours with what ``rlhf`` sets for its ranks (``rlhf_core.distributed.threads.omp_env``: a 30 000-iteration spin that
the rank's ``SpinSwitch`` throttles while other processes want the cores; ``PASSIVE`` before 20fe255).

One run at a time, so that a burner takes its core from the peer alone. A round runs each peer alone and then
with ``--burners`` processes spinning (``while True: pass``, started 1 s before the peer and killed after it);
the next round runs the same four runs in the reverse order (a load that drifts during a round touches both peers
and both conditions alike over two rounds). Printed: every run's rate with the ``uptime`` load before and after
it; per peer the slowdown ``alone steps/s ÷ loaded steps/s`` per round, its median and quartiles; and the targets
of issue 38: ours ≤ ``cpus ÷ (cpus − burners) × 1.25`` (2.5 for one burner on two cores) and ≤ TRL's.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_short_prompts as sp  # noqa: E402  (the workload's runners: start, finish, rate, quartiles, uptime)

PEERS = ("ours", "trl")
CONDITIONS = ("alone", "loaded")


def schedule(rounds: int) -> list[list[tuple[str, str]]]:
    """The runs of each round as ``(peer, condition)`` pairs: round 1 ours alone, ours loaded, TRL alone, TRL loaded;
    every other round the reverse of the one before."""
    first = [(p, c) for p in PEERS for c in CONDITIONS]
    return [first if k % 2 == 0 else first[::-1] for k in range(rounds)]


def slowdown_target(cpus: int, burners: int) -> float:
    """Issue 38's bound on the slowdown under ``burners`` spinning processes: the share of the ``cpus`` cores lost,
    as a factor, plus 25 %: ``cpus / (cpus - burners) * 1.25``; raises ValueError when no core is left."""
    if not 0 <= burners < cpus:
        raise ValueError(f"--burners {burners} must leave at least one of the {cpus} CPU(s)")
    return cpus / (cpus - burners) * 1.25


def run_once(peer: str, loaded: bool, args: argparse.Namespace) -> dict:
    """One run of ``peer`` (with ``args.burners`` burners when ``loaded``); its rate and the load before and after."""
    burners = []
    load0 = sp.uptime()
    try:
        if loaded:
            burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
            time.sleep(1.0)
        res = sp.finish(sp.start(peer, args), peer, timeout=args.peer_timeout)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    return {"rate": sp.rate(res["ends"], args.warmup), "load_before": load0, "load_after": sp.uptime()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=sp.DEFAULT_WORKDIR,
                   help="the warmed-up Countdown set-up (prepared when missing); default: %(default)s")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="steps per run")
    p.add_argument("--warmup", type=int, default=5, help="leading steps left out of the rate")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="intra-op threads of each peer (ours: ray_init.num_cpus); default: this process's CPUs")
    p.add_argument("--burners", type=int, default=1)
    p.add_argument("--peer-timeout", type=float, default=900.0, help="seconds one run may take before it is killed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for ours")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    cpus = len(os.sched_getaffinity(0))
    try:
        target = slowdown_target(cpus, args.burners)
    except ValueError as exc:
        p.error(str(exc))
    if args.steps <= args.warmup:
        p.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    import learning_vs_trl as lv

    args.workdir.mkdir(parents=True, exist_ok=True)
    lv.prepare(args.workdir)
    runs: list[dict] = []
    for k, order in enumerate(schedule(args.rounds)):
        for peer, cond in order:
            r = {"round": k + 1, "peer": peer, "condition": cond, **run_once(peer, cond == "loaded", args)}
            runs.append(r)
            print(f"round {k + 1} {peer:4s} {cond:6s}: {r['rate']:.3f} steps/s\n  before: {r['load_before']}\n"
                  f"  after:  {r['load_after']}", flush=True)
    rate = {(r["round"], r["peer"], r["condition"]): r["rate"] for r in runs}
    slow = {peer: [rate[k, peer, "alone"] / rate[k, peer, "loaded"] for k in range(1, args.rounds + 1)]
            for peer in PEERS}
    print(f"slowdown = alone ÷ with {args.burners} burner(s), steps/s ({args.rounds} rounds, {args.prompts} prompts × "
          f"{args.n}, {args.steps} steps, first {args.warmup} left out, {args.threads} thread(s) each, {cpus} CPUs):")
    summary = {}
    for peer in PEERS:
        med, lo, hi = sp.quartiles(slow[peer])
        alone = sp.quartiles([rate[k, peer, "alone"] for k in range(1, args.rounds + 1)])
        loaded = sp.quartiles([rate[k, peer, "loaded"] for k in range(1, args.rounds + 1)])
        summary[peer] = {"slowdown": slow[peer], "median": med, "quartiles": [lo, hi], "alone": alone,
                         "loaded": loaded}
        print(f"  {peer:4s}: x{med:.2f} (quartiles {lo:.2f}-{hi:.2f}; per round "
              + ", ".join(f"{s:.2f}" for s in slow[peer]) + f"); alone {alone[0]:.3f} steps/s ({alone[1]:.3f}-"
              f"{alone[2]:.3f}), loaded {loaded[0]:.3f} ({loaded[1]:.3f}-{loaded[2]:.3f})")
    ours, trl = summary["ours"]["median"], summary["trl"]["median"]
    print(f"targets: ours x{ours:.2f} <= x{target:.2f} ({cpus} / ({cpus} - {args.burners}) x 1.25): "
          f"{'met' if ours <= target else 'NOT met'}; ours x{ours:.2f} <= TRL's x{trl:.2f}: "
          f"{'met' if ours <= trl else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary, "target": target, "cpus": cpus,
                                         "threads": args.threads, "burners": args.burners}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
