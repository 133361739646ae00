"""Learning per wall-clock second, ours vs TRL's GRPOTrainer, from the same warmed-up checkpoint (issue 15).

    python bench/learning_vs_trl.py --workdir /tmp/learn-bench [--seconds 480] [--lr 3e-4] [--trl-lr 3e-4]
                                    [--peers ours,trl] [--seed 0] [--threads 2] [--set KEY=VALUE ...] [--steps N]

Task: Countdown as the experiment ``experiments/countdown.yaml`` sets it (``data.generator_args``: arguments of
``rlhf_core.data.countdown.generate_countdown``, seed 0: 20000 train, 500 held-out test problems). Set-up, done once
per ``--workdir`` and shared by both peers: the tiny model (the experiment's ``model.tiny`` sizes) built on the task
text, then its warm-up SFT (``rlhf sft`` with the experiment's ``sft.overrides``) on format-only answers that are
never solutions. ``--peers none`` only prepares (and prints the warm-up's accuracy): run it first when the peers
are to be started side by side on one ``--workdir``, so they do not both prepare it.

Peers, each from that warmed-up checkpoint, each in its own process, one after the other (or side by side, as
two invocations with ``--threads 1``):

* ``ours``: ``rlhf ppo`` with the experiment's ``ppo.overrides`` (GRPO, 32 prompts × n=8 per batch in mini-batches of
  8 prompts, response ≤ 12 tokens, no KL, HF rollout), then ``ray_init.num_cpus=--threads``, then ``--set``, and
  ``trainer.total_training_seconds=--seconds``.
* ``trl``: TRL ``GRPOTrainer`` with the same prompts (same shuffled order is not guaranteed), reward (the Countdown
  scorer), group size (``num_generations``), prompts per generation and per optimizer step (as ours after
  ``--set``: ``per_device_train_batch_size`` = mini-batch × n, ``steps_per_generation`` = batch ÷ mini-batch),
  learning rate, weight decay (0.01) and gradient clip (1.0), ``max_completion_length=12``, temperature 1,
  ``beta=0``, ``num_iterations=1``, fp32 on CPU, ``--threads`` intra-op threads, stopped by a callback when
  ``--seconds`` of training have passed.

Both final models are scored by the same function here: greedy decoding (HF ``generate``, ``do_sample=False``,
12 new tokens) on the 500 test problems, before (the warmed-up checkpoint) and after. Prints each gain and
``ratio = ours gain / TRL gain``. Training time counts from the first training step (ours: the budget clock of
``trainer.total_training_seconds``; TRL: ``on_train_begin``); set-up, model loading and the final evaluation
are outside the budget for both.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = REPO / "experiments" / "countdown.yaml"
MAX_NEW_TOKENS = 12


def _experiment() -> Any:
    """``experiments/countdown.yaml`` (``flows.experiment.load_experiment``)."""
    if str(REPO) not in sys.path:  # run as a script: bench/ is on the path, the checkout is not
        sys.path.insert(0, str(REPO))
    from flows.experiment import load_experiment

    return load_experiment(EXPERIMENT)


def _budget_seconds() -> float:
    """The experiment's ``trainer.total_training_seconds`` (its ``ppo.overrides``)."""
    key = "trainer.total_training_seconds="
    return float(next(o for o in _experiment().ppo.overrides if o.startswith(key))[len(key):])


def _rlhf(argv: list[str], log: Path) -> None:
    """Run ``rlhf <argv>`` in a subprocess (this checkout first on the path); raise with the log tail on failure."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = "import sys, rlhf_cli; sys.exit(rlhf_cli.main(sys.argv[1:]))"
    with open(log, "w") as fh:
        rc = subprocess.call([sys.executable, "-c", code, *argv], stdout=fh, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        raise RuntimeError(f"rlhf {argv[0]} failed (rc {rc}); last lines of {log}:\n" + log.read_text()[-3000:])


def prepare(work: Path) -> Path:
    """Data, tiny model and warm-up SFT under ``work`` (reused when present); returns the warmed-up HF folder."""
    from rlhf_core.data.countdown import generate_countdown
    from tasks.remote import build_model_remote

    warm = work / "sft" / "hf_model"
    if (warm / "config.json").exists():
        return warm
    exp = _experiment()
    files = generate_countdown(str(work / "data"), exp.data.train_max_samples, exp.data.val_max_samples, seed=0,
                               **exp.data.generator_args)
    model = build_model_remote(files["train"], str(work / "model"), dict(exp.model.tiny))  # the flow's build_model
    _rlhf(["sft", *exp.sft.overrides, f"model.partial_pretrain={model}", f"data.train_files={files['train']}",
           f"data.val_files={files['test']}", f"trainer.default_local_dir={work / 'sft'}",
           f"trainer.total_epochs={exp.sft.epochs}", "trainer.logger=[console]",
           "trainer.project_name=learn", "trainer.experiment_name=sft"], work / "sft.log")
    return warm


def test_rows(work: Path) -> list[dict]:
    from rlhf_core.data.readers import read_parquet_rows

    return read_parquet_rows(str(work / "data" / "test.parquet"))


def greedy_accuracy(model_dir: Path, rows: list[dict], state_dict_file: Path | None = None,
                    batch_size: int = 100) -> float:
    """Mean Countdown accuracy of greedy responses (``max_new_tokens=12``) to ``rows``' prompts.

    ``state_dict_file`` (a safetensors file) replaces the weights of ``model_dir`` (ours saves weights only).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf_core.reward.scorers import countdown

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if state_dict_file is not None:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(state_dict_file)), strict=False)
    correct = 0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        texts = [tok.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False)
                 for r in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        for r, ids in zip(chunk, out[:, enc["input_ids"].shape[1]:]):
            text = tok.decode(ids, skip_special_tokens=True)
            correct += countdown.compute_score(text, r["reward_model"]["ground_truth"])["acc"]
    return correct / len(rows)


def ppo_overrides(extra: list[str], threads: int) -> list[str]:
    """The experiment's ``ppo.overrides``, then ``ray_init.num_cpus=threads``, then ``extra`` (later wins)."""
    return [*_experiment().ppo.overrides, f"ray_init.num_cpus={threads}", *extra]


def run_ours(work: Path, warm: Path, seconds: float, lr: float, seed: int, extra: list[str] | None = None,
             threads: int = 2, steps: int = 100000) -> dict:
    """GRPO with our trainer for ``seconds`` of training; returns ``{"steps", "weights", "wall_s"}``.

    ``extra`` overrides come after the experiment's (e.g. ``actor_rollout_ref.actor.ppo_mini_batch_size=8``);
    ``threads`` is the CPUs Ray may use (one actor rank: its intra-op threads); ``steps`` ends the run earlier than
    the budget (``trainer.total_training_steps``)."""
    out = work / f"ours_lr{lr}_s{seed}"
    t0 = time.perf_counter()
    _rlhf(["ppo", *ppo_overrides(list(extra or []), threads), f"actor_rollout_ref.model.path={warm}",
           f"data.train_files={work / 'data' / 'train.parquet'}", f"data.val_files={work / 'data' / 'test.parquet'}",
           "algorithm.adv_estimator=grpo", f"actor_rollout_ref.actor.optim.lr={lr}", f"data.seed={seed}",
           f"trainer.total_training_seconds={seconds}",
           f"trainer.total_training_steps={steps}", "trainer.val_before_train=False", "trainer.test_freq=-1",
           "trainer.save_freq=100000", "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
           "trainer.logger=[console,file]", f"trainer.default_local_dir={out}", "trainer.resume_mode=disable",
           "trainer.project_name=learn", "trainer.experiment_name=ours"], work / f"ours_lr{lr}_s{seed}.log")
    step = int((out / "latest_checkpointed_iteration.txt").read_text().strip())
    weights = out / f"global_step_{step}" / "actor" / "huggingface" / "model.safetensors"
    return {"steps": step, "weights": weights, "wall_s": time.perf_counter() - t0}


def run_trl(work: Path, warm: Path, seconds: float, lr: float, seed: int, extra: list[str] | None = None,
            threads: int = 2, steps: int = 100000, step_times: list[float] | None = None) -> dict:
    """GRPO with TRL's GRPOTrainer for ``seconds`` of training; returns ``{"steps", "model_dir", "wall_s"}``.

    Mirrors our settings after ``extra``: ``rollout.n`` → ``num_generations``; ``actor.ppo_mini_batch_size``
    prompts per optimizer step → ``per_device_train_batch_size`` (× n) and ``steps_per_generation`` (train batch ÷
    mini-batch); ``threads`` → ``torch.set_num_threads``. ``steps`` counts TRL's optimizer steps (``max_steps``);
    ``step_times`` (a list), when given, gets ``time.perf_counter()`` at the start of training and at each step's end."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlhf_core.data.readers import read_parquet_rows
    from rlhf_core.reward.scorers import countdown

    torch.set_num_threads(threads)
    ppo = dict(o.split("=", 1) for o in ppo_overrides(list(extra or []), threads))
    n, prompts = int(ppo["actor_rollout_ref.rollout.n"]), int(ppo["data.train_batch_size"])
    mini = int(ppo["actor_rollout_ref.actor.ppo_mini_batch_size"])
    rows = read_parquet_rows(str(work / "data" / "train.parquet"))
    data = Dataset.from_list([{"prompt": [dict(m) for m in r["prompt"]],
                               "ground_truth": r["reward_model"]["ground_truth"]} for r in rows])

    def reward(prompts, completions, ground_truth, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [countdown.compute_score(t, g)["score"] for t, g in zip(texts, ground_truth)]

    class Budget(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()
            if step_times is not None:
                step_times.append(self.t0)

        def on_step_end(self, a, state, control, **kw):
            if step_times is not None:
                step_times.append(time.perf_counter())
            if time.perf_counter() - self.t0 >= seconds:
                control.should_training_stop = True

    out = work / f"trl_lr{lr}_s{seed}"
    cfg = GRPOConfig(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=mini * n, gradient_accumulation_steps=1,
        steps_per_generation=prompts // mini, num_generations=n, max_completion_length=MAX_NEW_TOKENS,
        learning_rate=lr, beta=0.0, num_iterations=1,
        scale_rewards="group", temperature=1.0, bf16=False, fp16=False, gradient_checkpointing=False,
        logging_steps=10, report_to="none", save_strategy="no", max_steps=steps, disable_tqdm=True,
        dataloader_num_workers=0, seed=seed, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.01, max_grad_norm=1.0)  # ours: actor.optim.weight_decay 0.01, actor.grad_clip 1.0
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32),
                          reward_funcs=reward, args=cfg, train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(warm), callbacks=[Budget()])
    trainer.train()
    trainer.save_model(str(out / "final"))
    AutoTokenizer.from_pretrained(warm).save_pretrained(str(out / "final"))
    return {"steps": trainer.state.global_step, "model_dir": out / "final", "wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--seconds", type=float, default=_budget_seconds(),
                   help="training wall-clock budget per peer (default: the experiment's trainer.total_training_seconds)")
    p.add_argument("--lr", type=float, default=3e-4, help="our learning rate (the experiment's)")
    p.add_argument("--trl-lr", type=float, default=None, help="TRL's learning rate (default: --lr)")
    p.add_argument("--peers", default="ours,trl", help="ours,trl | ours | trl | none (prepare only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for ours after the experiment's (repeatable); TRL mirrors n, batch and mini-batch")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for each peer (ours: ray_init.num_cpus)")
    p.add_argument("--steps", type=int, default=100000,
                   help="ours only: stop after this many GRPO steps if the budget lasts longer (A/B of two checkouts)")
    args = p.parse_args(argv)
    peers = args.peers.split(",")
    if peers != ["none"] and not set(peers) <= {"ours", "trl"}:
        p.error(f"--peers {args.peers!r}: use ours,trl | ours | trl | none")
    sys.path.insert(0, str(REPO))
    from rlhf_core.config import ConfigError, load_config

    try:  # a bad --set fails here, before the warm-up
        load_config("ppo_trainer", ppo_overrides(args.set, args.threads))
    except ConfigError as exc:
        p.error(f"--set: {exc}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    warm = prepare(args.workdir)
    rows = test_rows(args.workdir)
    base = greedy_accuracy(warm, rows)
    result = {"before": base, "seconds": args.seconds, "n_test": len(rows), "load": os.getloadavg()}
    if "ours" in peers:
        r = run_ours(args.workdir, warm, args.seconds, args.lr, args.seed, args.set, args.threads, args.steps)
        result["ours"] = {"lr": args.lr, "steps": r["steps"], "wall_s": round(r["wall_s"], 1),
                          "after": greedy_accuracy(warm, rows, state_dict_file=r["weights"])}
    if "trl" in peers:
        lr = args.trl_lr if args.trl_lr is not None else args.lr
        r = run_trl(args.workdir, warm, args.seconds, lr, args.seed, args.set, args.threads)
        result["trl"] = {"lr": lr, "steps": r["steps"], "wall_s": round(r["wall_s"], 1),
                         "after": greedy_accuracy(r["model_dir"], rows)}
    result["load_end"] = os.getloadavg()
    print(f"greedy accuracy on {len(rows)} held-out Countdown problems, {args.seconds:.0f} s of training each")
    print(f"  warmed-up checkpoint: {base:.3f}")
    for name in ("ours", "trl"):
        if name in result:
            r = result[name]
            print(f"  {name:4s} lr={r['lr']:g}: {r['after']:.3f} (gain {r['after'] - base:+.3f}, {r['steps']} steps)")
    if "ours" in result and "trl" in result:
        g_ours, g_trl = result["ours"]["after"] - base, result["trl"]["after"] - base
        ratio = g_ours / g_trl if g_trl else float("inf")
        print(f"  ratio ours/TRL gain: {ratio:.2f}")
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
