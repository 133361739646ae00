"""DAPO dynamic sampling (``algorithm.filter_groups``) in a real tiny PPO run (``run_ppo``: Ray, FSDP2, HF rollout).

The custom reward scores a prompt by its GSM8K ground truth: an even answer scores 0 on every sample (a group with
zero spread, dropped), an odd one a random value in [0.5, 1) per sample (always a spread). The first 8 training
rows have the answers 72, 10, 5, 42, 624, 35, 48, 16: only rows 2 and 5 are odd.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

from rlhf_core.trainer.tracking import read_metrics_jsonl

from test_ppo_e2e import gsm8k_parquet, ppo_config  # noqa: F401  (gsm8k_parquet is a fixture)

pytestmark = pytest.mark.ray  # starts Ray: calls run_ppo

PARITY_REWARD = """
import random


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0 if int(ground_truth) % 2 == 0 else 0.5 + random.random() / 2
"""


@pytest.mark.slow
def test_filter_groups_trains_on_kept_groups_only(tiny_model_dir, gsm8k_parquet, tmp_path, monkeypatch):  # noqa: F811
    from rlhf_core.trainer.main_ppo import run_ppo

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    reward_file = tmp_path / "parity_reward.py"
    reward_file.write_text(PARITY_REWARD)
    out = tmp_path / "dapo"
    cfg = ppo_config(tiny_model_dir, gsm8k_parquet, out, "grpo", "trainer.total_training_steps=1",
                     "trainer.test_freq=-1", "trainer.val_before_train=false", "data.shuffle=false",
                     f"custom_reward_function.path={reward_file}", f"trainer.rollout_data_dir={out}/rollouts",
                     "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_reward",
                     "data.gen_batch_size=2", "algorithm.filter_groups.max_num_gen_batches=4")
    assert run_ppo(cfg)["global_step"] == 1
    m = read_metrics_jsonl(str(out / "metrics.jsonl"))
    # gen batches in order (0,1) (2,3) (4,5): none, row 2, row 5 kept → 3 gen batches for train_batch_size 2
    assert m[1]["train/num_gen_batches"] == 3.0 and m[1]["train/num_kept_groups"] == 2.0
    with open(os.path.join(out, "rollouts", "1.jsonl")) as fh:
        rows = [json.loads(line) for line in fh]
    by_prompt = defaultdict(list)
    for row in rows:
        by_prompt[row["input"]].append(row["score"])
    # exactly train_batch_size = 2 prompts × n = 2 samples, every group with a spread (odd answers only: scores > 0)
    assert len(rows) == 4 and len(by_prompt) == 2
    assert all(len(s) == 2 and s[0] != s[1] and min(s) >= 0.5 for s in by_prompt.values())
