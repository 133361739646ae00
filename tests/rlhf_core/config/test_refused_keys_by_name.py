"""Keys whose effect needs a backend this project does not have are refused by name when set away from their
default (issue #35): the generative reward model's engines other than hf and its quantization, the parts of verl
0.9's v1 trainer loop that have no counterpart here (each naming why), and the rollout's MoE load-balance metrics.
(The judge's vLLM engine settings, engine_kwargs among them, are accepted with a no-effect notice:
tests/rlhf_core/reward/test_reward_genrm.py.)"""
from __future__ import annotations

import pytest

from rlhf_core.config import load_config


@pytest.mark.parametrize("override,reason", [
    ("reward.reward_model.rollout.name=vllm", "engines other than hf for the judge"),
    ("reward.reward_model.rollout.quantization=fp8", "weight quantization of a vLLM/SGLang judge engine"),
    ("trainer.v1.sync={x: 2}", "verl 0.9.1 defines no sync-mode setting"),
    ("trainer.v1.sampler.sampler_kwargs={k: 1}", "only to a custom sampler's constructor"),
    ("trainer.v1.sampler.custom_sampler.path=s.py", "this project has no TransferQueue"),
    ("trainer.v1.sampler.sync_refill_failed_groups=True", "no failed group to refill"),
    ("trainer.v1.separate_async.hybrid_rollout.enable_switch=True", "lends the trainer's hybrid replicas"),
    ("trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio=0.5", "read only with .*enable_switch=True"),
    ("actor_rollout_ref.rollout.moe_load_balance_metrics_interval=5", "MoE load-balance metrics"),
])
def test_refused_by_name_away_from_the_default(override, reason):
    key = override.split("=")[0]
    with pytest.raises(Exception, match=rf"{key}=.*{reason}"):
        load_config("ppo_trainer", [override])


def test_defaults_load():
    cfg = load_config("ppo_trainer", [])
    assert cfg.trainer.v1.sync == {} and cfg.actor_rollout_ref.rollout.moe_load_balance_metrics_interval == 0
