"""Loss aggregation, PPO policy loss (clip, asymmetric clip, dual clip) and value loss; micro-batch invariance."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.algos import (
    LOSS_AGG_MODES,
    PolicyLossConfig,
    PolicyLossInputs,
    agg_loss,
    compute_policy_loss,
    compute_value_loss,
    get_policy_loss_fn,
    global_token_and_seq_counts,
    register_policy_loss,
)

LOSS = torch.tensor([[1.0, 1, 1, 9], [2, 9, 9, 9]])
MASK = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0]])


# ---- agg_loss --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, expected", [
    ("token-mean", 1.25),               # (1+1+1+2)/4 valid tokens
    ("token-sum", 5.0),                 # 1+1+1+2
    ("seq-mean-token-sum", 2.5),        # mean(3, 2)
    ("seq-mean-token-mean", 1.5),       # mean(3/3, 2/1)
    ("seq-mean-token-sum-norm", 0.625),  # 2.5 / T (= 4)
])
def test_agg_loss_reference_matrix(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected, abs=1e-7)
    # A third, fully masked sequence (with huge/inf garbage) is excluded: same value.
    loss3 = torch.cat([LOSS, torch.tensor([[math.inf, 5, 5, 5]])])
    mask3 = torch.cat([MASK, torch.zeros(1, 4)])
    assert agg_loss(loss3, mask3, mode).item() == pytest.approx(expected, abs=1e-7)


def test_agg_loss_norm_constant_and_errors():
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=10.0).item() == pytest.approx(0.25)
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(LOSS, MASK, "seq-mean")
    # An empty mask gives 0, not NaN.
    for mode in LOSS_AGG_MODES:
        assert agg_loss(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


def test_agg_loss_masked_positions_get_zero_gradient():
    loss = LOSS.clone().requires_grad_(True)
    agg_loss(loss, MASK, "token-mean").backward()
    torch.testing.assert_close(loss.grad, MASK / 4, atol=0, rtol=0)


# ---- micro-batch / worker invariance ----------------------------------------------------------------------------
def _random_batch(seed=0, b=8, t_len=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t_len + 1, (b,), generator=g)
    lengths[3] = 0  # one fully masked sequence
    mask = (torch.arange(t_len) < lengths[:, None]).float()
    old = torch.randn(b, t_len, generator=g) * 0.3
    new = old + torch.randn(b, t_len, generator=g) * 0.3
    adv = torch.randn(b, t_len, generator=g)
    return old, new, adv, mask


def _vanilla(old, new, adv, mask, clip_ratio_low, clip_ratio_high, clip_ratio_c, mode, **inputs):
    """``compute_policy_loss`` with these clip settings; ``inputs``: rollout_is_weights, global_tokens, global_seqs
    (vanilla reads no covariance setting: they are 0 here)."""
    config = PolicyLossConfig(mode, clip_ratio_low, clip_ratio_high, clip_ratio_c, clip_cov_ratio=0.0, clip_cov_lb=0.0,
                              clip_cov_ub=0.0, kl_cov_ratio=0.0, ppo_kl_coef=0.0, tau_pos=1.0, tau_neg=1.05,
                              dro_beta=None)
    return compute_policy_loss(PolicyLossInputs(old, new, adv, mask, **inputs), config)


def _policy(old, new, adv, mask, mode, **kw):
    return _vanilla(old, new, adv, mask, 0.2, 0.28, 3.0, mode, **kw)[0]


def _value(old, new, adv, mask, mode, **kw):
    return compute_value_loss(new, adv, old, mask, 0.1, mode, **kw)[0]


@pytest.mark.parametrize("loss_fn", [_policy, _value], ids=["policy", "value"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("n_micro", [2, 4])
def test_loss_and_grad_invariant_to_micro_batches(loss_fn, mode, n_micro):
    old, new, adv, mask = _random_batch()
    whole_param = new.clone().requires_grad_(True)
    whole = loss_fn(old, whole_param, adv, mask, mode)
    whole.backward()

    # Counts over the whole mini-batch (a trainer all-reduces the per-worker counts).
    parts = list(zip(*(x.chunk(n_micro) for x in (old, new, adv, mask))))
    tok = sum(global_token_and_seq_counts(p[3])[0] for p in parts)
    seq = sum(global_token_and_seq_counts(p[3])[1] for p in parts)
    total, grads = 0.0, []
    for o, n, a, m in parts:
        p = n.clone().requires_grad_(True)
        contrib = loss_fn(o, p, a, m, mode, global_tokens=tok, global_seqs=seq)
        contrib.backward()  # summing gradients over micro-batches/workers
        total += contrib.item()
        grads.append(p.grad)
    assert total == pytest.approx(whole.item(), abs=1e-6)
    torch.testing.assert_close(torch.cat(grads), whole_param.grad, atol=1e-7, rtol=1e-6)
    assert whole_param.grad.abs().sum() > 0


def test_naive_per_micro_batch_mean_would_differ():
    # Guard that the invariance test can fail: averaging per-micro-batch token-means is not the token-mean.
    old, new, adv, mask = _random_batch()
    whole = _policy(old, new, adv, mask, "token-mean").item()
    naive = sum(_policy(*p, "token-mean").item() for p in zip(*(x.chunk(2) for x in (old, new, adv, mask)))) / 2
    assert abs(naive - whole) > 1e-3


# ---- PPO policy loss --------------------------------------------------------------------------------------------
def test_ppo_clip_and_dual_clip_hand_example():
    # tok0: A=+1, Δlogπ=0.5 → r=e^0.5=1.6487 clipped to 1+0.2=1.2 → L=max(−1.6487, −1.2) = −1.2 (no grad).
    # tok1: A=−1, Δ=2 → r=7.389; PPO term max(7.389, 1.2) = 7.389; dual clip min(7.389, −A·c=3) = 3 (no grad).
    # tok2: A=−1, Δ=−0.5 → r=0.6065 below 1−0.1=0.9 → L=max(0.6065, 0.9) = 0.9 (clipped, no grad).
    # tok3: A=+2, Δ=0 → r=1, L=−2, dL/dlogπ = −A·r = −2.
    # token-mean over 4: (−1.2 + 3 + 0.9 − 2)/4 = 0.175; grad = [0, 0, 0, −2/4].
    old = torch.zeros(1, 4)
    new = torch.tensor([[0.5, 2.0, -0.5, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0]])
    loss, metrics = _vanilla(old, new, adv, torch.ones(1, 4), 0.1, 0.2, 3.0, "token-mean")
    assert loss.item() == pytest.approx(0.175, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 0.0, 0.0, -0.5]]), atol=1e-7, rtol=0)
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.5)        # tok0 and tok2 clipped
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(0.25)  # tok1 dual-clipped
    assert metrics["ppo_kl"].item() == pytest.approx(-0.5, abs=1e-7)   # mean(old − new) = −(0.5+2−0.5)/4
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())


def test_asymmetric_clip_low_differs_from_high():
    # clip_ratio_low=0.1, clip_ratio_high=0.28. A=+1, r=e^0.2=1.2214 < 1.28 → unclipped, L=−1.2214 (a symmetric
    # 0.2 clip would give −1.2). A=−1, r=e^−0.2=0.8187 < 0.9 → L = max(0.8187, 0.9) = 0.9.
    old = torch.zeros(1, 2)
    new = torch.tensor([[0.2, -0.2]])
    adv = torch.tensor([[1.0, -1.0]])
    loss, m = _vanilla(old, new, adv, torch.ones(1, 2), 0.1, 0.28, 3.0, "token-sum")
    assert loss.item() == pytest.approx(-math.exp(0.2) + 0.9, abs=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(0.5)
    sym, _ = _vanilla(old, new, adv, torch.ones(1, 2), 0.2, 0.2, 3.0, "token-sum")
    assert sym.item() == pytest.approx(-1.2 + math.exp(-0.2), abs=1e-6)


def test_rollout_is_weights_multiply_per_token_loss():
    # Δ=0 so r=1 and L = −A = [−1, −2]; weights [0.5, 2] → token-sum −0.5 − 4 = −4.5.
    old = torch.zeros(1, 2)
    loss, _ = _vanilla(old, old.clone(), torch.tensor([[1.0, 2.0]]), torch.ones(1, 2), 0.2, 0.2, 3.0,
                                  "token-sum", rollout_is_weights=torch.tensor([[0.5, 2.0]]))
    assert loss.item() == pytest.approx(-4.5)


def test_ratio_is_clamped_and_masked_tokens_have_no_gradient():
    # A masked token with Δ = 1000 would overflow exp without the ±20 clamp; it must add neither value nor gradient.
    old = torch.zeros(1, 2)
    new = torch.tensor([[0.0, 1000.0]], requires_grad=True)
    loss, _ = _vanilla(old, new, torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 0.0]]), 0.2, 0.2, 3.0,
                                  "token-mean")
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert new.grad.tolist() == [[-1.0, 0.0]]


def test_policy_loss_registry_and_dual_clip_guard():
    assert get_policy_loss_fn("vanilla") is compute_policy_loss
    with pytest.raises(ValueError, match="vanilla"):
        get_policy_loss_fn("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        _vanilla(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.2, 1.0,
                            "token-mean")


# ---- value loss -------------------------------------------------------------------------------------------------
def test_value_loss_hand_example():
    # tok0: V_old=1, V=1.5, R=2, clip ±0.2 → V_clip=1.2; (V−R)²=0.25, (V_clip−R)²=0.64 → max 0.64, clipped (no grad).
    # tok1: V_old=1, V=1.1, R=0 → inside the range, both 1.21; not counted as clipped; grad ½·2·1.1/2 = 0.55.
    # token-mean: ½·(0.64 + 1.21)/2 = 0.4625; vf_clipfrac = 1/2.
    vpreds = torch.tensor([[1.5, 1.1]], requires_grad=True)
    loss, clipfrac = compute_value_loss(vpreds, torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 1.0]]),
                                        torch.ones(1, 2), 0.2, "token-mean")
    assert loss.item() == pytest.approx(0.4625, abs=1e-6)
    assert clipfrac.item() == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, 0.55]]), atol=1e-6, rtol=0)
    # cliprange_value=None: no clipping → ½·(0.25 + 1.21)/2 = 0.365.
    unclipped, cf = compute_value_loss(vpreds, torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 1.0]]),
                                       torch.ones(1, 2), None, "token-mean")
    assert unclipped.item() == pytest.approx(0.365, abs=1e-6) and cf.item() == 0.0
