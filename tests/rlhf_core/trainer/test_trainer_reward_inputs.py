"""`rlhf ppo` refuses, before Ray starts, a dataset the default rule reward cannot score."""
import pandas as pd
import pytest
from tests.fixtures.data_fixtures import ppo_data_cfg

from rlhf_core.data import DataError
from rlhf_core.data.rl_dataset import RLHFDataset
from rlhf_core.trainer.main_ppo import check_rule_reward_inputs


def _parquet(path, reward_models, sources=None):
    pd.DataFrame({
        "data_source": sources or ["openai/gsm8k"] * len(reward_models),
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


def test_a_data_source_without_a_default_scorer_is_named(tmp_path, tiny_tokenizer):
    # before, the run started Ray, loaded the models and failed at the first reward with a traceback
    truth = [{"style": "rule", "ground_truth": "3"}] * 3
    mine = RLHFDataset(_parquet(tmp_path / "mine.parquet", truth, ["countdown", "openai/gsm8k", "my_add"]),
                       tiny_tokenizer, ppo_data_cfg(max_prompt_length=64))
    with pytest.raises(DataError, match=r"mine.parquet row 2: no default reward function for data_source='my_add'; "
                                        r"known data sources: \['openai/gsm8k'"):
        check_rule_reward_inputs(mine)
    code = RLHFDataset(_parquet(tmp_path / "code.parquet", truth[:1], ["taco"]), tiny_tokenizer,
                       ppo_data_cfg(max_prompt_length=64))
    with pytest.raises(DataError, match=r"code.parquet row 0: data_source='taco' .* set reward_model.sandbox_fusion.url"):
        check_rule_reward_inputs(code)
    check_rule_reward_inputs(code, has_sandbox=True)  # a sandbox url is set: the code source is scored there
    # data.reward_fn_key names the column the scorer is chosen by: here `src`, which the default scorer knows
    path = tmp_path / "keyed.parquet"
    pd.read_parquet(_parquet(path, truth[:1], ["my_add"])).assign(src="openai/gsm8k").to_parquet(path)
    keyed = RLHFDataset(str(path), tiny_tokenizer, ppo_data_cfg(max_prompt_length=64))
    check_rule_reward_inputs(keyed, reward_fn_key="src")
    with pytest.raises(DataError, match="data_source='my_add'"):
        check_rule_reward_inputs(keyed)
