"""One rank runs the plain module instead of FSDP2 (``fsdp_utils.needs_fsdp2``): the same PPO update, bit for bit.

At world size 1 FSDP2 shards every parameter over one rank (the local shard is the whole tensor) and its
reduce-scatter divides by 1, so the forward, backward, gradient norm, clip and fused AdamW step see the same
numbers in the same order as on the plain module; the test holds them to exact equality (``rtol=0, atol=0``).
"""
from __future__ import annotations

import torch
from transformers import Qwen2ForCausalLM

from rlhf_core.config import load_config
from rlhf_core.distributed import LocalWorkerGroup
from rlhf_core.workers import update_loop
from rlhf_core.workers.actor import DataParallelPPOActor
from rlhf_core.workers.fsdp_utils import apply_fsdp2, clip_grad_norm, full_state_dict, is_sharded
from rlhf_core.workers.optim import build_optimizer
from tests.rlhf_core.workers.test_workers_update_pins import fixed_batch, tiny_config


class _Rank:
    """Nothing but this process's single-rank group (LocalWorkerGroup joins it)."""


def _update(sharded: bool, *overrides: str, monkeypatch=None):
    """Two PPO epochs over two mini-batches of 4 rows in micro-batches of 2 (4 optimizer steps, grad clip 0.5 so
    that clipping acts, the config's fused AdamW at lr 1e-2) on a tiny Qwen2: (metrics with ``grad_norms``, the
    norm of each step, weights by name, model)."""
    norms: list[float] = []
    if monkeypatch is not None:
        monkeypatch.setattr(update_loop, "clip_grad_norm", lambda m, c: norms.append(clip_grad_norm(m, c)) or norms[-1])
    LocalWorkerGroup(_Rank, {})
    torch.manual_seed(0)
    model = apply_fsdp2(Qwen2ForCausalLM(tiny_config()), {}, "actor", single_rank=sharded)
    assert is_sharded(model) == sharded
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.shuffle=True",
                                      "actor_rollout_ref.actor.grad_clip=0.5", "actor_rollout_ref.actor.optim.lr=1e-2",
                                      "actor_rollout_ref.actor.entropy_coeff=0.01",
                                      "actor_rollout_ref.actor.use_kl_loss=True", *overrides]).actor_rollout_ref.actor
    opt = build_optimizer(model.parameters(), cfg.optim)
    assert opt.defaults["fused"] is True
    actor = DataParallelPPOActor(cfg, model, opt, mini_batch_size=4, micro_batch_size=2)
    metrics = dict(actor.update_policy(fixed_batch()), grad_norms=norms)
    weights = {k: v.detach().clone() for k, v in full_state_dict(model).items()}
    return metrics, weights, model


def test_plain_single_rank_update_equals_fsdp2_bit_for_bit(monkeypatch):
    m_plain, w_plain, plain = _update(False, monkeypatch=monkeypatch)
    m_fsdp, w_fsdp, _ = _update(True, monkeypatch=monkeypatch)
    norms = m_plain["grad_norms"]
    assert len(norms) == 4 and all(n > 0.5 for n in norms), norms  # 4 steps, every one clipped (grad_clip 0.5)
    assert m_fsdp["grad_norms"] == norms  # exact
    assert {"actor/pg_loss", "actor/kl_loss", "actor/grad_norm"} <= set(m_plain)
    assert m_fsdp == m_plain  # every metric of the update, exactly
    assert sorted(w_plain) == sorted(w_fsdp)
    torch.manual_seed(0)
    initial = Qwen2ForCausalLM(tiny_config())  # the weights both updates started from
    moved = [k for k, v in initial.state_dict().items() if not torch.equal(v, w_plain[k])]
    assert len(moved) == len(w_plain)  # every weight changed, so equal weights below mean equal updates
    for key, value in w_plain.items():
        torch.testing.assert_close(w_fsdp[key], value, rtol=0, atol=0, msg=key)
    # the plain module's full state dict holds the live parameters (no copy per rollout sync); the one-step
    # off-policy ``actor_weights`` copies, so the next update leaves what it returned unchanged
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    params = dict(plain.named_parameters())
    live = full_state_dict(plain)
    assert all(live[k].data_ptr() == p.data_ptr() for k, p in params.items())
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.actor_module = plain
    copied = worker.actor_weights()
    assert all(copied[k].data_ptr() != p.data_ptr() and torch.equal(copied[k], p) for k, p in params.items())
