"""PPO validation: a scorer's bool extras become the core variable, ``pred`` strings drive ``maj@n``."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from rlhf_core.data.rl_dataset import collate_fn
from rlhf_core.trainer.ppo_validation import Validator, validation_infos
from test_trainer_ppo import DecodeTok, FakeActor, FakeGroup, make_config, make_dataset

VAL_N = 4


def pred_reward_fn(batch, return_dict=False):
    """Prompt with ground truth "0": every sample predicts "7", ``acc=True``, score 0.25.
    Other prompts: every sample predicts "3", ``acc=False``, score 0. The score differs from ``acc`` so the
    two variables can be told apart in the metrics."""
    gts = [rm["ground_truth"] for rm in batch["reward_model"]]
    correct = [gt == "0" for gt in gts]
    scores = torch.zeros(batch["responses"].shape)
    last = batch["response_mask"].sum(-1) - 1
    scores[torch.arange(len(batch)), last] = torch.tensor([0.25 if c else 0.0 for c in correct])
    extra = {"acc": [bool(c) for c in correct], "pred": ["7" if c else "3" for c in correct]}
    return {"reward_tensor": scores, "reward_extra_info": extra}


def _validate(tmp_path):
    cfg = make_config(tmp_path)
    cfg.actor_rollout_ref.rollout.val_kwargs.n = VAL_N
    validator = Validator(cfg, DecodeTok(), FakeGroup(FakeActor([])), pred_reward_fn,
                          [collate_fn(make_dataset(2))])  # ground truths "0" and "1"
    return validator.validate(global_step=3), cfg


def test_bool_acc_is_core_and_pred_gives_majority_vote(tmp_path):
    metrics, cfg = _validate(tmp_path)
    # acc: prompt "0" 4/4 True, prompt "1" 0/4 → mean@4 = (1 + 0) / 2 = 0.5 per data source
    assert metrics["val-core/toy/acc/mean@4"] == pytest.approx(0.5)
    # every sample of a prompt shares one pred, so every bootstrap vote picks it: maj = 1 for "0", 0 for "1"
    assert metrics["val-core/toy/acc/maj@4/mean"] == pytest.approx(0.5)
    assert metrics["val-core/toy/acc/maj@4/std"] == pytest.approx(0.0)
    assert metrics["val-aux/toy/acc/maj@2/mean"] == pytest.approx(0.5)
    # pass@k on the core variable: c = 4 of 4 → 1, c = 0 → 0; averaged over the two prompts
    assert metrics["val-aux/toy/acc/pass@1"] == pytest.approx(0.5)
    # reward is no longer the core variable: only aux names, with the score's own values (0.25 and 0 → 0.125)
    assert not [k for k in metrics if k.startswith("val-core/toy/reward/")]
    assert metrics["val-aux/toy/reward/mean@4"] == pytest.approx(0.125)
    assert "val-aux/toy/reward/maj@4/mean" in metrics  # pred votes over every numeric variable (verl)
    # the string variable itself is not summarised
    assert not [k for k in metrics if "/pred/" in k]
    samples = pd.read_parquet(os.path.join(cfg.trainer.validation_data_dir, "val_step_3.parquet"))
    assert len(samples) == 2 * VAL_N and set(samples["pred"]) == {"7", "3"}
    assert samples["acc"].tolist().count(True) == VAL_N


def test_validation_infos_converts_bools_and_keeps_strings():
    rows = [{"score": 1, "data_source": "d", "acc": np.bool_(True), "pred": "5", "n": np.int64(2), "note": None},
            {"score": 0.0, "data_source": "d", "acc": False, "pred": "6", "n": 3.5, "note": "x"}]
    infos = validation_infos(rows)
    assert infos["reward"] == [1.0, 0.0]
    assert infos["acc"] == [1.0, 0.0] and all(type(v) is float for v in infos["acc"])
    assert infos["n"] == [2.0, 3.5]
    assert infos["pred"] == ["5", "6"] and infos["note"] == [None, "x"]  # passed through, not summarised
    assert validation_infos([]) == {"reward": []}
