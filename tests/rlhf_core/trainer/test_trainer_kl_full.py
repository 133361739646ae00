"""``algorithm.kl_penalty: full`` in the driver: the [ref] stage's ``ref_kl_full`` is the per-token penalty."""
from __future__ import annotations

import torch

from rlhf_core.protocol import Batch
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer
from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, FakeGroup, make_config, make_dataset, reward_fn
from tests.rlhf_core.trainer.test_trainer_remax import GreedyAwareActor

KL = 0.2


class FullKLActor(GreedyAwareActor):
    def compute_ref_log_prob(self, batch):
        out = super().compute_ref_log_prob(batch)
        return Batch({**out.tensors, "ref_kl_full": torch.full(batch["responses"].shape, KL)})


def test_full_kl_penalty_uses_the_exact_kl_from_the_ref_stage(tmp_path):
    cfg = make_config(tmp_path, total_training_steps=1, val_before_train=False, test_freq=-1, save_freq=-1)
    cfg.algorithm.use_kl_in_reward = True
    cfg.algorithm.kl_penalty = "full"
    cfg.actor_rollout_ref.actor.use_kl_loss = False
    actor = FullKLActor([])
    trainer = RayPPOTrainer(cfg, DecodeTok(), lambda c: {"actor_rollout": FakeGroup(actor)}, reward_fn, reward_fn,
                            make_dataset(), make_dataset(4))
    final = trainer.fit()
    batch = Batch.concat(actor.updates)
    mask = batch["response_mask"].float()
    # fixed β = kl_coef = 0.001: rewards = scores − 0.001·0.2 on every valid token. (FakeActor's old and ref
    # log-probs are both −1 at step 1, so a penalty taken from them would be 0: the 0.2 can only be ref_kl_full.)
    assert torch.allclose(batch["token_level_rewards"], batch["token_level_scores"] - 0.001 * KL * mask)
    assert abs(final["actor/reward_kl_penalty"] - KL) < 1e-6
