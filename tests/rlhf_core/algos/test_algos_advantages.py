"""Advantage estimators: hand-derived values, masking, group edge cases, vectorised == loop, registry."""
from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

from rlhf_core.algos import get_adv_estimator, register_adv_est, registered_adv_estimators

ALL = ["gae", "grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "reinforce_plus_plus",
       "reinforce_plus_plus_baseline", "remax"]


def _call(name, **kw):
    base = dict(gamma=1.0, lam=1.0, epsilon=1e-6, norm_adv_by_std_in_grpo=True)
    base.update(kw)
    return get_adv_estimator(name)(**base)


def _outcome(scores, t_len=4, lengths=None):
    """Rewards with each score on the last valid token; lengths default to t_len (no padding)."""
    b = len(scores)
    lengths = lengths or [t_len] * b
    r = torch.zeros(b, t_len)
    m = torch.zeros(b, t_len)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        m[i, :n] = 1
        r[i, n - 1] = s
    return r, m


# ---- reference numbers from SEMANTICS.md: 8 samples, 3 correct --------------------------------------------------
@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized"])
def test_grpo_reference_8_samples_3_correct(name):
    # mean = 3/8 = 0.375; unbiased var = 8/7 · 0.375·0.625 = 0.267857, std = 0.517549.
    # correct: 0.625/0.517549 = 1.20761; wrong: −0.375/0.517549 = −0.72457.
    r, m = _outcome([1, 1, 1, 0, 0, 0, 0, 0])
    adv, ret = _call(name, token_level_rewards=r, response_mask=m, index=np.array(["p"] * 8, dtype=object))
    assert adv.dtype == torch.float32 and adv.shape == (8, 4)
    assert adv[0, 0].item() == pytest.approx(1.20761, abs=1e-4)
    assert adv[7, 3].item() == pytest.approx(-0.72457, abs=1e-4)
    assert torch.equal(adv, ret)


@pytest.mark.parametrize("name", ["rloo", "rloo_vectorized"])
def test_rloo_reference_8_samples_3_correct(name):
    # correct: 1 − mean of the 7 others (2/7) = 5/7 = 0.714286; wrong: 0 − 3/7 = −0.428571.
    r, m = _outcome([1, 1, 1, 0, 0, 0, 0, 0])
    adv, _ = _call(name, token_level_rewards=r, response_mask=m, index=np.array(["p"] * 8, dtype=object))
    assert adv[1, 2].item() == pytest.approx(5 / 7, abs=1e-6)
    assert adv[4, 0].item() == pytest.approx(-3 / 7, abs=1e-6)


def test_grpo_without_std_norm_is_centered_score():
    r, m = _outcome([1, 1, 1, 0, 0, 0, 0, 0])
    adv, _ = _call("grpo", token_level_rewards=r, response_mask=m, index=["p"] * 8, norm_adv_by_std_in_grpo=False)
    assert adv[0, 0].item() == pytest.approx(0.625, abs=1e-7)
    assert adv[5, 0].item() == pytest.approx(-0.375, abs=1e-7)


# ---- masked / padded cases: every estimator is 0 on padding and correct on valid tokens ---------------------------
@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized", "rloo", "rloo_vectorized"])
def test_outcome_estimators_padded(name):
    # group "a": scores 1 and 0 (lengths 2 and 4); group "b": 3 and 1 (lengths 1 and 3).
    # grpo: a → ±0.5/0.70711 = ±0.70711; b → ±1/1.41421 = ±0.70711.  rloo (n=2): a → ±1, b → ±2.
    r, m = _outcome([1, 0, 3, 1], lengths=[2, 4, 1, 3])
    adv, _ = _call(name, token_level_rewards=r, response_mask=m, index=np.array(["a", "a", "b", "b"], dtype=object))
    big = 1.0 if name.startswith("rloo") else 0.5 / (0.5 ** 0.5 + 1e-6)
    small = 2.0 if name.startswith("rloo") else 1.0 / (2 ** 0.5 + 1e-6)
    expected = torch.tensor([[big, big, 0, 0], [-big] * 4, [small, 0, 0, 0], [-small, -small, -small, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)


def test_reinforce_plus_plus_returns_and_whitening_with_padding():
    # γ = 0.5. seq0 rewards [0,0,1 | pad], seq1 [0,2 | pad,pad]. G backward: seq0 [0.25, 0.5, 1], seq1 [1, 2].
    r = torch.tensor([[0.0, 0, 1, 9], [0, 2, 9, 9]])  # 9s sit on padding and must be ignored
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv, ret = _call("reinforce_plus_plus", token_level_rewards=r, response_mask=m, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 1, 0], [1, 2, 0, 0]]), atol=1e-7, rtol=0)
    g = [0.25, 0.5, 1, 1, 2]
    mu, sd = statistics.mean(g), statistics.stdev(g)  # unbiased, as verl's masked_whiten
    exp = torch.tensor([[(0.25 - mu) / sd, (0.5 - mu) / sd, (1 - mu) / sd, 0], [(1 - mu) / sd, (2 - mu) / sd, 0, 0]])
    torch.testing.assert_close(adv, exp, atol=1e-5, rtol=0)


def test_reinforce_plus_plus_skips_a_masked_hole():
    # mask [1,0,1], rewards [0, 7 (masked: ignored), 1], γ = 0.5 → G = [0.5, 0, 1]: the hole neither adds its
    # reward nor resets the running return.
    r = torch.tensor([[0.0, 7.0, 1.0], [1.0, 0.0, 0.0]])
    m = torch.tensor([[1, 0, 1], [1, 1, 1]])
    _, ret = _call("reinforce_plus_plus", token_level_rewards=r, response_mask=m, gamma=0.5)
    torch.testing.assert_close(ret[0], torch.tensor([0.5, 0.0, 1.0]), atol=1e-7, rtol=0)


def test_reinforce_plus_plus_baseline_padded():
    # group a: s = [2, 0] → centered [1, −1]; group b (one sample): mean 0 → centered 3.
    # Broadcast over valid tokens: [1,1,1], [−1], [3,3]; then whitened over those 6 values.
    r, m = _outcome([2, 0, 3], t_len=3, lengths=[3, 1, 2])
    adv, ret = _call("reinforce_plus_plus_baseline", token_level_rewards=r, response_mask=m, index=["a", "a", "b"])
    vals = [1, 1, 1, -1, 3, 3]
    mu, sd = statistics.mean(vals), statistics.stdev(vals)
    w = lambda x: (x - mu) / sd  # noqa: E731
    exp = torch.tensor([[w(1)] * 3, [w(-1), 0, 0], [w(3), w(3), 0]])
    torch.testing.assert_close(adv, exp, atol=1e-5, rtol=0)
    assert torch.equal(adv, ret)


def test_remax_padded():
    # rewards [0,1,2 | pad 5]: returns-to-go over valid tokens [3,3,2,0]; baseline 1.5 → A = [1.5,1.5,0.5,0].
    r = torch.tensor([[0.0, 1, 2, 5]])
    m = torch.tensor([[1, 1, 1, 0]])
    adv, ret = _call("remax", token_level_rewards=r, response_mask=m, reward_baselines=torch.tensor([1.5]))
    torch.testing.assert_close(ret, torch.tensor([[3.0, 3, 2, 0]]), atol=0, rtol=0)
    torch.testing.assert_close(adv, torch.tensor([[1.5, 1.5, 0.5, 0]]), atol=0, rtol=0)


# ---- GAE -------------------------------------------------------------------------------------------------------
def test_gae_hand_example_with_masked_hole():
    # γ = 0.9, λ = 0.8 (γλ = 0.72); mask [1,1,0,1]; V = [1,2,100,3] (100 is masked: never read);
    # r = [0,0,5,1] (5 is masked: never read).
    # t=3: δ = 1 + 0 − 3 = −2, A3 = −2, next V = 3.     t=2: masked → A and next V carry (−2, 3).
    # t=1: δ = 0 + 0.9·3 − 2 = 0.7, A1 = 0.7 + 0.72·(−2) = −0.74.
    # t=0: δ = 0 + 0.9·2 − 1 = 0.8, A0 = 0.8 + 0.72·(−0.74) = 0.2672.
    # returns = A + V = [1.2672, 1.26, 0 (masked), 1].
    r = torch.tensor([[0.0, 0.0, 5.0, 1.0]])
    v = torch.tensor([[1.0, 2.0, 100.0, 3.0]])
    m = torch.tensor([[1, 1, 0, 1]])
    adv, ret = _call("gae", token_level_rewards=r, values=v, response_mask=m, gamma=0.9, lam=0.8)
    torch.testing.assert_close(ret, torch.tensor([[1.2672, 1.26, 0.0, 1.0]]), atol=1e-6, rtol=0)
    raw = [0.2672, -0.74, -2.0]
    mu, sd = statistics.mean(raw), statistics.stdev(raw)
    exp = torch.tensor([[(raw[0] - mu) / sd, (raw[1] - mu) / sd, 0.0, (raw[2] - mu) / sd]])
    torch.testing.assert_close(adv, exp, atol=1e-5, rtol=0)
    # The masked value and reward really are ignored: changing them changes nothing.
    adv2, ret2 = _call("gae", token_level_rewards=torch.tensor([[0.0, 0, -50, 1]]),
                       values=torch.tensor([[1.0, 2, -7, 3]]), response_mask=m, gamma=0.9, lam=0.8)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)


def test_gae_right_padding_equals_unpadded():
    # Padding after the last token must not change the valid tokens' returns.
    torch.manual_seed(0)
    r, v = torch.randn(3, 5), torch.randn(3, 5)
    m = torch.ones(3, 5)
    _, ret = _call("gae", token_level_rewards=r, values=v, response_mask=m, gamma=0.99, lam=0.95)
    pad = lambda x, fill: torch.cat([x, torch.full((3, 2), fill)], dim=1)  # noqa: E731
    _, ret_p = _call("gae", token_level_rewards=pad(r, 4.0), values=pad(v, -9.0), response_mask=pad(m, 0.0),
                     gamma=0.99, lam=0.95)
    torch.testing.assert_close(ret_p[:, :5], ret, atol=1e-6, rtol=0)
    assert torch.equal(ret_p[:, 5:], torch.zeros(3, 2))


# ---- group edge cases ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "reinforce_plus_plus_baseline"])
def test_identical_rewards_give_zero_advantage(name):
    r, m = _outcome([1, 1, 1, 1, 0.5, 0.5], lengths=[4, 2, 3, 1, 4, 4])
    adv, _ = _call(name, token_level_rewards=r, response_mask=m, index=[0, 0, 0, 0, 1, 1])
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized", "rloo", "rloo_vectorized"])
@pytest.mark.parametrize("epsilon", [1e-6, 0.0])
def test_rounding_only_std_does_not_explode(name, epsilon):
    # Scores 0.3 and the next float32 above it: the std (~2e-8) is pure rounding. verl would give
    # ±0.7/(1+ε/std) ≈ 0.015 with ε=1e-6 and ±0.707 with ε=0; the group is constant, so A must be exactly 0.
    s = torch.tensor(0.3)
    up = torch.nextafter(s, torch.tensor(1.0))
    r = torch.stack([s, up, s, up]).reshape(4, 1)
    adv, _ = _call(name, token_level_rewards=r, response_mask=torch.ones(4, 1), index=["g"] * 4, epsilon=epsilon)
    assert torch.equal(adv, torch.zeros(4, 1))


@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized"])
def test_group_of_one_has_mean_zero_std_one(name):
    # "a" alone with s = 2 → (2 − 0)/(1 + 1e-6); "b" = {1, 0} → ±0.5/(0.70711 + 1e-6).
    r, m = _outcome([2, 1, 0], t_len=2)
    adv, _ = _call(name, token_level_rewards=r, response_mask=m, index=np.array(["a", "b", "b"], dtype=object))
    assert adv[0, 0].item() == pytest.approx(2 / (1 + 1e-6), abs=1e-6)
    assert adv[1, 1].item() == pytest.approx(0.5 / (0.5 ** 0.5 + 1e-6), abs=1e-6)


@pytest.mark.parametrize("name", ["rloo", "rloo_vectorized"])
def test_rloo_group_of_one_is_an_error(name):
    r, m = _outcome([1, 0, 1], t_len=2)
    with pytest.raises(ValueError, match="at least 2"):
        _call(name, token_level_rewards=r, response_mask=m, index=["a", "a", "b"])


# ---- vectorised == loop ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("index_kind", ["object", "tensor", "list"])
def test_vectorized_equals_loop_on_random_inputs(norm, index_kind):
    g = torch.Generator().manual_seed(1)
    for trial in range(5):
        n_groups, n = 7, 2 + trial
        ids = torch.arange(n_groups).repeat_interleave(n)[torch.randperm(n_groups * n, generator=g)]
        b, t_len = ids.numel(), 6
        lengths = torch.randint(1, t_len + 1, (b,), generator=g)
        m = (torch.arange(t_len) < lengths[:, None]).float()
        r = torch.randn(b, t_len, generator=g) * m
        index = {"object": np.array([f"u{i}" for i in ids.tolist()], dtype=object), "tensor": ids,
                 "list": ids.tolist()}[index_kind]
        for slow, fast in [("grpo", "grpo_vectorized"), ("rloo", "rloo_vectorized")]:
            a1, r1 = _call(slow, token_level_rewards=r, response_mask=m, index=index, norm_adv_by_std_in_grpo=norm)
            a2, r2 = _call(fast, token_level_rewards=r, response_mask=m, index=index, norm_adv_by_std_in_grpo=norm)
            torch.testing.assert_close(a1, a2, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(r1, r2, atol=1e-6, rtol=1e-6)
            assert a1.abs().sum() > 0


# ---- registry --------------------------------------------------------------------------------------------------
def test_registry_has_all_names_and_refuses_duplicates():
    assert set(ALL) <= set(registered_adv_estimators())
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(lambda **kw: None)
    with pytest.raises(ValueError, match="grpo_vectorized"):  # the error lists the registered names
        get_adv_estimator("grpo_typo")


def test_estimators_ignore_unused_keywords():
    r, m = _outcome([1, 0], t_len=2)
    for name in ALL:
        adv, ret = _call(name, token_level_rewards=r, response_mask=m, index=["a", "a"], values=torch.zeros(2, 2),
                         reward_baselines=torch.zeros(2), config=None)
        assert adv.shape == ret.shape == (2, 2) and adv.dtype == ret.dtype == torch.float32
        assert torch.isfinite(adv).all()


def test_missing_inputs_are_clear_errors():
    r, m = _outcome([1, 0], t_len=2)
    with pytest.raises(ValueError, match="critic values"):
        _call("gae", token_level_rewards=r, response_mask=m, values=None)
    with pytest.raises(ValueError, match="reward_baselines"):
        _call("remax", token_level_rewards=r, response_mask=m)
