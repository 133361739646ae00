"""policy_loss.loss_mode and its scalars reach the real FSDP actor update (tiny model, one process).

Each run starts from the same weights, so the update's current log-probs equal the batch's log-probs ``lp``; the
batch's ``old_log_probs`` are set to ``lp − δ`` with a known δ so ratios differ from 1. The worker's ``actor/pg_loss``
must then equal the registered loss function evaluated on (lp − δ, lp, A) — and differ between modes and settings.
"""
from __future__ import annotations

import pytest
import torch

from rlhf_core.distributed import LocalWorkerGroup
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

from tests.rlhf_core.algos.test_algos_policy_loss_modes import call_loss
from tests.rlhf_core.workers.test_workers_fsdp import _update_with, ppo_config, training_batch

PL = "actor_rollout_ref.actor.policy_loss."
ONE_MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"  # covariance selection over the whole batch


@pytest.fixture(scope="module")
def shifted_batch(tiny_model_dir):
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, ONE_MICRO),
                                                  "role": "actor_rollout"})
    wg.execute_all("init_model")
    batch = training_batch(wg, seed=11)
    lp = batch["old_log_probs"].clone()
    delta = 0.3 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(2))
    batch.tensors["old_log_probs"] = lp - delta
    return batch, lp


def expected_loss(batch, lp, mode, **over):
    # call_loss's SCALARS are the shipped defaults of ppo_config (clip 0.2, c 3.0, the policy_loss block's values)
    loss, _ = call_loss(mode, batch["old_log_probs"], lp, batch["advantages"], batch["response_mask"].float(),
                        "token-mean", **over)
    return loss.item()


CASES = [
    ("vanilla", {}),
    ("gspo", {}),
    ("gpg", {}),
    ("geo_mean", {}),
    # every token with 0 < Cov < 100 that the ratio clip left alone is detached: a deterministic selection
    ("clip_cov", {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.0, "clip_cov_ub": 100.0}),
    ("kl_cov", {"kl_cov_ratio": 0.25, "ppo_kl_coef": 0.1}),
    ("kl_cov", {"kl_cov_ratio": 0.25, "ppo_kl_coef": 2.0}),
    ("kl_cov", {"kl_cov_ratio": 1.0, "ppo_kl_coef": 2.0}),
    # verl 0.9 losses, each with the key it adds or reads differently (actor.tau_pos, policy_loss.dro_beta,
    # actor.clip_ratio_c as dppo's truncation bound); the other new modes read only the clip ratios, as vanilla
    ("sapo", {"tau_pos": 2.0}),
    ("dro", {"dro_beta": 0.5}),
    ("dppo_kl", {"clip_ratio_c": 1.1}),
]
ACTOR_KEYS = ("tau_pos", "clip_ratio_c")  # under actor_rollout_ref.actor, not its policy_loss


def test_each_loss_mode_and_its_scalars_change_the_actor_loss(shifted_batch, tiny_model_dir):
    batch, lp = shifted_batch
    seen = []
    for mode, over in CASES:
        overrides = [ONE_MICRO, f"{PL}loss_mode={mode}"] + [
            f"{'actor_rollout_ref.actor.' if k in ACTOR_KEYS else PL}{k}={v}" for k, v in over.items()]
        metrics, _ = _update_with(tiny_model_dir, batch, *overrides)
        want = expected_loss(batch, lp, mode, **over)
        assert metrics["actor/pg_loss"] == pytest.approx(want, abs=2e-5), (mode, over)
        seen.append(metrics["actor/pg_loss"])
    # every mode/setting gives a different loss on this batch (differences ≫ the 2e-5 tolerance)
    assert min(abs(a - b) for i, a in enumerate(seen) for b in seen[i + 1:]) > 1e-3, list(zip(CASES, seen))
