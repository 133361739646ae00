"""critic.enable, algorithm.use_pf_ppo / pf_ppo.* and the new adv_estimator values through the PPO driver (fake
deterministic worker groups from test_trainer_ppo) and the worker-group factory."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from rlhf_core.algos import get_adv_estimator
from rlhf_core.config import load_config
from rlhf_core.config.errors import ConfigError
from rlhf_core.config.validate import use_critic
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer

from tests.fixtures.config_fixtures import typed_config
from tests.rlhf_core.trainer.test_trainer_ppo import (
    DecodeTok, FakeActor, FakeCritic, FakeGroup, make_config, make_dataset, reward_fn)


class RecordingActor(FakeActor):
    """Keeps every batch handed to update_actor."""

    def __init__(self, log):
        super().__init__(log)
        self.updates = []

    def update_actor(self, batch):
        self.updates.append(batch)
        return super().update_actor(batch)


def run(cfg, steps=2):
    cfg.trainer.update({"total_training_steps": steps, "val_before_train": False, "test_freq": -1, "save_freq": -1})
    log = []
    actor, critic = RecordingActor(log), FakeCritic(log)

    def factory(config):
        groups = {"actor_rollout": FakeGroup(actor, world_size=1)}
        if use_critic(config):
            groups["critic"] = FakeGroup(critic, world_size=1)
        return groups

    trainer = RayPPOTrainer(cfg, DecodeTok(), factory, reward_fn, None, make_dataset(), None)
    final = trainer.fit()
    trainer.shutdown()
    return trainer, final, actor, [c[0] for c in log]


# ---- critic.enable ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("estimator, enable, has_critic", [
    ("grpo", None, False), ("grpo", True, True), ("gae", None, True), ("gae", True, True), ("rloo", False, False),
])
def test_critic_enable_decides_whether_a_critic_runs(tmp_path, estimator, enable, has_critic):
    cfg = make_config(tmp_path)
    cfg.algorithm.adv_estimator = estimator
    cfg.critic.enable = enable
    trainer, final, _, stages = run(cfg)
    assert trainer.use_critic is has_critic
    assert ("values" in stages) is has_critic and ("update_critic" in stages) is has_critic
    assert ("critic/vf_loss" in final) is has_critic


def test_critic_enable_false_with_gae_is_a_config_error():
    with pytest.raises(ConfigError, match="adv_estimator=gae needs critic values, but critic.enable=False"):
        load_config("ppo_trainer", ["critic.enable=False"])
    assert use_critic(load_config("ppo_trainer", ["algorithm.adv_estimator=grpo", "critic.enable=True"]))
    assert not use_critic(load_config("ppo_trainer", ["algorithm.adv_estimator=grpo"]))


def test_critic_enable_builds_the_critic_worker_group(monkeypatch):
    from rlhf_core.trainer import main_ppo

    built = []

    class Group:
        def __init__(self, cls, world, kwargs, **kw):
            built.append(kw["name_prefix"])

    monkeypatch.setattr(main_ppo, "RayWorkerGroup", Group)
    monkeypatch.setattr(main_ppo, "worker_resources", lambda config, n: (0.5, 0.0))
    monkeypatch.setattr(main_ppo, "worker_threads", lambda config, cpu_threads: 1)
    cfg = typed_config("ppo_trainer", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=False",
                       "critic.enable=True", "trainer.nnodes=1", "trainer.n_gpus_per_node=1")
    assert set(main_ppo.build_worker_groups(cfg)) == {"actor_rollout", "critic"}
    cfg.critic.enable = None
    assert set(main_ppo.build_worker_groups(cfg)) == {"actor_rollout"}


# ---- PF-PPO ----------------------------------------------------------------------------------------------------
def test_pf_ppo_resamples_the_update_batch_towards_high_scores(tmp_path):
    def scores_of(batch):
        return batch["token_level_scores"].sum(-1)

    cfg = make_config(tmp_path / "off")
    cfg.algorithm.adv_estimator = "gae"
    _, _, plain, _ = run(cfg, steps=4)
    cfg = make_config(tmp_path / "on")
    cfg.algorithm.adv_estimator = "gae"
    cfg.algorithm.use_pf_ppo = True  # pow with weight_pow 2: a score-0 row has weight 1e-8, a score-1 row 1
    _, _, filtered, _ = run(cfg, steps=4)
    mixed = [b for b in plain.updates if 0 < float(scores_of(b).sum()) < len(b)]
    assert mixed, "the fake rollout should give some batches with both scores"
    assert any(float(scores_of(b).max()) > 0 for b in filtered.updates)
    for b in filtered.updates:
        s = scores_of(b)
        assert len(b) == 4 and len(b.meta["global_token_num"]) == 4
        if float(s.max()) > 0:
            assert torch.all(s == 1.0), s  # only score-1 rows are drawn
        # rows move whole: each row's score still sits on its own last valid token, its token count follows it
        last = b["response_mask"].sum(-1) - 1
        assert torch.equal(b["token_level_scores"][torch.arange(4), last], s)
        assert b.meta["global_token_num"] == b["attention_mask"].sum(-1).tolist()


def test_pf_ppo_max_random_keeps_low_scores_drawable(tmp_path):
    cfg = make_config(tmp_path)
    cfg.algorithm.update({"adv_estimator": "gae", "use_pf_ppo": True})
    cfg.algorithm.pf_ppo.reweight_method = "max_random"  # 0.4 for max rows, 0.1 others: both kinds appear
    _, _, actor, _ = run(cfg, steps=8)
    scores = torch.cat([b["token_level_scores"].sum(-1) for b in actor.updates])
    assert set(scores.tolist()) == {0.0, 1.0}


def test_pf_ppo_without_gae_changes_nothing_and_says_so(tmp_path, caplog):
    cfg = make_config(tmp_path / "a")
    _, _, plain, _ = run(cfg)
    cfg = make_config(tmp_path / "b")
    cfg.algorithm.use_pf_ppo = True
    with caplog.at_level(logging.WARNING, logger="rlhf_core.trainer.ppo_trainer"):
        trainer, _, pf, _ = run(cfg)
    assert not trainer.use_pf_ppo
    assert any("use_pf_ppo=True has no effect with adv_estimator=grpo" in r.message for r in caplog.records)
    assert len(plain.updates) == len(pf.updates) == 2
    for a, b in zip(plain.updates, pf.updates):
        assert torch.equal(a["advantages"], b["advantages"])
        assert torch.equal(a["token_level_scores"], b["token_level_scores"])


# ---- adv_estimator: opo, grpo_passk, gpg -----------------------------------------------------------------------
def test_new_estimators_feed_the_actor_update(tmp_path):
    seen = {}
    for name in ("grpo", "opo", "grpo_passk", "gpg"):
        cfg = make_config(tmp_path / name)
        cfg.algorithm.adv_estimator = name
        _, _, actor, _ = run(cfg)
        b = actor.updates[0]
        want, _ = get_adv_estimator(name)(token_level_rewards=b["token_level_rewards"],
                                          response_mask=b["response_mask"], index=b["uid"], epsilon=1e-6,
                                          norm_adv_by_std_in_grpo=True)
        torch.testing.assert_close(b["advantages"], want)
        seen[name] = b["advantages"]
    # same rollout (deterministic fake), different estimators → different advantages
    names = list(seen)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not torch.allclose(seen[a], seen[b]), (a, b)
    assert np.isfinite(torch.cat(list(seen.values())).numpy()).all()
