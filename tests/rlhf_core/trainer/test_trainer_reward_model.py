"""``reward_model.enable``: the driver adds the RM group's ``rm_scores`` before the reward manager (training,
validation and the ReMax greedy baseline), and ``build_worker_groups`` builds that group."""
from __future__ import annotations

import os

import pandas as pd
import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.reward.managers import NaiveRewardManager
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer
from tests.fixtures.config_fixtures import typed_config
from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, FakeGroup, make_config, make_dataset
from tests.rlhf_core.trainer.test_trainer_remax import GreedyAwareActor

PER_TOKEN = 0.1


class FakeRM:
    """rm_scores = 0.1 × (valid response length) on the last valid response token."""

    def __init__(self):
        self.calls: list[int] = []

    def compute_rm_score(self, batch: Batch) -> Batch:
        self.calls.append(len(batch))
        mask = batch["response_mask"]
        n = mask.sum(-1)
        scores = torch.zeros(mask.shape)
        scores[torch.arange(len(batch)), (n - 1).clamp(min=0)] = PER_TOKEN * n.float()
        return Batch({"rm_scores": scores})


def _never(*args, **kwargs):
    raise AssertionError("the rule scorer must not run when rm_scores are present")


def _run(cfg, rm):
    actor = GreedyAwareActor([])
    manager = NaiveRewardManager(DecodeTok(), compute_score=_never)
    groups = {"actor_rollout": FakeGroup(actor), "rm": FakeGroup(rm)}
    trainer = RayPPOTrainer(cfg, DecodeTok(), lambda c: groups, manager, manager, make_dataset(), make_dataset(4))
    final = trainer.fit()
    trainer.shutdown()
    return final, actor


def test_rm_scores_feed_training_validation_and_the_remax_baseline(tmp_path):
    cfg = make_config(tmp_path, total_training_steps=1, save_freq=-1, test_freq=1)
    cfg.algorithm.adv_estimator = "remax"
    cfg.actor_rollout_ref.actor.use_kl_loss = False
    rm = FakeRM()
    final, actor = _run(cfg, rm)
    # val before train (4 prompts × val n 2 = 8 rows, 2 shards), greedy (2 prompts), train (4 rows), val again
    assert rm.calls == [4, 4, 1, 1, 2, 2, 4, 4]
    batch = Batch.concat(actor.updates)  # the two shards of the one update
    n = batch["response_mask"].sum(-1).float()
    assert torch.allclose(batch["token_level_scores"].sum(-1), PER_TOKEN * n)
    # greedy answers are T = 3 tokens long → baseline 0.3 from the RM, not from the (never called) rule scorer
    assert torch.allclose(batch["reward_baselines"], torch.full((4,), 3 * PER_TOKEN))
    assert torch.allclose(batch["advantages"].sum(-1), (PER_TOKEN * n - 3 * PER_TOKEN) * n, atol=1e-6)
    val = pd.read_parquet(os.path.join(cfg.trainer.validation_data_dir, "val_step_1.parquet"))
    lengths = val["response"].str.split().str.len()  # DecodeTok joins ids with spaces
    assert val["score"].tolist() == pytest.approx((PER_TOKEN * lengths).tolist())


def test_build_worker_groups_adds_the_rm_group(monkeypatch):
    from rlhf_core.trainer import main_ppo
    from rlhf_core.workers.reward_model import RewardModelWorker

    built, shares = [], []

    class RecordingGroup:
        def __init__(self, cls, world, kwargs, **resources):
            built.append((cls, world, resources["name_prefix"]))

    def resources(config, n_groups):
        shares.append(n_groups)
        return 1.0 / n_groups, 0.0

    monkeypatch.setattr(main_ppo, "RayWorkerGroup", RecordingGroup)
    monkeypatch.setattr(main_ppo, "worker_resources", resources)
    monkeypatch.setattr(main_ppo, "worker_threads", lambda config, cpu_threads: 1)
    cfg = typed_config("ppo_trainer", "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=False",
                       "actor_rollout_ref.actor.use_kl_loss=False", "trainer.nnodes=1", "trainer.n_gpus_per_node=2",
                       "reward_model.enable=True")
    wgs = main_ppo.build_worker_groups(cfg)
    assert set(wgs) == {"actor_rollout", "critic", "rm"} and shares == [3]  # three groups share each device
    assert (RewardModelWorker, 2, "rm") in built
    cfg.reward_model.enable = False
    assert "rm" not in main_ppo.build_worker_groups(cfg) and shares[-1] == 2
    # a generative reward model (enable + a custom function + an engine name) is served to the function instead
    cfg.reward_model.enable, cfg.custom_reward_function.path = True, "judge_fn.py"
    cfg.reward.reward_model.rollout.name = "hf"
    assert "rm" not in main_ppo.build_worker_groups(cfg) and shares[-1] == 2
