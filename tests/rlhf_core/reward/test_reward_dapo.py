"""reward_model.reward_manager=dapo: DAPO's soft overlong punishment, configured as verl 0.6 scripts do."""
from __future__ import annotations

import pytest
import torch

from rlhf_core.config import load_config
from rlhf_core.reward import DAPORewardManager, load_reward_manager, overlong_penalty

from tests.fixtures.reward_fixtures import CharTokenizer, make_batch

GSM = "openai/gsm8k"


@pytest.mark.parametrize("length, expected", [
    # L_max = 20, buffer 8 → no penalty up to 12 tokens, then −(L − 12)/8·factor, −factor at L_max
    (5, 0.0), (12, 0.0), (13, -0.125), (16, -0.5), (20, -1.0),
])
def test_overlong_penalty_is_linear_in_the_buffer(length, expected):
    assert overlong_penalty(length, 20, 8, 1.0) == pytest.approx(expected)
    assert overlong_penalty(length, 20, 8, 0.5) == pytest.approx(expected * 0.5)


def test_dapo_manager_through_verl_script_keys():
    # verl 0.6's examples/gmpo_trainer/test_dapo_7b_math.sh form: the manager's kwargs under reward_model.reward_kwargs
    cfg = load_config("ppo_trainer", [
        "reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.max_resp_len=10",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=True"])
    tok = CharTokenizer()
    manager = load_reward_manager(cfg, tok)
    assert isinstance(manager, DAPORewardManager)
    batch = make_batch(tok, ["Q1", "Q2", "Q3"], ["#### 7", "####   7", "#7"], ["7", "7", "7"], [GSM] * 3)
    out = manager(batch, return_dict=True)
    # valid lengths (text + EOS): 7, 9, 3. Expected length L_max − buffer = 6:
    #   row 0: score 1 (right), penalty −(7 − 6)/4·0.5 = −0.125 → 0.875 at index 6
    #   row 1: score 1 ("####   7" still parses), penalty −(9 − 6)/4·0.5 = −0.375 → 0.625 at index 8
    #   row 2: no "####" → score 0, length 3 ≤ 6 → no penalty → 0 at index 2
    expected = torch.zeros(3, 40)
    expected[0, 6], expected[1, 8] = 0.875, 0.625
    torch.testing.assert_close(out["reward_tensor"], expected)
    info = out["reward_extra_info"]
    assert info["acc"] == [1.0, 1.0, 0.0]  # a float score is reported as acc (as verl)
    assert info["overlong_reward"] == pytest.approx([-0.125, -0.375, 0.0]) and info["overlong"] == [True, True, False]


def test_dapo_without_buffer_scores_like_naive():
    cfg = load_config("ppo_trainer", ["reward_model.reward_manager=dapo"])  # verl crashes here (cfg None)
    tok = CharTokenizer()
    batch = make_batch(tok, ["Q1"], ["#### 7" * 3], ["7"], [GSM])
    dapo = load_reward_manager(cfg, tok)(batch, return_dict=True)
    naive = load_reward_manager(load_config("ppo_trainer", []), tok)(batch, return_dict=True)
    torch.testing.assert_close(dapo["reward_tensor"], naive["reward_tensor"])
    assert "overlong_reward" not in dapo["reward_extra_info"]


def test_dapo_strips_a_trailing_eos_string():
    class EosText(CharTokenizer):
        eos_token = "</s>"

    seen = []

    def score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(solution_str)
        return 0.0

    DAPORewardManager(EosText(), compute_score=score)(make_batch(EosText(), ["Q"], ["ab</s>"], ["x"], [GSM]))
    assert seen == ["ab"]


@pytest.mark.parametrize("kwargs, match", [
    ({"overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 1.0}}, "max_resp_len"),
    ({"max_resp_len": 3, "overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 1.0}}, "max_resp_len=3"),
    ({"max_resp_len": 8, "overlong_buffer_cfg": {"enable": True, "len": 0}}, "len=0"),
    ({"max_resp_len": 8, "overlong_buffer_cfg": {"enable": True, "lenght": 4}}, "lenght"),
])
def test_bad_buffer_settings_fail_when_the_manager_is_built(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DAPORewardManager(CharTokenizer(), **kwargs)


def test_dapo_recipe_spellings_reach_the_manager():
    # verl-recipe's DAPO scripts: reward_model.overlong_buffer.* (max_resp_len from data.max_response_length), and
    # verl 0.9 recipes' +reward.reward_kwargs.* (an alias of reward_model.reward_kwargs, which wins over the former)
    cfg = load_config("ppo_trainer", ["reward_model.reward_manager=dapo", "data.max_response_length=10",
                                      "reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=4",
                                      "reward_model.overlong_buffer.penalty_factor=0.5"])
    manager = load_reward_manager(cfg, CharTokenizer())
    assert (manager.max_resp_len, manager.overlong_buffer.len, manager.overlong_buffer.penalty_factor) == (10, 4, 0.5)
    cfg = load_config("ppo_trainer", ["reward_model.reward_manager=dapo", "data.max_response_length=10",
                                      "reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=4",
                                      "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
                                      "+reward.reward_kwargs.overlong_buffer_cfg.len=2",
                                      "+reward.reward_kwargs.max_resp_len=8"])
    manager = load_reward_manager(cfg, CharTokenizer())
    assert (manager.max_resp_len, manager.overlong_buffer.len, manager.overlong_buffer.penalty_factor) == (8, 2, 0.0)
