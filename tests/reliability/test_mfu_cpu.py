"""``perf/mfu/actor`` on CPU is a real fraction, never a false 0 (issue 32, "numbers at the edges").

Before the fix the peak came only from a table of CUDA device names, so on CPU the metric was 0.000. Now every actor
rank reports its peak once (``peak_flops``): on CPU a short large-GEMM timing in the actor's compute dtype at the
rank's thread count (``rlhf_core.trainer.mfu.cpu_peak_flops``). An unknown peak leaves the metric out.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, make_dataset, reward_fn  # noqa: E402

from rlhf_core.config import load_config  # noqa: E402
from rlhf_core.trainer.mfu import (actor_mfu, cpu_peak_flops, estimate_mfu, forward_flops,  # noqa: E402
                                  gemm_flops_per_s, training_flops)
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer  # noqa: E402


def test_cpu_peak_is_measured_once_within_budget_and_leaves_threads_and_rng_alone():
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    # a (dtype, threads) pair nobody measured before in this process: the timing really runs
    start = time.perf_counter()
    peak = cpu_peak_flops(torch.float32, threads=3)
    took = time.perf_counter() - start
    assert peak is not None and math.isfinite(peak) and 1e8 < peak < 1e15  # 0.1 GFLOP/s .. 1 PFLOP/s
    assert took < 1.0  # budget 0.2 s (0.1 s at 3 threads + 0.1 s per core); slack for a loaded machine
    start = time.perf_counter()
    assert cpu_peak_flops(torch.float32, threads=3) == peak  # cached: the same number, no second timing
    assert time.perf_counter() - start < 0.01
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng)
    # the peak at 3 threads is at least 3 × the single-core rate (one core's CPU-time rate, ideal scaling)
    assert peak >= 3 * 0.5 * gemm_flops_per_s(torch.float32, 1, 0.05, clock=time.thread_time)


def test_flops_match_a_hand_count_by_verls_qwen2_formula():
    # verl's _estimate_qwen2_flops (verl/utils/flops_counter.py), counted by hand for a config whose head_dim (16)
    # is not hidden/heads (8), so a formula using hidden_size for the attention would differ:
    #   attention projections per layer: 32 · (q 4·16 + k 2·16 + v 2·16 + o 4·16) = 32 · 192 = 6 144
    #   SwiGLU MLP per layer: 3 · 32 · 48 = 4 608 → 3 layers · 10 752 = 32 256
    #   embedding + LM head: 2 · 100 · 32 = 6 400 → N = 38 656
    #   dense: 6 · N · (5 + 7 tokens) = 2 783 232; attention: 6 · Σs² (25 + 49) · 16 · 4 · 3 layers = 85 248
    cfg = type("Cfg", (), dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=16, intermediate_size=48, vocab_size=100))()
    assert training_flops(cfg, [5, 7], passes=1) == 2_783_232 + 85_248
    assert training_flops(cfg, [5, 7], passes=2) == 2 * 2_868_480  # ppo_epochs = 2: two passes
    assert forward_flops(cfg, [5, 7]) == 2_868_480 / 3  # a log-prob pass: forward only, 2·N per token
    # MFU = FLOPs / (seconds · peak): 2 868 480 FLOPs in 1 ms on a 1e10 FLOP/s peak → 0.286848
    assert estimate_mfu(cfg, [5, 7], 1e-3, 1e10, 1) == pytest.approx(0.286848)


def test_an_unknown_peak_leaves_mfu_out():
    cfg = type("Cfg", (), dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               intermediate_size=128, vocab_size=1000))()
    assert actor_mfu(cfg, [10], 1.0, [None], 1) is None  # one rank without a known peak
    assert actor_mfu(cfg, [10], 1.0, [], 1) is None  # workers without peak_flops
    assert actor_mfu(None, [10], 1.0, [1e9], 1) is None  # model config unreadable
    # two ranks of 1e9 FLOP/s: FLOPs / (seconds × 2e9)
    assert actor_mfu(cfg, [10], 1.0, [1e9, 1e9], 1) == pytest.approx(estimate_mfu(cfg, [10], 1.0, 2e9, 1))


def _real_config(model_dir: str, tmp_path: Path):
    """The tiny model through the real FSDP2 actor: 2 prompts × 2 responses, one mini-batch, one step."""
    return load_config("ppo_trainer", [
        f"actor_rollout_ref.model.path={model_dir}", "trainer.n_gpus_per_node=1", "data.train_batch_size=2",
        "data.max_prompt_length=8", "data.max_response_length=6", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=False", "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        "trainer.total_training_steps=1", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.logger=[file]", "trainer.balance_batch=False",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}", f"trainer.validation_data_dir={tmp_path / 'val'}"])


def test_a_real_tiny_actor_update_on_cpu_reports_mfu_between_0_and_1(tiny_model_dir, tmp_path):
    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = _real_config(tiny_model_dir, tmp_path)
    groups = {}

    def factory(config):
        groups["actor_rollout"] = LocalWorkerGroup(ActorRolloutRefWorker, {"config": config, "role": "actor_rollout"})
        groups["actor_rollout"].execute_all("init_model")
        return dict(groups)

    trainer = RayPPOTrainer(cfg, DecodeTok(), factory, reward_fn, None, make_dataset(2), None)
    try:
        metrics = trainer.fit()
        (peak,) = groups["actor_rollout"].execute_all("peak_flops")  # the rank's cached, measured fp32 peak
    finally:
        trainer.shutdown()
    mfu = metrics["perf/mfu/actor"]
    assert peak is not None and peak > 0
    # a positive fraction: before the fix this was exactly 0.0 on CPU. The tiny model's matmuls are far smaller
    # than the peak's GEMM, so the fraction is small (under 1 with a wide margin), never above 1
    assert 0.0 < mfu < 1.0, (mfu, peak)


@pytest.mark.parametrize("param_dtype, want", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_a_rank_measures_its_peak_in_the_actors_compute_dtype(param_dtype, want, monkeypatch):
    from types import SimpleNamespace

    import rlhf_core.workers.fsdp_workers as fw

    asked = []
    monkeypatch.setattr(fw, "rank_peak_flops", lambda dtype: asked.append(dtype) or 1e9)
    cfg = load_config("ppo_trainer", [f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={param_dtype}"])
    worker = SimpleNamespace(actor=object(), role="actor", arr=cfg.actor_rollout_ref)
    assert fw.ActorRolloutRefWorker.peak_flops(worker) == 1e9 and asked == [want]
    # and the CPU can be timed in that dtype
    assert cpu_peak_flops(want) > 0
