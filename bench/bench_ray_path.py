"""The Ray path's cost, step by step: our in-process step and the same step through Ray, alternated in one run.

    python bench/bench_ray_path.py [--size 1m] [--steps 5] [--warmup 1] [--no-pause] [workload options]

``bench_ppo_step.py --peers ours,ours_ray`` runs the two peers one after the other, each in its own process. On a
host whose speed drifts by tens of percent within a minute (BENCHMARKS.md, "Machines"), one such
comparison cannot tell 1.05× from 1.15×. Here one process builds both trainers (``bench_ppo_step.build_ours``) on
the same model, prompts and seeds, and alternates their steps: in-process, Ray, Ray, in-process, … Each pair of
steps runs seconds apart on the same prompts, and the drift cancels within a pair.

While an in-process step runs, every process of the embedded Ray instance (GCS, raylet, agents, the idle worker)
is stopped with ``SIGSTOP`` and resumed with ``SIGCONT`` before the next Ray step. The in-process steps then run as
on a machine without Ray, and the Ray steps pay all that Ray costs: the calls, the worker's process, and Ray's
background wake-ups. ``--no-pause`` leaves Ray running throughout: the ratio then leaves the background out. The
pauses last one in-process step: tried with the 1 M and 20 M models (steps up to 3.5 s); with longer pauses Ray's
health checks (10 s timeout) might count failures. This process
runs each path's steps with that path's driver threads: the in-process path's (its rank computes here), and the one
thread a driver of Ray ranks keeps (``rlhf_core.distributed.threads.use_driver_threads``).

Prints each path's median step and stage times, the ratio of each pair (Ray ÷ in-process) and their median; the
target of issue 14 is ≤ 1.10. The workload options are ``bench_ppo_step.py``'s (``--size``, ``--prompts``, ``--n``,
``--new-tokens``, ``--bf16``, ``--remove-padding``, ``--dynamic-bsz``, ``--lr``, ``--device``; ``--peers`` and
``--rounds`` are ignored here).
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_ppo_step as bps  # bench/ is on sys.path: run as a script


def ray_processes() -> list:
    """The embedded Ray instance's processes: this process's children started from Ray's package (GCS, raylet,
    dashboard, log monitor, autoscaler monitor) and all their descendants (the agents and the workers). Other
    children (a reward process pool) are left out. Returns ``psutil.Process`` objects."""
    import psutil

    found = []
    for child in psutil.Process(os.getpid()).children():
        try:
            if any("/ray/" in part for part in child.cmdline()):  # an executable or script of Ray's package
                found += [child] + child.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
    return found


def signal_all(processes: list, sig: int) -> None:
    """``sig`` to each process; one that has exited is skipped."""
    import psutil

    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            continue


def timed_step(trainer, batches, device: str) -> tuple[float, dict]:
    """One ``train_step`` on the trainer's next batch; returns (wall seconds, its metrics)."""
    batch = next(batches)
    t0 = time.perf_counter()
    trainer.global_steps += 1
    metrics = trainer.train_step(batch, 0)
    bps.sync_device(device)
    return time.perf_counter() - t0, metrics


def run(args) -> dict:
    """Alternate the two trainers' steps (ABBA order); returns per-path step times, stage means and pair ratios."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        spec = bps.prepare(args, Path(tmp))
        local = bps.build_ours(spec, args, Path(tmp) / "local")
        threads = {"ours": torch.get_num_threads()}
        ray_trainer = bps.build_ours(spec, args, Path(tmp) / "ray", use_ray=True)
        threads["ours_ray"] = torch.get_num_threads()  # a driver of Ray ranks keeps one (threads.use_driver_threads)
        paused = [] if args.no_pause else ray_processes()
        if not args.no_pause and not paused:
            raise SystemExit("found no Ray process to pause; run with --no-pause")
        iters = {"ours": iter(local.train_dataloader), "ours_ray": iter(ray_trainer.train_dataloader)}
        trainers = {"ours": local, "ours_ray": ray_trainer}
        times = {"ours": [], "ours_ray": []}
        stages = {"ours": {}, "ours_ray": {}}
        try:
            for i in range(args.warmup + args.steps):
                for path in (("ours", "ours_ray") if i % 2 == 0 else ("ours_ray", "ours")):
                    signal_all(paused, signal.SIGSTOP if path == "ours" else signal.SIGCONT)
                    torch.set_num_threads(threads[path])  # this process's threads as each path's driver has them
                    seconds, metrics = timed_step(trainers[path], iters[path], args.device)
                    if i >= args.warmup:
                        times[path].append(seconds)
                        for key, value in metrics.items():
                            if key.startswith("timing_s/"):
                                stages[path][key[9:]] = stages[path].get(key[9:], 0.0) + value / args.steps
        finally:
            signal_all(paused, signal.SIGCONT)
        ray_trainer.shutdown()
        local.shutdown()
    ratios = [r / o for r, o in zip(times["ours_ray"], times["ours"])]
    return {"times": times, "stages": stages, "driver_threads": threads, "ratios": ratios,
            "paused_processes": len(paused), "spec": {k: v for k, v in spec.items() if k != "model_dir"}}


def report(result: dict, args, load_at_start: float) -> None:
    spec = result["spec"]
    print(f"Ray path vs in-process, steps alternated in one process: {args.size or '1m'} model "
          f"({spec['sizes']['hidden_size']} hidden, {spec['sizes']['num_layers']} layers), {args.prompts} prompts x "
          f"{args.n} x <= {args.new_tokens} tokens, {args.steps} pairs after {args.warmup} warm-up; Ray's "
          + (f"{result['paused_processes']} processes stopped during in-process steps" if not args.no_pause
             else "processes left running (--no-pause)"))
    names = {"ours": "in-process (1 LocalWorkerGroup rank)", "ours_ray": "through Ray (rlhf ppo's group)"}
    for path, name in names.items():
        t = result["times"][path]
        print(f"  {name:38s}: driver threads {result['driver_threads'][path]}, median {statistics.median(t):.3f} "
              f"s/step ({min(t):.3f}-{max(t):.3f}); stages (s): "
              + ", ".join(f"{k} {v:.3f}" for k, v in result["stages"][path].items() if v >= 0.0005))
    r = result["ratios"]
    print(f"  Ray / in-process per pair: {', '.join(f'{x:.2f}' for x in r)}")
    print(f"ratio ours_ray/ours: median of pairs {statistics.median(r):.3f}x (quartiles "
          f"{', '.join(f'{q:.3f}' for q in statistics.quantiles(r, n=4, method='inclusive'))}), ratio of medians "
          f"{statistics.median(result['times']['ours_ray']) / statistics.median(result['times']['ours']):.3f}x "
          f"(target <= 1.10)")
    print(f"1-min load average {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} now, "
          f"on {os.cpu_count()} CPUs")


def main(argv: list[str] | None = None) -> int:
    ap = bps.build_parser(__doc__.splitlines()[0])
    ap.add_argument("--no-pause", action="store_true", help="leave Ray's processes running during in-process steps")
    workload = ap.parse_args(argv)
    if workload.steps < 2:
        raise SystemExit(f"--steps must be at least 2 (pairs), got {workload.steps}")
    if workload.warmup < 0:
        raise SystemExit(f"--warmup must be at least 0, got {workload.warmup}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(bps.REPO))
    load = os.getloadavg()[0]
    result = run(workload)
    report(result, workload, load)
    if workload.json:
        Path(workload.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
