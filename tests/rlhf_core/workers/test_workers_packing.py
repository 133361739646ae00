"""``use_remove_padding`` (kernels/packing.py): the packed forward equals the padded one to 1e-5 — log-probs,
entropy, values, losses and gradients of the actor and the critic — and dynamic batch sizes (token budgets) give
the same gradient as fixed micro-batches."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.rlhf_core.workers.test_workers_fsdp import ppo_config, training_batch  # noqa: E402

from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.workers import batching  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402
from rlhf_core.kernels.packing import pack_inputs, unpack_output  # noqa: E402

COMMON = ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.1",
          "actor_rollout_ref.actor.entropy_coeff=0.01"]


@pytest.fixture(scope="module")
def group(tiny_model_dir):
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, *COMMON),
                                                  "role": "actor_rollout_ref"})
    wg.execute_all("init_model")
    return wg


def test_pack_inputs_hand_example():
    # row 0: 2 left pads then 3 tokens; row 1: 4 tokens then 1 right pad -> 7 valid tokens, positions restart
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 0]])
    mask = (ids != 0).long()
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    p_ids, p_pos, index = pack_inputs(ids, mask, pos)
    assert p_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11]]
    assert p_pos.tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    back = unpack_output(p_ids[..., None].float(), index, (2, 5))[..., 0]
    assert torch.equal(back, (ids * mask).float())
    with pytest.raises(ValueError, match="count each row.s valid tokens from 0"):
        pack_inputs(ids, mask, pos + 1)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A (DTensor) gradient as a plain tensor."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _actor_pass(actor, batch, packed: bool):
    actor.use_remove_padding = packed
    lp, ent = actor.compute_log_prob(batch, 2)
    n_tok, n_seq = batching.global_counts(batch["response_mask"])
    actor.model.train()
    actor.model.zero_grad(set_to_none=True)
    loss, _ = actor._micro_loss(batch, 1.0, n_tok, n_seq)
    loss.backward()
    grads = {n: _local(p.grad) for n, p in actor.model.named_parameters() if p.grad is not None}
    actor.model.zero_grad(set_to_none=True)
    actor.use_remove_padding = False
    return lp, ent, loss.detach(), grads


def test_actor_packed_equals_padded(group):
    batch = training_batch(group, seed=8)
    batch.meta["temperature"] = 1.0
    mask = batch["response_mask"].bool()
    assert (batch["attention_mask"] == 0).any()  # there is padding to remove
    actor = group.worker.actor
    lp0, ent0, loss0, g0 = _actor_pass(actor, batch, False)
    lp1, ent1, loss1, g1 = _actor_pass(actor, batch, True)
    assert torch.allclose(lp1[mask], lp0[mask], atol=1e-5)
    assert torch.allclose(ent1[mask], ent0[mask], atol=1e-5)
    assert torch.allclose(loss1, loss0, atol=1e-5)
    assert g0.keys() == g1.keys() and len(g0) > 0
    for k in g0:
        assert torch.allclose(g1[k], g0[k], atol=1e-5), k
    # the reference model (same flag from actor_rollout_ref.model) gives the same ref log-probs packed
    ref = group.worker.ref
    r0, _ = ref.compute_log_prob(batch, 2, calculate_entropy=False)
    ref.use_remove_padding = True
    r1, _ = ref.compute_log_prob(batch, 2, calculate_entropy=False)
    ref.use_remove_padding = False
    assert torch.allclose(r1[mask], r0[mask], atol=1e-5)


def test_worker_flag_sets_packing(tiny_model_dir):
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(
        tiny_model_dir, "actor_rollout_ref.model.use_remove_padding=True"), "role": "actor_rollout_ref"})
    wg.execute_all("init_model")
    assert wg.worker.actor.use_remove_padding and wg.worker.ref.use_remove_padding
    assert wg.worker.rollout.use_remove_padding  # the HF rollout's prefill packs too


def test_critic_packed_equals_padded(group, tiny_model_dir):
    batch = training_batch(group, seed=9)
    batch.tensors["values"] = torch.zeros_like(batch["advantages"])
    batch.tensors["returns"] = torch.randn(batch["advantages"].shape, generator=torch.Generator().manual_seed(2))
    mask = batch["response_mask"].bool()
    outs = []
    for packed in (False, True):
        wg = LocalWorkerGroup(CriticWorker, {"config": ppo_config(
            tiny_model_dir, f"critic.model.use_remove_padding={packed}", "critic.optim.eps=1.0")})
        wg.execute_all("init_model")
        assert wg.worker.critic.use_remove_padding is packed
        values = wg.execute_dp("compute_values", batch)["values"]
        metrics = wg.execute_dp("update_critic", batch)[0]
        outs.append((values, metrics, wg.worker.get_state_dict()))
    (v0, m0, sd0), (v1, m1, sd1) = outs
    assert torch.allclose(v1[mask], v0[mask], atol=1e-5)
    assert m1["critic/vf_loss"] == pytest.approx(m0["critic/vf_loss"], abs=1e-5)
    assert m1["critic/grad_norm"] == pytest.approx(m0["critic/grad_norm"], abs=1e-5)
    for k in sd0:  # eps=1: the first Adam step is proportional to the gradient
        assert torch.allclose(sd1[k], sd0[k], atol=1e-7), k


def test_dynamic_bsz_gives_the_fixed_gradient_packed(group, tiny_model_dir):
    batch = training_batch(group, seed=10)
    common = [*COMMON, "actor_rollout_ref.actor.optim.eps=1.0", "actor_rollout_ref.model.use_remove_padding=True"]
    runs = []
    for extra in (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"],
                  ["actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20"]):
        wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, *common, *extra),
                                                      "role": "actor_rollout_ref"})
        wg.execute_all("init_model")
        lens = batch["attention_mask"].sum(-1).tolist()
        runs.append((wg.execute_dp("update_actor", batch)[0], wg.worker.get_state_dict()))
    assert len(batching.token_budget_partition([int(n) for n in lens], 20)) > 1  # the budget did cut
    (m0, sd0), (m1, sd1) = runs
    assert m1["actor/grad_norm"] == pytest.approx(m0["actor/grad_norm"], abs=1e-5)
    assert m1["actor/pg_loss"] == pytest.approx(m0["actor/pg_loss"], abs=1e-5)
    for k in sd0:
        assert torch.allclose(sd1[k], sd0[k], atol=1e-7), k
