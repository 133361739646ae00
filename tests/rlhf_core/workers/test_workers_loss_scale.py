"""``loss_scale_factor`` (actor and critic) and ``critic.data_loader_seed`` reach the updates (tiny Qwen2, one
process; the FSDP worker path builds the same ``DataParallelPPOActor`` / ``DataParallelPPOCritic``).

verl 0.9 ``core_algos.agg_loss``: in ``seq-mean-token-sum-norm`` the sequence-mean of the per-sequence token sums is
divided by ``loss_scale_factor``, or by the loss mask's width ``T`` when it is null; the other modes ignore it. Each
update here is one mini-batch of all 8 rows (its metrics are taken at the initial weights), so with the same
weights and batch the loss with factor ``L`` is the loss with null × ``T / L``.
"""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM, Qwen2ForTokenClassification

from rlhf_core.config import load_config
from rlhf_core.workers import critic as critic_mod
from rlhf_core.workers.actor import DataParallelPPOActor
from rlhf_core.workers.critic import DataParallelPPOCritic

from tests.rlhf_core.workers.test_workers_update_pins import T, fixed_batch, tiny_config

NORM = "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"


def test_agg_loss_scale_factor_hand_values():
    from rlhf_core.algos.loss_agg import agg_loss

    # rows sum to 1+2+3 = 6 and 4+5 = 9 (the 7 is masked): sequence-mean 7.5; ÷ T = 3 → 2.5, ÷ 5 → 1.5
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == 2.5
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=5).item() == 1.5
    # token-mean ignores it: 15 / 5 tokens = 3
    assert agg_loss(loss, mask, "token-mean", loss_scale_factor=5).item() == 3.0


def _actor_metrics(*overrides: str) -> dict[str, float]:
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_config())
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.actor.use_kl_loss=True",
                                      "actor_rollout_ref.actor.calculate_entropy=True", *overrides])
    actor = DataParallelPPOActor(cfg.actor_rollout_ref.actor, model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                                 mini_batch_size=8, micro_batch_size=2)
    return actor.update_policy(fixed_batch())


def test_actor_loss_scale_factor_divides_every_term():
    base = _actor_metrics(NORM)
    scaled = _actor_metrics(NORM, "actor_rollout_ref.actor.loss_scale_factor=2")
    assert abs(base["actor/pg_loss"]) > 1e-4 and base["actor/kl_loss"] > 1e-4  # terms that are not 0
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss"):
        assert scaled[k] == pytest.approx(base[k] * T / 2, rel=1e-5), k  # ÷ 2 instead of ÷ T = 5


def test_actor_loss_scale_factor_is_ignored_by_token_mean():
    base = _actor_metrics()
    scaled = _actor_metrics("actor_rollout_ref.actor.loss_scale_factor=2")
    assert scaled["actor/pg_loss"] == base["actor/pg_loss"]


def _critic(monkeypatch, *overrides: str):
    """(metrics of one update, the UpdateSchedule the critic ran)."""
    seen = []
    real = critic_mod.run_update
    monkeypatch.setattr(critic_mod, "run_update", lambda *a, **k: seen.append(a[4]) or real(*a, **k))
    torch.manual_seed(1)
    model = Qwen2ForTokenClassification(tiny_config())
    cfg = load_config("ppo_trainer", list(overrides)).critic
    critic = DataParallelPPOCritic(cfg, model, torch.optim.AdamW(model.parameters(), lr=1e-2), mini_batch_size=8,
                                   micro_batch_size=2)
    return critic.update_critic(fixed_batch()), seen[0]


def test_critic_loss_scale_factor(monkeypatch):
    base, _ = _critic(monkeypatch, NORM)  # critic.loss_agg_mode follows the actor's
    scaled, _ = _critic(monkeypatch, NORM, "critic.loss_scale_factor=3")
    assert base["critic/vf_loss"] > 1e-3
    assert scaled["critic/vf_loss"] == pytest.approx(base["critic/vf_loss"] * T / 3, rel=1e-5)
    follows, _ = _critic(monkeypatch, NORM, "actor_rollout_ref.actor.loss_scale_factor=3")  # the critic's default
    assert follows["critic/vf_loss"] == pytest.approx(scaled["critic/vf_loss"], rel=1e-6)


def test_critic_data_loader_seed_seeds_its_shuffle(monkeypatch):
    _, schedule = _critic(monkeypatch, "critic.shuffle=True")
    assert schedule.seed == 42  # verl 0.9's default of critic.data_loader_seed (it was a fixed 0 here)
    _, seeded = _critic(monkeypatch, "critic.shuffle=True", "critic.data_loader_seed=7")
    assert seeded.seed == 7
