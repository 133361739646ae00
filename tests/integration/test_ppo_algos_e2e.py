"""verl 0.6's extra algorithms in a real tiny PPO run (``run_ppo``: Ray worker groups, FSDP2 on gloo, HF rollout).

One run combines keys that change different stages: ``adv_estimator=grpo_passk`` with ``critic.enable=True`` (a
critic is trained although the estimator needs none), ``policy_loss.loss_mode=kl_cov`` and the ``dapo`` reward
manager with an overlong buffer (every response longer than 4 of the 8 tokens loses score). A second run uses GAE
with PF-PPO and ``loss_mode=gspo``.
"""
from __future__ import annotations

import json

import pytest
import torch

from rlhf_core.trainer.tracking import read_metrics_jsonl

from test_ppo_e2e import gsm8k_parquet, ppo_config  # noqa: F401  (gsm8k_parquet is a fixture)

pytestmark = pytest.mark.ray  # starts Ray: calls run_ppo

PL = "actor_rollout_ref.actor.policy_loss."
DAPO = ["reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.max_resp_len=8",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=True"]
COMMON = ["trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false"]


@pytest.mark.slow
def test_passk_with_critic_kl_cov_and_dapo(tiny_model_dir, gsm8k_parquet, tmp_path, monkeypatch):  # noqa: F811
    from rlhf_core.trainer.main_ppo import run_ppo

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    out = tmp_path / "passk"
    cfg = ppo_config(tiny_model_dir, gsm8k_parquet, out, "grpo_passk", *COMMON, *DAPO, "critic.enable=True",
                     f"{PL}loss_mode=kl_cov", f"{PL}kl_cov_ratio=0.2", f"{PL}ppo_kl_coef=1.0")
    assert run_ppo(cfg)["global_step"] == 2
    m = read_metrics_jsonl(str(out / "metrics.jsonl"))
    for step in (1, 2):
        assert {"critic/vf_loss", "critic/values/mean", "timing_s/update_critic"} <= set(m[step])  # critic.enable
        # the length reward is in [0, 1]; the overlong penalty −(L − 4)/4 brings a long response below 0
        assert m[step]["critic/score/min"] < 0
        # grpo_passk: per group of 2 only the best response has A ≠ 0 → at most half the rows are non-zero, and the
        # non-zero values are positive (r_max − r_2nd ≥ 0)
        assert m[step]["critic/advantages/min"] >= 0
        assert all(torch.isfinite(torch.tensor(v)) for v in m[step].values())


@pytest.mark.slow
def test_gae_with_pf_ppo_and_gspo(tiny_model_dir, gsm8k_parquet, tmp_path, monkeypatch):  # noqa: F811
    from rlhf_core.trainer.main_ppo import run_ppo

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    out = tmp_path / "pf"
    cfg = ppo_config(tiny_model_dir, gsm8k_parquet, out, "gae", *COMMON, "algorithm.use_pf_ppo=True",
                     "algorithm.pf_ppo.reweight_method=max_min", f"{PL}loss_mode=gspo",
                     f"trainer.rollout_data_dir={out}/rollouts")
    assert run_ppo(cfg)["global_step"] == 2
    m = read_metrics_jsonl(str(out / "metrics.jsonl"))
    for step in (1, 2):
        assert {"critic/vf_loss", "actor/pg_loss"} <= set(m[step])
        assert all(torch.isfinite(torch.tensor(v)) for v in m[step].values())
        # the rollout dump is written after the advantage stage, i.e. after resampling: max_min draws only rows whose
        # score is the batch's max or min, so at most two distinct scores remain among the 4 rows
        rows = [json.loads(line) for line in open(out / "rollouts" / f"{step}.jsonl")]
        assert len(rows) == 4 and len({r["score"] for r in rows}) <= 2
