"""The on-policy shortcut (workers/on_policy.py): leaving ``old_log_probs`` to the update's first forward gives the
same loss, gradient and update as the separate ``old_log_prob`` forward, and is not taken when a condition fails."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.rlhf_core.workers.test_workers_fsdp import ppo_config, training_batch  # noqa: E402

from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.workers import batching  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402
from rlhf_core.workers.on_policy import first_forward_is_old_log_prob, has_active_dropout, skip_old_log_prob  # noqa: E402

COMMON = ["actor_rollout_ref.actor.optim.eps=1.0", "actor_rollout_ref.actor.use_kl_loss=True",
          "actor_rollout_ref.actor.kl_loss_coef=0.1", "actor_rollout_ref.actor.entropy_coeff=0.01"]


def _without_old(batch: Batch) -> Batch:
    return Batch({k: v for k, v in batch.tensors.items() if k != "old_log_probs"}, batch.non_tensors, batch.meta)


@pytest.fixture(scope="module")
def group(tiny_model_dir):
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, *COMMON),
                                                  "role": "actor_rollout_ref"})
    wg.execute_all("init_model")
    return wg


def _loss_and_grads(actor, mb: Batch, n_tok: float, n_seq: float):
    actor.model.train()
    actor.model.zero_grad(set_to_none=True)
    loss, metrics = actor._micro_loss(mb, 1.0, n_tok, n_seq)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in actor.model.named_parameters() if p.grad is not None}
    actor.model.zero_grad(set_to_none=True)
    return loss.detach(), metrics, grads


def test_loss_and_gradient_identical_with_and_without_the_skip(group):
    batch = training_batch(group, seed=5)
    batch.meta["temperature"] = 1.0
    actor = group.worker.actor
    n_tok, n_seq = batching.global_counts(batch["response_mask"])
    l0, m0, g0 = _loss_and_grads(actor, batch, n_tok, n_seq)
    l1, m1, g1 = _loss_and_grads(actor, _without_old(batch), n_tok, n_seq)
    # the eval-mode no-grad forward and the train-mode forward run the same kernels on the same weights: bitwise
    assert torch.equal(l0, l1)
    # pg_loss, ppo_kl (0: ratio 1), clip fractions, kl_loss; the shortcut also reports the pre-update entropy that
    # the skipped old_log_prob stage would have logged (with old_log_probs given, that stage logs it, not the update)
    assert "actor/entropy" not in m0 and "actor/entropy" in m1
    assert m0 == {k: v for k, v in m1.items() if k != "actor/entropy"}
    assert m0["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-7)
    assert g0.keys() == g1.keys() and len(g0) > 0
    for k in g0:
        assert torch.equal(g0[k], g1[k]), k


def test_full_update_identical_and_entropy_metric_provided(tiny_model_dir, group):
    batch = training_batch(group, seed=6)
    runs = []
    for b in (batch, _without_old(batch)):
        wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, *COMMON), "role": "actor"})
        wg.execute_all("init_model")
        runs.append((wg.execute_dp("update_actor", b)[0], wg.worker.get_state_dict()))
    (m0, sd0), (m1, sd1) = runs
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert m1[k] == m0[k], k
    # the shortcut's actor/entropy is the token-mean of the entropy the old_log_prob stage computes on the same batch
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, *COMMON), "role": "actor"})
    wg.execute_all("init_model")
    ent = wg.execute_dp("compute_log_prob", batch)["entropys"]
    mask = batch["response_mask"].float()
    assert m1["actor/entropy"] == pytest.approx(float((ent * mask).sum() / mask.sum()), rel=1e-5)
    for k in sd0:
        assert torch.equal(sd0[k], sd1[k]), k


def test_skip_not_taken_when_a_condition_fails(tiny_model_dir, group):
    base = ppo_config(tiny_model_dir)
    assert skip_old_log_prob(base, global_steps=1)  # 1 epoch, mini-batch 4 = train batch 4, no kl in reward
    for override in ("actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                     "algorithm.use_kl_in_reward=True", "algorithm.rollout_is_threshold=2.0",
                     "actor_rollout_ref.actor.rollout_is=True actor_rollout_ref.rollout.calculate_log_probs=True",
                     "actor_rollout_ref.rollout.calculate_log_probs=True"):  # rollout_corr/* read π_old
        assert not skip_old_log_prob(ppo_config(tiny_model_dir, *override.split()), global_steps=1), override
    assert not skip_old_log_prob(ppo_config(tiny_model_dir, "trainer.critic_warmup=1"), global_steps=1)
    model = group.worker.actor_module
    assert not has_active_dropout(model)  # the tiny Qwen2 has attention_dropout 0
    assert first_forward_is_old_log_prob(model, 4, 4, 1)
    assert not first_forward_is_old_log_prob(model, 4, 2, 1)  # two mini-batches: the second sees new weights
    assert not first_forward_is_old_log_prob(model, 4, 4, 2)  # a second epoch
    model.config.attention_dropout = 0.1
    try:
        assert has_active_dropout(model) and not first_forward_is_old_log_prob(model, 4, 4, 1)
    finally:
        model.config.attention_dropout = 0.0
    batch = training_batch(group, seed=7)
    # the actor refuses an update without old_log_probs when the shortcut does not hold ...
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, *COMMON,
                                                  "actor_rollout_ref.actor.ppo_epochs=2"), "role": "actor"})
    wg.execute_all("init_model")
    with pytest.raises(ValueError, match="one PPO epoch"):
        wg.worker.actor.update_policy(_without_old(batch))
    # ... and the worker computes them itself, giving the same update as the driver-supplied ones
    m_self = wg.execute_dp("update_actor", _without_old(batch))[0]
    wg2 = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, *COMMON,
                                                   "actor_rollout_ref.actor.ppo_epochs=2"), "role": "actor"})
    wg2.execute_all("init_model")
    m_given = wg2.execute_dp("update_actor", batch)[0]
    assert m_self["actor/pg_loss"] == m_given["actor/pg_loss"]
    sd, sd2 = wg.worker.get_state_dict(), wg2.worker.get_state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
