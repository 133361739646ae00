"""`rlhf ppo` refuses, before Ray starts, a dataset the default rule reward cannot score."""
import pandas as pd
import pytest
from tests.fixtures.data_fixtures import ppo_data_cfg

from rlhf_core.data import DataError
from rlhf_core.data.rl_dataset import RLHFDataset
from rlhf_core.trainer.main_ppo import check_rule_reward_inputs


def _parquet(path, reward_models):
    pd.DataFrame({
        "data_source": ["openai/gsm8k"] * len(reward_models),
        "prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(len(reward_models))],
        "reward_model": reward_models,
    }).to_parquet(path)
    return str(path)


def test_rows_without_ground_truth_are_named(tmp_path, tiny_tokenizer):
    good = RLHFDataset(_parquet(tmp_path / "good.parquet", [{"style": "rule", "ground_truth": "3"}] * 2),
                       tiny_tokenizer, ppo_data_cfg(max_prompt_length=64))
    check_rule_reward_inputs(good)  # every row has a ground truth: nothing raised
    bad = RLHFDataset(_parquet(tmp_path / "bad.parquet", [{"style": "rule", "ground_truth": "3"},
                                                          {"style": "rule", "ground_truth": None}]),
                      tiny_tokenizer, ppo_data_cfg(max_prompt_length=64))
    with pytest.raises(DataError, match=r"bad.parquet row 1: the default reward function needs reward_model.ground_truth"):
        check_rule_reward_inputs(bad)
