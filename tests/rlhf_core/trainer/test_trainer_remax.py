"""``adv_estimator: remax``: a [gen_max] stage scores one greedy response per prompt as ``reward_baselines``."""
from __future__ import annotations

import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer
from tests.rlhf_core.trainer.test_trainer_ppo import (
    T, DecodeTok, FakeActor, FakeGroup, make_config, make_dataset, reward_fn)


class GreedyAwareActor(FakeActor):
    """Sampled generation as ``FakeActor``; a greedy call (``meta["do_sample"] is False``) answers every prompt
    with its own last prompt token, repeated: reward_fn then scores it 1 when that token is even."""

    def __init__(self, log):
        super().__init__(log)
        self.greedy_calls: list[int] = []
        self.updates: list[Batch] = []

    def generate_sequences(self, batch: Batch) -> Batch:
        if batch.meta.get("do_sample", True) is not False:
            return super().generate_sequences(batch)
        self.greedy_calls.append(len(batch))
        out = super().generate_sequences(batch)
        responses = batch["input_ids"][:, -1:].expand(-1, T).clone()
        mask = torch.ones_like(responses)
        return Batch({**out.tensors, "responses": responses, "response_mask": mask,
                      "input_ids": torch.cat([batch["input_ids"], responses], 1),
                      "attention_mask": torch.cat([batch["attention_mask"], mask], 1)})

    def update_actor(self, batch):
        self.updates.append(batch)
        return super().update_actor(batch)


def _run(cfg):
    actor = GreedyAwareActor([])
    trainer = RayPPOTrainer(cfg, DecodeTok(), lambda c: {"actor_rollout": FakeGroup(actor)}, reward_fn, reward_fn,
                            make_dataset(), make_dataset(4))
    final = trainer.fit()
    trainer.shutdown()
    return final, actor


def test_remax_baseline_is_the_greedy_score_per_prompt(tmp_path):
    cfg = make_config(tmp_path, total_training_steps=2, val_before_train=False, test_freq=-1, save_freq=-1,
                      balance_batch=True)  # balancing reorders rows: baselines must follow their prompt's uid
    cfg.algorithm.adv_estimator = "remax"
    cfg.actor_rollout_ref.actor.use_kl_loss = False
    final, actor = _run(cfg)
    # 2 prompts per step, world size 2: one greedy row per shard, i.e. once per prompt (not per sample)
    assert actor.greedy_calls == [1, 1, 1, 1]
    assert "timing_s/gen_max" in final
    for batch in actor.updates:
        # greedy answer = the prompt's last token repeated → reward_fn's score = 1 iff that token is even
        expected_b = (batch["prompts"][:, -1] % 2 == 0).float()
        assert torch.equal(batch["reward_baselines"], expected_b)
        # ReMax: G_t = Σ_{t'≥t} r_t' = s on every valid token (the score sits on the last one), A_t = s − b
        s = batch["token_level_rewards"].sum(-1)
        mask = batch["response_mask"].float()
        assert torch.allclose(batch["advantages"], (s - expected_b)[:, None] * mask)
        assert torch.allclose(batch["returns"], s[:, None] * mask)
    # the two samples of a prompt share its baseline, wherever balancing put them
    b = Batch.concat(actor.updates[:2])  # step 1's two shards
    for u in set(b["uid"]):
        rows = [i for i, x in enumerate(b["uid"]) if x == u]
        assert len(rows) == 2 and b["reward_baselines"][rows[0]] == b["reward_baselines"][rows[1]]
    # hand check that both baselines occur over the run (even and odd last prompt tokens), so A ≠ s somewhere
    assert {0.0, 1.0} <= {float(x) for u in actor.updates for x in u["reward_baselines"]}


def test_other_estimators_skip_the_greedy_stage(tmp_path):
    cfg = make_config(tmp_path, total_training_steps=1, val_before_train=False, test_freq=-1, save_freq=-1)
    final, actor = _run(cfg)
    assert actor.greedy_calls == [] and "timing_s/gen_max" not in final
    assert "reward_baselines" not in actor.updates[0]


def test_remax_without_baselines_fails_clearly():
    from rlhf_core.algos.advantages import get_adv_estimator

    with pytest.raises(ValueError, match="reward_baselines"):
        get_adv_estimator("remax")(token_level_rewards=torch.zeros(1, 2), response_mask=torch.ones(1, 2))
