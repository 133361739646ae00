"""gdpo and optimal_token_baseline through the PPO driver (fake deterministic worker groups from test_trainer_ppo):
the [adv] stage hands them the reward components and the actor's sum_pi_squared
(rlhf_core/trainer/advantage_stage.py)."""
from __future__ import annotations

import pytest
import torch

from rlhf_core.algos import get_adv_estimator
from rlhf_core.protocol import Batch
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer

from tests.rlhf_core.trainer.test_trainer_ppo import (
    DecodeTok, FakeActor, FakeGroup, make_config, make_dataset, reward_fn)


class SumPiActor(FakeActor):
    """Also returns sum_pi_squared (a different value per row and token) and keeps every update batch."""

    def __init__(self, log, with_sum_pi=True):
        super().__init__(log)
        self.updates, self.with_sum_pi = [], with_sum_pi

    def compute_log_prob(self, batch):
        out = super().compute_log_prob(batch)
        if self.with_sum_pi:
            b, t = batch["responses"].shape
            out.tensors["sum_pi_squared"] = 0.2 + 0.05 * torch.arange(b * t, dtype=torch.float32).reshape(b, t) % 0.6
        return out

    def update_actor(self, batch):
        self.updates.append(batch)
        return super().update_actor(batch)


def components_fn(batch, return_dict=False):
    """reward_fn's score, plus two components per sample: format (an odd response length) and acc (reward_fn's)."""
    out = reward_fn(batch, return_dict=True)
    fmt = (batch["response_mask"].sum(-1) % 2).float().tolist()
    return {**out, "reward_extra_info": {"acc": out["reward_extra_info"]["acc"], "format": fmt}}


def run(cfg, actor, reward=reward_fn):
    cfg.trainer.update({"total_training_steps": 1, "val_before_train": False, "test_freq": -1, "save_freq": -1})
    trainer = RayPPOTrainer(cfg, DecodeTok(), lambda config: {"actor_rollout": FakeGroup(actor, world_size=1)},
                            reward, None, make_dataset(), None)
    try:
        return trainer.fit()
    finally:
        trainer.shutdown()


def test_optimal_token_baseline_reads_the_actors_sum_pi_squared(tmp_path):
    cfg = make_config(tmp_path)
    cfg.algorithm.adv_estimator = "optimal_token_baseline"
    actor = SumPiActor([])
    run(cfg, actor)
    b = actor.updates[0]
    want, ret = get_adv_estimator("optimal_token_baseline")(
        token_level_rewards=b["token_level_rewards"], response_mask=b["response_mask"], index=b["uid"],
        old_log_probs=b["old_log_probs"], sum_pi_squared=b["sum_pi_squared"])
    torch.testing.assert_close(b["advantages"], want)
    torch.testing.assert_close(b["returns"], ret)
    # the value of sum_pi_squared matters: with another one the advantages differ
    other, _ = get_adv_estimator("optimal_token_baseline")(
        token_level_rewards=b["token_level_rewards"], response_mask=b["response_mask"], index=b["uid"],
        old_log_probs=b["old_log_probs"], sum_pi_squared=torch.full_like(b["sum_pi_squared"], 0.5))
    assert not torch.allclose(other, want)


def test_optimal_token_baseline_without_sum_pi_squared_names_the_key(tmp_path):
    cfg = make_config(tmp_path)
    cfg.algorithm.adv_estimator = "tir_optimal_token_baseline"
    with pytest.raises(ValueError, match="needs 'sum_pi_squared'"):
        run(cfg, SumPiActor([], with_sum_pi=False))


def test_gdpo_reads_the_reward_components_and_logs_them(tmp_path):
    cfg = make_config(tmp_path)
    cfg.algorithm.update({"adv_estimator": "gdpo", "gdpo_reward_keys": ["format", "acc"],
                          "gdpo_reward_weights": [1.0, 2.0]})
    cfg.actor_rollout_ref.rollout.n = 4  # groups of 4: the components' normalised sum is not the score's
    actor = SumPiActor([])
    final = run(cfg, actor, components_fn)
    b = actor.updates[0]
    comps = {k: torch.tensor([float(x) for x in b[k]]) for k in ("format", "acc")}
    want, _ = get_adv_estimator("gdpo")(token_level_rewards=b["token_level_rewards"], response_mask=b["response_mask"],
                                        index=b["uid"], reward_components=comps, reward_weights=[1.0, 2.0])
    torch.testing.assert_close(b["advantages"], want)
    summed, _ = get_adv_estimator("gdpo")(token_level_rewards=b["token_level_rewards"],
                                          response_mask=b["response_mask"], index=b["uid"])
    assert not torch.allclose(summed, want)  # the components, not the summed score, were used
    assert final["gdpo/format/mean"] == pytest.approx(float(comps["format"].mean()))
    assert final["gdpo/acc/max"] == pytest.approx(float(comps["acc"].max()))
    with pytest.raises(ValueError, match="'style' is not in the reward extra info"):
        cfg.algorithm.gdpo_reward_keys = ["style"]
        cfg.algorithm.gdpo_reward_weights = None
        run(cfg, SumPiActor([]), components_fn)
