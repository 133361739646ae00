"""The distillation term in the actor's update (rlhf_core/workers/actor_loss.py; verl ``distillation_ppo_loss``), on
a tiny Qwen2 in one process: the micro-batch loss is the PPO loss (policy − entropy + KL loss) plus
``distillation_loss_coef`` × the distillation loss with ``use_task_rewards``, the distillation loss alone without;
and the update does not depend on the micro-batch split (the min/max metrics included)."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from rlhf_core.algos.distillation import DistillationInputs, distillation_loss
from rlhf_core.config import load_config
from rlhf_core.protocol import Batch
from rlhf_core.workers.actor import DataParallelPPOActor
from rlhf_core.workers.actor_loss import actor_micro_loss

from tests.rlhf_core.workers.test_workers_update_pins import B, T, V, fixed_batch, tiny_config

DL = "distillation.distillation_loss."


def _actor(micro: int, *overrides: str) -> DataParallelPPOActor:
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_config())
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.entropy_coeff=0.01",
                                      *overrides])
    # SGD: the step is the gradient itself (Adam would turn float rounding in a near-zero gradient into ±lr)
    actor = DataParallelPPOActor(cfg.actor_rollout_ref.actor, model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 mini_batch_size=B, micro_batch_size=micro)
    actor.distillation = cfg.distillation.distillation_loss
    return actor


def _batch() -> Batch:
    batch = fixed_batch()
    g = torch.Generator().manual_seed(11)
    teacher = torch.log_softmax(3 * torch.randn(B, T, V, generator=g), -1)  # a peaked teacher over the V tokens
    top = torch.topk(teacher, k=4, dim=-1)
    lp = torch.gather(teacher, -1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return batch.merge(Batch({"teacher_log_probs": lp, "teacher_topk_log_probs": top.values,
                              "teacher_topk_ids": top.indices}))


@pytest.mark.parametrize("task_rewards,pg", [(True, False), (False, False), (False, True), (True, True)])
def test_micro_loss_combines_as_verl(task_rewards, pg):
    actor = _actor(B, f"{DL}loss_mode=k3", f"{DL}distillation_loss_coef=2.0", f"{DL}use_task_rewards={task_rewards}",
                   f"{DL}use_policy_gradient={pg}")
    batch = _batch()
    mask = batch["response_mask"]
    n_tok, n_seq = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    total, metrics = actor_micro_loss(actor, batch, 1.0, n_tok, n_seq)
    loss_cfg, actor.distillation = actor.distillation, None
    ppo, ppo_metrics = actor_micro_loss(actor, batch, 1.0, n_tok, n_seq)
    log_prob, _ = actor._log_prob_entropy(batch, 1.0, with_entropy=False)
    distill, _ = distillation_loss(DistillationInputs(log_prob, batch["old_log_probs"], mask,
                                                      teacher_log_probs=batch["teacher_log_probs"],
                                                      global_tokens=n_tok, global_seqs=n_seq), loss_cfg,
                                   actor.config)
    expected = ppo + 2.0 * distill if task_rewards else distill  # verl: coefficient 1 without task rewards
    assert total.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["distillation/loss"] == pytest.approx(distill.item(), rel=1e-5)
    # the PPO loss (and its metrics) only when task rewards or the policy-gradient form ask for it
    assert ("actor/pg_loss" in metrics) == (task_rewards or pg) and ("distillation/pg_clipfrac" in metrics) == pg
    assert ppo_metrics["actor/kl_loss"] > 0  # the dropped terms were not 0


def test_topk_update_does_not_depend_on_the_micro_batch_split():
    batch = _batch()
    runs = []
    for micro in (2, B):
        actor = _actor(micro, f"{DL}loss_mode=forward_kl_topk", f"{DL}topk=4", f"{DL}use_task_rewards=False")
        start = [p.detach().clone() for p in actor.model.parameters()]
        metrics = actor.update_policy(batch)
        runs.append((metrics, [p.detach().clone() for p in actor.model.parameters()]))
    (m2, w2), (m8, w8) = runs
    for key in ("distillation/loss", "distillation/loss_min", "distillation/loss_max", "distillation/student_mass",
                "distillation/teacher_mass_min", "distillation/teacher_mass_max", "distillation/overlap_ratio"):
        assert m2[key] == pytest.approx(m8[key], rel=1e-5, abs=1e-7), key
    assert m8["distillation/loss_min"] <= m8["distillation/loss"] <= m8["distillation/loss_max"]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(w2, w8))
    assert not all(torch.equal(a, b) for a, b in zip(start, w8))  # the update did move the weights
