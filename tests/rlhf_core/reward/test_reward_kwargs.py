"""custom_reward_function.reward_kwargs reach the default scorer too (e.g. GSM8K's format_score)."""
import pickle

from rlhf_core.reward.custom import reward_function_from_config
from rlhf_core.reward.scorers import default_compute_score

from tests.fixtures.config_fixtures import typed_config


def test_reward_kwargs_configure_the_default_gsm8k_scorer():
    cfg = typed_config("ppo_trainer", "custom_reward_function.reward_kwargs={format_score: 0.1}")
    fn = reward_function_from_config(cfg)
    # "#### 5" is extracted but wrong → format_score 0.1; "#### 6" is right → 1.0; no marker → 0.0 (strict)
    assert fn("openai/gsm8k", "so #### 5", "6") == 0.1
    assert fn("openai/gsm8k", "so #### 6", "6") == 1.0
    assert fn("openai/gsm8k", "the answer is 5", "6") == 0.0
    # travels to prime's worker processes
    assert pickle.loads(pickle.dumps(fn))("openai/gsm8k", "#### 5", "6") == 0.1


def test_without_reward_kwargs_the_default_is_verls():
    cfg = typed_config("ppo_trainer")  # path null, reward_kwargs {} (the YAML's defaults)
    assert reward_function_from_config(cfg) is default_compute_score
    assert default_compute_score("openai/gsm8k", "#### 5", "6") == 0.0  # verl's format_score = 0.0
