"""On-policy distillation losses (verl 0.9.1 ``verl/trainer/distillation/losses.py``, ``fsdp/losses.py``):
hand-derived values and gradients, and a case where each clamp (``loss_max_clamp``, ``log_prob_min_clamp``, the
top-k clamp at 0) and each clip bound of the policy-gradient form decides.

Conventions: ``grad`` is ∂loss/∂(student log-prob) for the estimator modes and ∂loss/∂(student logits) for
``forward_kl_topk``. One valid token unless said, so token-mean is the token's own value.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlhf_core.algos.distillation import (LOSS_MODES, DistillationInputs, combine_with_policy_loss, distillation_loss,
                                          estimator_losses, forward_kl_topk, needs_policy_loss, uses_topk)

LN2 = math.log(2.0)


def loss_cfg(**kw):
    base = dict(loss_mode="k3", topk=2, use_task_rewards=True, distillation_loss_coef=1.0, loss_max_clamp=None,
                log_prob_min_clamp=None, use_policy_gradient=False, policy_loss_mode="vanilla", clip_ratio=0.2,
                clip_ratio_low=0.2, clip_ratio_high=0.2)
    return SimpleNamespace(**{**base, **kw})


# the actor's policy-loss settings (PolicyLossConfig.from_actor_config reads these); its clip ratios are 0.5 so a
# test sees that the distillation loss's own clip_ratio_low/high are used instead
ACTOR = SimpleNamespace(loss_agg_mode="token-mean", clip_ratio=0.5, clip_ratio_low=0.5, clip_ratio_high=0.5,
                        clip_ratio_c=10.0, tau_pos=1.0, tau_neg=1.05,
                        policy_loss=SimpleNamespace(clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0,
                                                    kl_cov_ratio=0.0002, ppo_kl_coef=0.1, dro_beta=None))


def test_registered_modes_are_verls():
    assert set(LOSS_MODES) == {"forward_kl_topk", "kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"}
    assert uses_topk("forward_kl_topk") and not uses_topk("k3")
    with pytest.raises(ValueError, match=r"loss_mode='reverse_kl_topk'.*registered: \['forward_kl_topk', 'kl'"):
        uses_topk("reverse_kl_topk")


# student log-prob log ½, teacher log ¼: d = log π_S − log π_T = ln 2.
# k1 = d = 0.6931472, ∂/∂s = 1; abs = |d|, ∂ = sign d = 1; k2 = ½d² = 0.2402265, ∂ = d = 0.6931472;
# k3 with x = −d: eˣ − x − 1 = ½ + ln 2 − 1 = 0.1931472, ∂/∂s = 1 − e^{−d} = 1 − ½ = 0.5.
@pytest.mark.parametrize("mode,value,grad", [("k1", LN2, 1.0), ("kl", LN2, 1.0), ("abs", LN2, 1.0),
                                             ("k2", 0.5 * LN2 ** 2, LN2), ("mse", 0.5 * LN2 ** 2, LN2),
                                             ("k3", LN2 - 0.5, 0.5), ("low_var_kl", LN2 - 0.5, 0.5)])
def test_estimators_value_and_gradient(mode, value, grad):
    s = torch.tensor([[math.log(0.5)]], requires_grad=True)
    out = estimator_losses(s, torch.tensor([[math.log(0.25)]]), mode)
    out.sum().backward()
    assert out.item() == pytest.approx(value, abs=1e-6) and s.grad.item() == pytest.approx(grad, abs=1e-6)


def _topk_case():
    # V = 3, uniform student (p_S = ⅓ each); teacher's top-2: ids [0, 1] with p_T = [½, ¼].
    logits = torch.zeros(1, 1, 3, requires_grad=True)
    return logits, torch.log(torch.tensor([[[0.5, 0.25]]])), torch.tensor([[[0, 1]]])


def test_forward_kl_topk_value_and_gradient():
    # loss = ½(ln ½ − ln ⅓) + ¼(ln ¼ − ln ⅓) = ½ ln 1.5 + ¼ ln 0.75 = 0.2027326 − 0.0719205 = 0.1308121.
    # With log p_S,j = z_j − logsumexp z: ∂loss/∂z_j = −p_T,j·[j in top-k] + (Σ_k p_T,k)·softmax(z)_j
    # = −p_T,j + ¾·⅓, so the gradient is [−½ + ¼, −¼ + ¼, ¼] = [−0.25, 0, 0.25].
    # Masses: student Σ p_S at ids 0, 1 = ⅔; teacher ½ + ¼ = ¾.
    logits, t_lp, t_ids = _topk_case()
    out = forward_kl_topk(logits, t_lp, t_ids)
    out["distillation_losses"].sum().backward()
    assert out["distillation_losses"].item() == pytest.approx(0.5 * math.log(1.5) + 0.25 * math.log(0.75), abs=1e-6)
    assert torch.allclose(logits.grad, torch.tensor([[[-0.25, 0.0, 0.25]]]), atol=1e-6)
    assert out["student_mass"].item() == pytest.approx(2 / 3) and out["teacher_mass"].item() == pytest.approx(0.75)


def test_forward_kl_topk_overlap_diagnostics():
    # student logits [2, 1, 0]: its top-2 are ids {0, 1}; the teacher's are [0, 2]: one overlap (id 0), so
    # overlap_count 1 and overlap_token_advantage = −p_T,0·(ln p_T,0 − ln p_S,0) with p_S,0 = e²/(e² + e + 1).
    logits = torch.tensor([[[2.0, 1.0, 0.0]]])
    p_s0 = math.exp(2) / (math.exp(2) + math.e + 1)
    out = forward_kl_topk(logits, torch.log(torch.tensor([[[0.6, 0.3]]])), torch.tensor([[[0, 2]]]))
    assert out["overlap_count"].item() == 1
    assert out["overlap_token_advantage"].item() == pytest.approx(-0.6 * (math.log(0.6) - math.log(p_s0)), abs=1e-6)


def test_log_prob_min_clamp_decides():
    # V = 2, student logits [0, −30]: log p_S(1) = −30 − ln(1 + e^−30) ≈ −30. Teacher top-1: id 1, p_T = ½.
    # No clamp: ½(ln ½ + 30) = 14.6534264; the gradient at z_1 is −½ + ½·p_S(1) ≈ −½.
    # log_prob_min_clamp = −10: ½(ln ½ + 10) = 4.6534264, and no gradient flows through the clamped log-prob.
    t_lp, t_ids = torch.log(torch.tensor([[[0.5]]])), torch.tensor([[[1]]])
    for clamp, value, grad in ((None, 0.5 * (math.log(0.5) + 30), -0.5), (-10.0, 0.5 * (math.log(0.5) + 10), 0.0)):
        logits = torch.tensor([[[0.0, -30.0]]], requires_grad=True)
        out = forward_kl_topk(logits, t_lp, t_ids, clamp)["distillation_losses"]
        out.sum().backward()
        assert out.item() == pytest.approx(value, abs=1e-4) and logits.grad[0, 0, 1].item() == pytest.approx(grad, abs=1e-6)


def test_topk_loss_clamped_at_zero():
    # p_S(0) = 0.9 (logits [ln 0.9, ln 0.1]), teacher top-1 id 0 with p_T = ½: ½(ln ½ − ln 0.9) = −0.2938933 < 0,
    # so the per-token loss is 0 (verl: the top-k masses do not sum to 1) and no gradient flows.
    logits = torch.log(torch.tensor([[[0.9, 0.1]]])).requires_grad_(True)
    mask = torch.ones(1, 1)
    inputs = DistillationInputs(torch.zeros(1, 1), torch.zeros(1, 1), mask, logits=logits,
                                teacher_topk_log_probs=torch.log(torch.tensor([[[0.5]]])),
                                teacher_topk_ids=torch.tensor([[[0]]]))
    loss, metrics = distillation_loss(inputs, loss_cfg(loss_mode="forward_kl_topk", topk=1), ACTOR)
    loss.backward()
    assert loss.item() == 0.0 and torch.all(logits.grad == 0)
    assert metrics["distillation/loss_min"] == 0.0 and metrics["distillation/teacher_mass"] == pytest.approx(0.5)


def _k1_inputs(student, teacher, old=None):
    s = torch.tensor([[student]], requires_grad=True)
    return s, DistillationInputs(s, torch.tensor([[student if old is None else old]]), torch.ones(1, 1),
                                 teacher_log_probs=torch.tensor([[teacher]]))


def test_loss_max_clamp_decides():
    # supervised k2 with student −4, teacher −1: d = −3, ½d² = 4.5, ∂ = d = −3. loss_max_clamp = 2: the loss is 2
    # and no gradient flows; loss_min/loss_max report the unclamped 4.5.
    for clamp, value, grad in ((None, 4.5, -3.0), (2.0, 2.0, 0.0)):
        s, inputs = _k1_inputs(-4.0, -1.0)
        loss, metrics = distillation_loss(inputs, loss_cfg(loss_mode="k2", loss_max_clamp=clamp), ACTOR)
        loss.backward()
        assert (loss.item(), s.grad.item()) == (pytest.approx(value), pytest.approx(grad))
        assert metrics["distillation/loss_max"] == pytest.approx(4.5)
        assert metrics["distillation/abs_loss"] == pytest.approx(4.5)


def test_loss_max_clamp_bounds_negative_k1_below():
    # k1 with student −4, teacher −1: d = −3; clamp 2 makes it −2 (verl clamps to [−c, c]: k1 can be negative).
    # With the policy gradient (on-policy, ratio 1): advantage = +2, loss = −A·r = −2, ∂/∂s = −A = −2.
    s, inputs = _k1_inputs(-4.0, -1.0)
    loss, _ = distillation_loss(inputs, loss_cfg(loss_mode="k1", loss_max_clamp=2.0, use_policy_gradient=True), ACTOR)
    loss.backward()
    assert (loss.item(), s.grad.item()) == (pytest.approx(-2.0), pytest.approx(-2.0))


LN15 = math.log(1.5)


@pytest.mark.parametrize("student,teacher,old,low,high,value,grad", [
    # k1: student −0.5, teacher −1: d = 0.5, advantage A = −0.5. The loss is max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)).
    # on-policy r = 1: 0.5, ∂/∂s = −A·r = 0.5
    (-0.5, -1.0, -0.5, 0.2, 0.2, 0.5, 0.5),
    # old = −0.5 + ln 2 → r = ½ < 1 − 0.2: −A·r = 0.25 < −A·0.8 = 0.4, the clipped term is chosen: 0.4, no gradient
    (-0.5, -1.0, -0.5 + LN2, 0.2, 0.2, 0.4, 0.0),
    # the same r with the distillation loss's clip_ratio_low = 0.6 (the actor's 0.5 would clip too): r = ½ lies
    # inside [0.4, 1.2], so 0.25 with gradient −A·r = 0.25
    (-0.5, -1.0, -0.5 + LN2, 0.6, 0.2, 0.25, 0.25),
    # student −1, teacher −0.5: d = −0.5, A = +0.5; old = −1 − ln 1.5 → r = 1.5 > 1 + 0.2: −A·r = −0.75 < −A·1.2 =
    # −0.6, the clipped −0.6 is chosen, no gradient
    (-1.0, -0.5, -1.0 - LN15, 0.2, 0.2, -0.6, 0.0),
    # with clip_ratio_high = 0.6, r = 1.5 lies inside [0.8, 1.6]: −0.75, gradient −A·r = −0.75
    (-1.0, -0.5, -1.0 - LN15, 0.2, 0.6, -0.75, -0.75),
])
def test_policy_gradient_form_uses_its_own_clip_ratios(student, teacher, old, low, high, value, grad):
    s, inputs = _k1_inputs(student, teacher, old)
    cfg = loss_cfg(loss_mode="k1", use_policy_gradient=True, clip_ratio_low=low, clip_ratio_high=high)
    loss, metrics = distillation_loss(inputs, cfg, ACTOR)
    loss.backward()
    assert (loss.item(), s.grad.item()) == (pytest.approx(value, abs=1e-6), pytest.approx(grad, abs=1e-6))
    assert metrics["distillation/pg_clipfrac"] == (1.0 if grad == 0 else 0.0)


def test_supervised_aggregation_by_loss_agg_mode():
    # two rows, k2 losses: row 0 tokens d = [1, 2] → [0.5, 2]; row 1 one valid token d = 3 → 4.5, its second masked.
    # token-mean: (0.5 + 2 + 4.5)/3 = 2.3333333; seq-mean-token-mean: ((0.5 + 2)/2 + 4.5)/2 = 2.875.
    s = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    t = torch.tensor([[-1.0, -2.0], [-3.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    for mode, expected in (("token-mean", 7 / 3), ("seq-mean-token-mean", 2.875)):
        actor = SimpleNamespace(**{**vars(ACTOR), "loss_agg_mode": mode})
        loss, _ = distillation_loss(DistillationInputs(s, s, mask, teacher_log_probs=t), loss_cfg(loss_mode="k2"),
                                    actor)
        assert loss.item() == pytest.approx(expected)


def test_combination_with_the_policy_loss():
    # verl distillation_ppo_loss: use_task_rewards → pg + coef·distill; else distill alone, coefficient 1.
    pg, d = torch.tensor(1.5), torch.tensor(0.25)
    assert combine_with_policy_loss(pg, d, loss_cfg(distillation_loss_coef=4.0)).item() == pytest.approx(2.5)
    assert combine_with_policy_loss(pg, d, loss_cfg(distillation_loss_coef=4.0, use_task_rewards=False)).item() == 0.25
    assert not needs_policy_loss(loss_cfg(use_task_rewards=False))
    assert needs_policy_loss(loss_cfg(use_task_rewards=False, use_policy_gradient=True))
