"""KL estimators (values, gradients, '+' straight-through, extreme d), exact full-vocabulary KL, controllers,
and the in-reward KL penalty."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
    kl_penalty_full,
)

D = [0.5, -1.0]  # d = logπ − logπ_ref


def _value_and_grad(kind, d=D):
    lp = torch.tensor([d], requires_grad=True)
    out = kl_penalty(lp, torch.zeros(1, len(d)), kind)
    out.sum().backward()
    return out.detach()[0].tolist(), lp.grad[0].tolist()


@pytest.mark.parametrize("kind, expected", [
    ("kl", [0.5, -1.0]), ("k1", [0.5, -1.0]),
    ("abs", [0.5, 1.0]),
    ("mse", [0.125, 0.5]), ("k2", [0.125, 0.5]),  # ½d²
    # k3 = e^{−d} + d − 1: e^{−0.5} − 0.5 = 0.1065307; e^{1} − 2 = 0.7182818
    ("low_var_kl", [math.exp(-0.5) - 0.5, math.e - 2]), ("k3", [math.exp(-0.5) - 0.5, math.e - 2]),
])
def test_estimator_values(kind, expected):
    value, _ = _value_and_grad(kind)
    assert value == pytest.approx(expected, abs=1e-6)


def test_k3_gradient_is_one_minus_exp_minus_d():
    # d/dd (e^{−d} + d − 1) = 1 − e^{−d}: 1 − e^{−0.5} = 0.393469, 1 − e = −1.718282
    _, grad = _value_and_grad("k3")
    assert grad == pytest.approx([1 - math.exp(-0.5), 1 - math.e], abs=1e-6)


@pytest.mark.parametrize("kind", ["low_var_kl", "k3", "k3+", "low_var_kl+"])
def test_low_var_kl_finite_at_plus_minus_100(kind):
    # d = +100: x = clamp(−100) = −20 → e^{−20} + 20 − 1 ≈ 19 → clamped to 10.
    # d = −100: x = clamp(100) = 20 → e^{20} − 21 ≈ 4.9e8 → clamped to 10. exp only ever sees |x| ≤ 20.
    value, grad = _value_and_grad(kind, [100.0, -100.0])
    assert value == pytest.approx([10.0, 10.0])
    assert all(math.isfinite(g) for g in grad)
    if kind.endswith("+"):
        assert grad == pytest.approx([100.0, -100.0])  # k2's gradient d


@pytest.mark.parametrize("kind, named", [("k1+", "k1"), ("k3+", "k3"), ("low_var_kl+", "low_var_kl"),
                                         ("abs+", "abs"), ("k2+", "k2")])
def test_plus_variants_value_of_named_gradient_of_k2(kind, named):
    value, grad = _value_and_grad(kind)
    named_value, _ = _value_and_grad(named)
    assert value == pytest.approx(named_value, abs=1e-7)
    assert grad == pytest.approx(D, abs=1e-7)  # ∂(½d²)/∂d = d


def test_unknown_and_full_kinds_are_errors():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    with pytest.raises(ValueError, match="kl_penalty_full"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "full")


def test_full_kl_from_logits():
    # p = softmax([0, ln 3]) = [0.25, 0.75], q = uniform: KL = 0.25·ln(0.5) + 0.75·ln(1.5) = 0.1308122.
    # With a banned token (−inf): p = [1, 0] → KL = ln 2 (the banned token contributes 0, not NaN).
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, -math.inf]]], requires_grad=True)
    kl = kl_penalty_full(logits, torch.zeros(1, 2, 2))
    assert kl.shape == (1, 2)
    assert kl[0].tolist() == pytest.approx([0.25 * math.log(0.5) + 0.75 * math.log(1.5), math.log(2)], abs=1e-6)
    kl.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_full_kl_matches_expected_k1_of_sampled_tokens():
    # E_{y~p}[log p(y) − log q(y)] computed by enumerating the vocabulary equals the full KL.
    g = torch.Generator().manual_seed(0)
    logits, ref = torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    p = torch.softmax(logits, -1)
    k1 = torch.log_softmax(logits, -1) - torch.log_softmax(ref, -1)
    torch.testing.assert_close(kl_penalty_full(logits, ref), (p * k1).sum(-1), atol=1e-6, rtol=1e-6)


# ---- controllers -----------------------------------------------------------------------------------------------
def test_adaptive_controller_hand_computed_updates():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctrl.update(current_kl=9.0, n_steps=256)   # e = clip(9/6 − 1 = 0.5) = 0.2 → β = 0.1·(1 + 0.2·256/1e4) = 0.100512
    assert ctrl.value == pytest.approx(0.100512, abs=1e-12)
    ctrl.update(current_kl=6.6, n_steps=1000)  # e = 0.1 → β ·= 1.01
    assert ctrl.value == pytest.approx(0.100512 * 1.01, abs=1e-12)
    ctrl.update(current_kl=0.0, n_steps=500)   # e = clip(−1) = −0.2 → β ·= 0.99
    assert ctrl.value == pytest.approx(0.100512 * 1.01 * 0.99, abs=1e-12)


def test_fixed_controller_and_factory():
    fixed = get_kl_controller("fixed", kl_coef=0.05, horizon=10000, target_kl=0.1)
    fixed.update(current_kl=100.0, n_steps=10)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    assert isinstance(get_kl_controller("adaptive", 0.05, 10000, 0.1), AdaptiveKLController)
    with pytest.raises(ValueError, match="fixed"):
        get_kl_controller("pid", 0.05, 10000, 0.1)
    with pytest.raises(ValueError, match="horizon"):
        get_kl_controller("adaptive", 0.05, 0, 0.1)
    with pytest.raises(ValueError, match="horizon"):  # a config without kl_ctrl.horizon
        get_kl_controller("adaptive", 0.05, None, 0.1)


def test_apply_kl_penalty_rewards_metrics_and_controller_update():
    # kind 'kl', ref = 0: kld = old·mask = [[.5,.5,.5,0],[1,1,0,0]] (9s sit on padding).
    # β = 0.1 → rewards = scores − 0.1·kld. Per-sequence masked means [0.5, 1] → KL = 0.75.
    # Adaptive (target 0.5, horizon 100): e = clip(0.75/0.5 − 1 = 0.5) = 0.2 → β = 0.1·(1 + 0.2·2/100) = 0.1004.
    scores = torch.tensor([[0.0, 0, 1, 0], [0, 2, 0, 0]])
    old = torch.tensor([[0.5, 0.5, 0.5, 9], [1, 1, 9, 9]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    ctrl = AdaptiveKLController(0.1, target_kl=0.5, horizon=100)
    rewards, metrics = apply_kl_penalty(scores, old, torch.zeros(2, 4), mask, ctrl, "kl")
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, -0.05, 0.95, 0], [-0.1, 1.9, 0, 0]]), atol=1e-7, rtol=0)
    assert metrics == {"actor/reward_kl_penalty": pytest.approx(0.75), "actor/reward_kl_penalty_coeff": 0.1}
    assert ctrl.value == pytest.approx(0.1004, abs=1e-12)
