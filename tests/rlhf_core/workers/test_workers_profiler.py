"""The real workers' torch profiler: which role blocks they read, which ranks record, where the trace goes."""
from __future__ import annotations

import json

import torch
from omegaconf import OmegaConf

from rlhf_core.config import load_config
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from rlhf_core.workers.profiler import WorkerProfiler, profiles_this_rank
from rlhf_core.workers.reward_model import RewardModelWorker


def _cfg(tmp_path, *overrides):
    return load_config("ppo_trainer", ["global_profiler.tool=torch", f"global_profiler.save_path={tmp_path}",
                                       "global_profiler.steps=[1]", *overrides])


def test_rollout_block_alone_enables_the_actor_rollout_worker(tmp_path):
    cfg = _cfg(tmp_path, "actor_rollout_ref.rollout.profiler.enable=True")
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout")
    assert worker.profiler_config().enable  # actor's block is off, the rollout's is on: union
    worker.start_profile(1)
    torch.randn(32, 32) @ torch.randn(32, 32)
    path = worker.stop_profile()
    assert path == str(tmp_path / "step_1" / "actor_rank_0.json")
    assert "aten::mm" in {e.get("name") for e in json.loads(open(path).read())["traceEvents"]}
    # a reference-only worker reads only the ref block (off): nothing is recorded
    ref = ActorRolloutRefWorker(cfg, role="ref")
    ref.start_profile(1)
    assert ref.stop_profile() is None


def test_critic_and_reward_model_read_their_own_blocks(tmp_path):
    cfg = _cfg(tmp_path, "critic.profiler.enable=True")
    assert CriticWorker(cfg).profiler_config().enable and not RewardModelWorker(cfg).profiler_config().enable
    critic = CriticWorker(cfg)
    critic.start_profile(4)
    assert critic.stop_profile() == str(tmp_path / "step_4" / "critic_rank_0.json")


def test_rank_selection():
    block = OmegaConf.create({"tool": "torch", "enable": True, "all_ranks": False, "ranks": [], "save_path": "x"})
    assert [profiles_this_rank(block, r) for r in range(3)] == [True, False, False]  # [] → rank 0
    block.ranks = [1, 2]
    assert [profiles_this_rank(block, r) for r in range(3)] == [False, True, True]
    block.all_ranks = True
    assert all(profiles_this_rank(block, r) for r in range(3))
    block.tool = None  # global_profiler.tool unset: nothing, whatever the block says
    assert not profiles_this_rank(block, 0) and not WorkerProfiler(block, 0, "actor").active
