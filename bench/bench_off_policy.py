"""Where the off-policy drivers' overlap pays on one machine: on-policy, one-step off-policy, fully async (issue 35).

    python bench/bench_off_policy.py --workdir W [--rounds 3] [--steps 12] [--warmup 2] [--prompts 8] [--n 4]
        [--lengths 4,64] [--cpus 2] [--modes on_policy,one_step,fully_async] [--set KEY=VALUE ...] [--json out.json]

Workload: GRPO on Countdown prompts (``rlhf_core.data.countdown`` with ``experiments/countdown.yaml``'s generator
arguments, 2000 train problems, seed 0; 28-33 prompt tokens) with the experiment's tiny Qwen2 (0.83 M parameters) *as built, not warmed up*: it almost
never samples EOS (vocabulary 400), so every response runs to ``data.max_response_length`` and that length is an
exact knob of the generation's cost. One optimizer step and one micro-batch per batch (``ppo_mini_batch_size =
data.train_batch_size = --prompts``, ``ppo_micro_batch_size_per_gpu = --prompts × --n``, ``rollout.n = --n``), no KL,
no checkpoints, no validation. Each run is the real ``rlhf ppo`` path (Ray worker groups, driver, file logger) in
its own process with ``ray_init.num_cpus=--cpus`` in every mode:

* ``on_policy``: one actor group with the colocated HF rollout (one rank: ``--cpus`` intra-op threads);
* ``one_step``: ``async_training.mode=one_step_off_policy`` with a rollout group of one rank apart from the actor
  (the two ranks share ``--cpus``: ``--cpus / 2`` threads each, ``build_one_step_worker_groups``); step k+1's
  generation runs while step k computes log-probs and updates;
* ``fully_async``: ``async_training.mode=fully_async``, ``staleness_threshold=1``, ``trigger_parameter_sync_step=1``
  (a sync after every update, the rollouter at most one chunk ahead: staleness ≤ 1), verl's default
  ``partial_rollout=True``; same resources as one_step.

Knobs that decide whether the overlap pays: ``--lengths`` (response tokens: long responses make generation the
bigger stage, short ones leave the update as big as generation), ``--cpus`` (the off-policy drivers split the cores
between two ranks that compute at once; on 2 cores with ``--cpus 2`` each rank gets 1 thread against the
on-policy rank's 2; ``--cpus 4`` gives each 2 threads, oversubscribing 2 cores). ``--set`` adds overrides to
every mode (e.g. ``actor_rollout_ref.actor.ppo_epochs=4`` for an update-heavy step).

A round runs every (length, mode) once, one run at a time, the mode order rotated every round. A run's rate is
``(steps - warmup) / (time from the end of step warmup to the end of the last step)``, from the differences of
``timing_s/training_elapsed`` in its ``metrics.jsonl``. Prints per round and length each mode's steps/s and
median stage seconds after the warm-up: ``step``; ``gen`` (on-policy: generation; off-policy: the wait for the
batch); ``gen_own`` (``timing_s/generate_async``: the generation's own seconds, overlapped or not);
``update_actor``; ``overlap`` (``timing_s/overlap_gen_update``: seconds of the update during which a generation
ran); then per length and mode the median steps/s with quartiles over rounds and the speed-up over on-policy.
``uptime`` is printed before and after each round.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODES = {
    "on_policy": [],
    "one_step": ["async_training.mode=one_step_off_policy", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"],
    "fully_async": ["async_training.mode=fully_async", "async_training.staleness_threshold=1",
                    "async_training.trigger_parameter_sync_step=1", "rollout.total_rollout_steps=1000000",
                    "rollout.nnodes=1", "rollout.n_gpus_per_node=1"],
}
STAGES = {"step": "step", "gen": "gen", "gen_own": "generate_async", "old_log_prob": "old_log_prob",
          "update_actor": "update_actor", "overlap": "overlap_gen_update", "sync": "sync_rollout_weights"}


def prepare(work: Path) -> Path:
    """Countdown data (the experiment's sizes, seed 0) and the tiny model built on its text, under ``work``
    (reused when present); returns the model folder."""
    sys.path.insert(0, str(HERE))
    import learning_vs_trl as lv

    model = work / "model"
    if (model / "config.json").exists():
        return model
    from rlhf_core.data.countdown import generate_countdown
    from tasks.remote import build_model_remote

    exp = lv._experiment()
    files = generate_countdown(str(work / "data"), 2000, 100, seed=0, **exp.data.generator_args)
    build_model_remote(files["train"], str(model), dict(exp.model.tiny))
    return model


def run_mode(work: Path, model: Path, mode: str, length: int, args: argparse.Namespace) -> list[dict]:
    """One ``rlhf ppo`` run; returns its per-step metrics (step order)."""
    sys.path.insert(0, str(HERE))
    import learning_vs_trl as lv
    from rlhf_core.trainer.tracking import read_metrics_jsonl

    out = work / f"run_{mode}_L{length}"
    shutil.rmtree(out, ignore_errors=True)
    p = args.prompts
    lv._rlhf(["ppo", *lv.ppo_overrides([], args.cpus), f"actor_rollout_ref.model.path={model}",
              f"data.train_files={work / 'data' / 'train.parquet'}", f"data.val_files={work / 'data' / 'test.parquet'}",
              "algorithm.adv_estimator=grpo", f"data.max_response_length={length}", f"data.train_batch_size={p}",
              f"actor_rollout_ref.actor.ppo_mini_batch_size={p}", f"actor_rollout_ref.rollout.n={args.n}",
              f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={p * args.n}",
              f"trainer.total_training_steps={args.steps}", "trainer.total_training_seconds=1e9",
              "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
              "trainer.logger=[console,file]", f"trainer.default_local_dir={out}", "trainer.resume_mode=disable",
              "trainer.project_name=bench", f"trainer.experiment_name={mode}", *MODES[mode], *args.set],
             work / f"run_{mode}_L{length}.log")
    rows = read_metrics_jsonl(str(out / "metrics.jsonl"))
    return [rows[s] for s in sorted(rows) if "timing_s/training_elapsed" in rows[s]]


def rate(rows: list[dict], warmup: int) -> float:
    """Steps/s after ``warmup`` steps from the step-end clock ``timing_s/training_elapsed``; ValueError when too
    few steps were logged."""
    ends = [r["timing_s/training_elapsed"] for r in rows]
    if warmup < 1 or len(ends) <= warmup:
        raise ValueError(f"{len(ends)} step(s) logged, need more than --warmup {warmup}")
    return (len(ends) - warmup) / (ends[-1] - ends[warmup - 1])


def stages(rows: list[dict], warmup: int) -> dict[str, float]:
    """Median seconds of each stage in :data:`STAGES` over the steps after the warm-up (a stage a mode does not
    log is left out)."""
    kept = rows[warmup:]
    return {name: statistics.median(r[f"timing_s/{key}"] for r in kept) for name, key in STAGES.items()
            if all(f"timing_s/{key}" in r for r in kept)}


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(median, lower quartile, upper quartile); the extremes when fewer than 4 values."""
    if len(xs) < 4:
        return statistics.median(xs), min(xs), max(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[1], q[0], q[2]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--lengths", default="4,64", help="response lengths (tokens), comma-separated")
    p.add_argument("--cpus", type=int, default=2, help="ray_init.num_cpus in every mode")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every mode")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    modes, lengths = args.modes.split(","), [int(x) for x in args.lengths.split(",")]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; choose from {list(MODES)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = prepare(args.workdir)
    results: list[dict] = []
    for k in range(args.rounds):
        load0 = uptime()
        order = modes[k % len(modes):] + modes[:k % len(modes)]
        for length in lengths:
            for mode in order:
                rows = run_mode(args.workdir, model, mode, length, args)
                r = {"round": k + 1, "length": length, "mode": mode, "steps_s": rate(rows, args.warmup),
                     "stages": stages(rows, args.warmup)}
                results.append(r)
                print(f"round {k + 1} L={length} {mode}: {r['steps_s']:.3f} steps/s; median s: "
                      + ", ".join(f"{s} {v:.3f}" for s, v in r["stages"].items()), flush=True)
        print(f"  before: {load0}\n  after:  {uptime()}", flush=True)
    print(f"summary ({args.rounds} rounds, {args.prompts} prompts × {args.n}, {args.steps} steps, first "
          f"{args.warmup} left out, ray_init.num_cpus={args.cpus}{', ' + ' '.join(args.set) if args.set else ''}):")
    for length in lengths:
        base = None
        for mode in modes:
            rates = [r["steps_s"] for r in results if r["length"] == length and r["mode"] == mode]
            med, lo, hi = quartiles(rates)
            base = med if mode == "on_policy" else base
            vs = f", ×{med / base:.2f} of on-policy" if base and mode != "on_policy" else ""
            print(f"  L={length} {mode}: median {med:.3f} steps/s ({lo:.3f}-{hi:.3f}){vs}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
