"""Shared helpers for the bad-input tests: small verl-schema files, a PPO config for the tiny model, scorers.

Import-light on purpose: the ``prime`` pool's spawned workers import this module to unpickle :func:`hang_scorer`.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def verl_row(question: str, answer: str = "42", index: int = 0) -> dict[str, Any]:
    """One row in verl's parquet schema (GSM8K data source)."""
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index},
    }


def good_rows(n: int = 4) -> list[dict[str, Any]]:
    return [verl_row(f"What is {i} + {i}?", str(2 * i), i) for i in range(n)]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    import pyarrow as pa  # lazy: see the module docstring
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def write_jsonl(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def ppo_overrides(model_dir: str, train_file: str, *extra: str) -> list[str]:
    """A world-size-1 GRPO config for the tiny model on ``train_file`` (4-prompt batches, 2 samples each);
    checkpoints would go to ``ckpt/`` next to the data file."""
    return [f"actor_rollout_ref.model.path={model_dir}", f"critic.model.path={model_dir}",
            f"trainer.default_local_dir={Path(train_file).parent / 'ckpt'}",
            f"data.train_files={train_file}", "data.val_files=null", "trainer.n_gpus_per_node=1",
            "data.train_batch_size=4", "data.max_prompt_length=64", "data.max_response_length=8",
            "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "trainer.logger=[console]",
            "trainer.total_epochs=1", *extra]


def rlhf_ppo(model_dir: str, train_file: str, ckpt: str | os.PathLike, *extra: str):
    """Run a real ``rlhf ppo`` subprocess on :func:`ppo_overrides` (no validation) writing checkpoints to ``ckpt``,
    in the data file's folder; returns the ``subprocess.CompletedProcess`` (text output captured)."""
    import subprocess
    import sys

    env = {**os.environ, "CI": "true"}
    env.pop("RLHF_HOME", None)
    args = ppo_overrides(model_dir, train_file, f"trainer.default_local_dir={ckpt}", "trainer.test_freq=-1", *extra)
    return subprocess.run([str(Path(sys.executable).parent / "rlhf"), "ppo", *args], env=env, capture_output=True,
                          text=True, timeout=600, cwd=Path(train_file).parent)


def ppo_error(overrides: list[str], expected: type[BaseException] = Exception) -> str:
    """Run ``run_ppo`` on the config and return its error message; asserts that it failed before Ray started
    (so before any worker, and so any model, was loaded) and that no checkpoint folder was created."""
    import pytest
    import ray

    from rlhf_core.config import load_config
    from rlhf_core.trainer.main_ppo import run_ppo

    with pytest.raises(expected) as info:
        run_ppo(load_config("ppo_trainer", overrides))
    assert not ray.is_initialized(), "the error came after Ray had started"
    ckpt = [o.partition("=")[2] for o in overrides if o.startswith("trainer.default_local_dir=")]
    assert ckpt and not os.path.exists(ckpt[-1]), "a checkpoint folder was created"
    return str(info.value)


def tokenizer_without_pad_and_eos(model_dir: str, out: Path) -> str:
    """A copy of the tiny model's folder whose tokenizer declares neither a pad nor an eos token."""
    import shutil

    shutil.copytree(model_dir, out)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = out / name
        if path.exists():
            cfg = json.loads(path.read_text())
            for key in ("pad_token", "eos_token"):
                cfg[key] = None  # explicit: a missing key gets Qwen2Tokenizer's default <|endoftext|>
            path.write_text(json.dumps(cfg))
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in ("pad_token_id", "eos_token_id"):
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg))
    gen = out / "generation_config.json"
    if gen.exists():
        gen.unlink()
    return str(out)


def listing(root: str | os.PathLike) -> list[str]:
    """Every file and folder under ``root``, relative, sorted (to assert nothing half-written is left)."""
    root = Path(root)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def hang_scorer(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """Hangs on the response ``"hang"`` (far past any timeout), else 1.0 when the response equals the truth."""
    if solution_str == "hang":
        time.sleep(10_000)
    return float(solution_str == ground_truth)
