"""reward_model.reward_manager=gdpo (rlhf_core/reward/gdpo.py): a scorer's dict keys become the reward components
that algorithm.adv_estimator=gdpo reads (rlhf_core/trainer/advantage_stage.py)."""
from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf

from rlhf_core.config import load_config
from rlhf_core.protocol import Batch
from rlhf_core.reward import GDPORewardManager, load_reward_manager
from rlhf_core.reward.loader import registered_reward_managers
from rlhf_core.trainer.advantage_stage import estimator_extra_inputs

from tests.fixtures.reward_fixtures import CharTokenizer, make_batch


def components(data_source, solution_str, ground_truth, extra_info=None):
    fmt = 1.0 if solution_str.startswith("####") else 0.0
    acc = 1.0 if solution_str.strip().endswith(ground_truth) else 0.0
    return {"score": fmt + acc, "format_reward": fmt, "accuracy_reward": acc}


def test_gdpo_manager_dict_keys_are_the_estimators_components():
    assert "gdpo" in registered_reward_managers()
    tok = CharTokenizer()
    batch = make_batch(tok, ["Q1", "Q2", "Q3"], ["#### 7", "#### 5", "7"], ["7", "7", "7"], ["x"] * 3)
    out = GDPORewardManager(tok, compute_score=components)(batch, return_dict=True)
    info = out["reward_extra_info"]
    # "#### 7": format 1, acc 1; "#### 5": format 1, acc 0; "7": format 0, acc 1; the score sum at the last token
    assert info["format_reward"] == [1.0, 1.0, 0.0] and info["accuracy_reward"] == [1.0, 0.0, 1.0]
    assert out["reward_tensor"].sum(-1).tolist() == [2.0, 1.0, 1.0]
    # the [reward] stage keeps the extra info as per-sample columns; the [adv] stage reads the configured keys
    cols = {k: np.asarray(v, dtype=object) for k, v in info.items()}
    algo = OmegaConf.create({"adv_estimator": "gdpo", "gdpo_reward_keys": ["format_reward", "accuracy_reward"],
                             "gdpo_reward_weights": None})
    rows, _ = estimator_extra_inputs(algo, Batch({"r": torch.zeros(3, 1)}, cols), {})
    assert {k: v.tolist() for k, v in rows["reward_components"].items()} == {
        "format_reward": [1.0, 1.0, 0.0], "accuracy_reward": [1.0, 0.0, 1.0]}


def test_gdpo_manager_reports_a_float_score_as_acc():
    cfg = load_config("ppo_trainer", ["reward_model.reward_manager=gdpo"])
    tok = CharTokenizer()
    manager = load_reward_manager(cfg, tok)
    assert isinstance(manager, GDPORewardManager)
    batch = make_batch(tok, ["Q1", "Q2"], ["#### 7", "#### 3"], ["7", "7"], ["openai/gsm8k"] * 2)
    out = manager(batch, return_dict=True)
    assert out["reward_extra_info"] == {"acc": [1.0, 0.0]}  # gsm8k's rule scorer: right answer 1, wrong 0
