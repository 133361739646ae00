"""Shared pieces of the resume tests: tiny GSM8K parquet files, a PPO config, and readers of what a run leaves.

The config makes every source of randomness matter, so a resume that loses one of them shows in the numbers:
sampled rollouts (``do_sample``, temperature 1), attention dropout 0.1 in the actor (the workers' global torch RNG),
a shuffled dataloader (``data.seed``), and a reward function that draws from the driver's python, numpy and torch
RNGs. Validation before training runs again on every resume (verl's default), so it must not shift the rollout
seeds of the training steps.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

# A length reward (the untrained tiny model never answers correctly) plus noise from the driver's three global
# RNGs: a resumed driver that did not restore them scores differently from the uninterrupted run.
DRIVER_RNG_REWARD = """
import random

import numpy as np
import torch


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    noise = random.random() + float(np.random.rand()) + float(torch.rand(()))
    return (len(solution_str) % 5) / 4.0 + 0.01 * noise
"""

# Keys whose values are wall-clock measurements (never equal between two runs); every other metric is compared.
TIMING_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/time_per_step", "perf/throughput", "perf/mfu/")


def write_prompts(gsm8k_dir: Path, out: Path, n_train: int, n_val: int) -> tuple[Path, Path]:
    """``train.parquet`` / ``test.parquet`` with the first ``n_train`` / ``n_val`` GSM8K rows (verl schema)."""
    import pandas as pd

    from rlhf_core.data.gsm8k import preprocess_gsm8k

    files = preprocess_gsm8k(str(gsm8k_dir), str(out / "full"))
    pd.read_parquet(files["train"]).head(n_train).to_parquet(out / "train.parquet")
    pd.read_parquet(files["test"]).head(n_val).to_parquet(out / "test.parquet")
    with open(out / "driver_rng_reward.py", "w") as fh:
        fh.write(DRIVER_RNG_REWARD)
    return out / "train.parquet", out / "test.parquet"


def resume_config(model: str, files: tuple[Path, Path], out_dir: Path, *extra: str):
    """GRPO on 4 prompts, 2 per step (2 steps per epoch), 2 epochs, 2 samples of 6 tokens per prompt, 1 rank."""
    from rlhf_core.config import load_config

    train, test = files
    return load_config("ppo_trainer", [
        f"data.train_files={train}", f"data.val_files={test}", "data.train_batch_size=2", "data.shuffle=true",
        "data.max_prompt_length=64", "data.max_response_length=6", "data.truncation=left", "data.seed=7",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf",
        "+actor_rollout_ref.model.override_config.model_config.attention_dropout=0.1",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.val_kwargs.n=1", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "algorithm.adv_estimator=grpo", "trainer.nnodes=1", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
        "trainer.total_epochs=2", "trainer.val_before_train=true", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.logger=[file]", f"trainer.default_local_dir={out_dir}", "trainer.resume_mode=auto",
        f"trainer.rollout_data_dir={out_dir}/rollouts",
        "trainer.project_name=resume", "trainer.experiment_name=e",
        f"custom_reward_function.path={Path(train).parent / 'driver_rng_reward.py'}", "ray_init.num_cpus=2",
        *extra])


def checkpoint_params(step_dir: str | Path) -> dict[str, torch.Tensor]:
    """The actor's full weights saved with ``hf_model`` in ``<step_dir>/actor/huggingface/model.safetensors``."""
    from safetensors.torch import load_file

    return load_file(os.path.join(str(step_dir), "actor", "huggingface", "model.safetensors"))


def assert_params_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """The same tensor names and every tensor bit-identical (``torch.equal``)."""
    assert sorted(a) == sorted(b)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)} of {len(a)} tensors differ, e.g. {differ[:3]}"


def step_prompts(out_dir: str | Path, step: int) -> list[str]:
    """The prompts (decoded, one per sample) a step trained on, from its ``trainer.rollout_data_dir`` dump, sorted."""
    import json

    with open(os.path.join(str(out_dir), "rollouts", f"{step}.jsonl"), encoding="utf-8") as fh:
        return sorted(json.loads(line)["input"] for line in fh if line.strip())


def run_metrics(out_dir: str | Path) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` from the run's file sink, wall-clock metrics left out."""
    from rlhf_core.trainer.tracking import read_metrics_jsonl

    rows = read_metrics_jsonl(os.path.join(str(out_dir), "metrics.jsonl"))
    return {step: {k: v for k, v in m.items() if not k.startswith(TIMING_PREFIXES)} for step, m in rows.items()}
