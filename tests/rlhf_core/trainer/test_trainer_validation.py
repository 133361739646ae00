"""PPO validation: a scorer's bool extras become the core variable, ``pred`` strings drive ``maj@n``."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from rlhf_core.data.rl_dataset import collate_fn
from rlhf_core.trainer.ppo_validation import Validator, validation_infos
from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, FakeActor, FakeGroup, make_config, make_dataset

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


class _CalcThenAnswer:
    """Scripted policy: the first turn of every trajectory calls the calculator, the second answers."""

    def __init__(self, tok):
        self.tok = tok

    async def generate(self, prompt_ids, max_new_tokens, request_id):
        from rlhf_core.agent.base import TokenOutput
        from rlhf_core.data.prompts import encode

        text = ('<tool_call>{"name": "calculator", "arguments": {"expression": "6*12"}}</tool_call>'
                if request_id.endswith("/turn0") else "#### 72")
        ids = (encode(self.tok, text) + [self.tok.eos_token_id])[:max_new_tokens]
        return TokenOutput(ids, [-0.5] * len(ids))


def test_multiturn_validation_samples_record_turns_and_tool_calls(tmp_path):
    """Validation of agent-loop rollouts: each sample row carries the trajectory's num_turns, tool_calls and
    tool_failures (int64), and their means reach the validation metrics."""
    from rlhf_core.agent.base import MultiTurnSettings
    from rlhf_core.agent.manager import AgentLoopManager
    from rlhf_core.agent.registry import load_agent_loop_specs
    from tests.fixtures.agent_fixtures import make_tokenizer, tool

    tok = make_tokenizer()
    calculator = tool("rlhf_core.tools.builtin.CalculatorTool", "calculator")
    manager = AgentLoopManager(_CalcThenAnswer(tok), tok, MultiTurnSettings(response_length=120),
                               {"calculator": calculator}, load_agent_loop_specs(None), "tool_agent", tok.pad_token_id)

    class AgentActor:
        def generate_sequences(self, batch):
            return manager.generate_sequences(batch)

    cfg = make_config(tmp_path)
    cfg.actor_rollout_ref.rollout.val_kwargs.n = 2
    batch = collate_fn(make_dataset(2))
    batch.non_tensors["raw_prompt"] = [[{"role": "user", "content": f"What is 6 times {k}?"}] for k in (12, 13)]
    metrics = Validator(cfg, tok, FakeGroup(AgentActor()), pred_reward_fn, [batch]).validate(global_step=1)
    samples = pd.read_parquet(os.path.join(cfg.trainer.validation_data_dir, "val_step_1.parquet"))
    # prompt + assistant (call) + tool ("72") + assistant ("#### 72") = 4 turns, one successful call each
    assert samples["num_turns"].tolist() == [4] * 4 and samples["num_turns"].dtype == np.int64
    assert samples["tool_calls"].tolist() == [1] * 4 and samples["tool_failures"].tolist() == [0] * 4
    assert metrics["val-aux/toy/num_turns/mean@2"] == pytest.approx(4.0)
    assert metrics["val-aux/toy/tool_calls/mean@2"] == pytest.approx(1.0)
