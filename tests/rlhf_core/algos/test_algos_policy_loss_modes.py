"""Policy loss modes gspo, gpg, geo_mean, clip_cov, kl_cov: hand-derived values and gradients (equal to verl 0.6's
``core_algos`` on the same inputs: each case was also run through verl's functions while writing these tests)."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.algos import PolicyLossConfig, PolicyLossInputs, get_policy_loss_fn
from rlhf_core.algos.policy_loss_cov import clip_cov_selection, kl_cov_selection
from omegaconf import OmegaConf

SCALARS = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "clip_cov_ratio": 0.0002,
           "clip_cov_lb": 1.0, "clip_cov_ub": 5.0, "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1, "tau_pos": 1.0,
           "tau_neg": 1.05, "dro_beta": None}
INPUT_KEYS = ("rollout_is_weights", "global_tokens", "global_seqs")


def call_loss(mode, old, lp, adv, mask, agg="token-mean", **over):
    """The registered loss ``mode`` on these tensors with ``SCALARS`` updated by ``over`` (its ``INPUT_KEYS`` go into
    the :class:`PolicyLossInputs`): ``(pg_loss, metrics)``."""
    inputs = PolicyLossInputs(old, lp, adv, mask, **{k: v for k, v in over.items() if k in INPUT_KEYS})
    scalars = {**SCALARS, **{k: v for k, v in over.items() if k not in INPUT_KEYS}}
    return get_policy_loss_fn(mode)(inputs, PolicyLossConfig(loss_agg_mode=agg, **scalars))


def run(mode, old, lp, adv, mask, agg="token-mean", **over):
    """(loss, metrics as floats, d loss / d log_prob)."""
    lp = lp.clone().requires_grad_(True)
    loss, m = call_loss(mode, old, lp, adv, mask, agg, **over)
    loss.backward()
    return loss.item(), {k: float(v) for k, v in m.items()}, lp.grad


def test_registry_and_scalars_from_the_actor_config():
    for mode in ("vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean"):
        assert callable(get_policy_loss_fn(mode))
    actor = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
                              "loss_agg_mode": "seq-mean-token-sum", "tau_pos": 1.5, "tau_neg": 2.0,
                              "policy_loss": {"loss_mode": "kl_cov", "clip_cov_ratio": 0.001, "clip_cov_lb": 0.5,
                                              "clip_cov_ub": 4.0, "kl_cov_ratio": 0.01, "ppo_kl_coef": 0.3,
                                              "dro_beta": 0.7}})
    config = PolicyLossConfig.from_actor_config(actor)
    # clip_ratio_low is null → clip_ratio (0.2), as verl
    assert config == PolicyLossConfig(loss_agg_mode="seq-mean-token-sum", clip_ratio_low=0.2, clip_ratio_high=0.28,
                                      clip_ratio_c=3.0, clip_cov_ratio=0.001, clip_cov_lb=0.5, clip_cov_ub=4.0,
                                      kl_cov_ratio=0.01, ppo_kl_coef=0.3, tau_pos=1.5, tau_neg=2.0, dro_beta=0.7)
    assert config.actor_config is actor


# ---- gspo ------------------------------------------------------------------------------------------------------
def test_gspo_uses_the_sequence_ratio_and_seq_mean_token_mean():
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1]])
    old = torch.zeros(2, 3)
    lp = torch.tensor([[0.1, -0.1, 5.0], [0.3, 0.3, 0.3]])  # 5.0 sits on a padded position: ignored
    adv = torch.ones(2, 3)
    loss, m, grad = run("gspo", old, lp, adv, mask, agg="token-mean")
    # row 0: mean log-ratio (0.1 − 0.1)/2 = 0 → s_0 = 1 on both tokens (the vanilla token ratios would be e^±0.1);
    #        L = −A·s = −1 per token, row mean −1.
    # row 1: mean log-ratio 0.3 → s_1 = e^0.3 = 1.3498588 > 1.2 and A > 0 → clipped: L = −1.2 per token.
    # seq-mean-token-mean (loss_agg_mode ignored, as verl): (−1 − 1.2)/2 = −1.1 (token-mean would give −1.12).
    assert loss == pytest.approx(-1.1, abs=1e-6)
    # ∂s_{i,t}/∂logπ_t = s_i: row 0 tokens get −A·1·(1/2 tokens)·(1/2 rows) = −0.25; row 1 is clipped → 0.
    torch.testing.assert_close(grad, torch.tensor([[-0.25, -0.25, 0.0], [0.0, 0.0, 0.0]]))
    # clipfrac: the 3 tokens of row 1 of 5 valid; ppo_kl = −(0.1 − 0.1 + 3·0.3)/5 = −0.18; no dual clip.
    assert m == pytest.approx({"pg_clipfrac": 0.6, "ppo_kl": -0.18, "pg_clipfrac_lower": 0.0}, abs=1e-6)


# ---- gpg -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("agg, expected, grad", [
    # L = −A·logπ: row 0 → −1·(−1) = 1, −1·(−2) = 2; row 1 → −(−2)·(−0.5) = −1 (t=1 padded).
    ("token-mean", 2 / 3, [[-1 / 3, -1 / 3], [2 / 3, 0.0]]),          # (1 + 2 − 1)/3; ∂/∂logπ = −A/3
    ("seq-mean-token-sum", 1.0, [[-0.5, -0.5], [1.0, 0.0]]),          # mean(3, −1); ∂/∂logπ = −A/2
])
def test_gpg_is_minus_advantage_times_log_prob(agg, expected, grad):
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, m, g = run("gpg", lp - 0.1, lp, adv, mask, agg=agg)
    assert loss == pytest.approx(expected, abs=1e-6)
    torch.testing.assert_close(g, torch.tensor(grad))
    # logπ_old − logπ = −0.1 on every token (verl reports 0 for this metric)
    assert m == pytest.approx({"pg_clipfrac": 0.0, "ppo_kl": -0.1, "pg_clipfrac_lower": 0.0}, abs=1e-6)


# ---- geo_mean --------------------------------------------------------------------------------------------------
def test_geo_mean_clips_log_ratios_per_token_and_averages_geometrically():
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1]])
    delta = torch.tensor([[0.1, 0.5, 0.0], [-0.5, 0.1, 0.0]])
    old = torch.full((2, 3), -1.0)
    adv = torch.tensor([[1.0, 1, 1], [-1, -1, -1]])
    loss, m, grad = run("geo_mean", old, old + delta, adv, mask, agg="token-sum")
    # clip in log space to [−0.2, 0.2]. Row 0 (A > 0 keeps min(δ, clip δ)): [0.1, 0.2] → r_0 = e^0.15 = 1.1618342,
    # Â_0 = 1 → L_0 = −1.1618342. Row 1 (A < 0 keeps max): [−0.2, 0.1, 0.0] → r_1 = e^(−0.1/3) = 0.9672161,
    # Â_1 = −1 → L_1 = +0.9672161. Mean over the 2 sequences (loss_agg_mode ignored): −0.0973091.
    assert loss == pytest.approx((-math.exp(0.15) + math.exp(-0.1 / 3)) / 2, abs=1e-6)
    # ∂L/∂logπ_t = −Â·r/|y|/2 on unclipped tokens, 0 on clipped ones:
    # row 0: −1.1618342/2/2 = −0.2904586 (t=0), t=1 clipped; row 1: t=0 clipped, 0.9672161/3/2 = 0.1612027.
    expected = torch.tensor([[-math.exp(0.15) / 4, 0.0, 0.0], [0.0, math.exp(-0.1 / 3) / 6, math.exp(-0.1 / 3) / 6]])
    torch.testing.assert_close(grad, expected)
    # clipped: (0,1) with A > 0 and (1,0) with A < 0, 1 of 5 each; ppo_kl = −(0.1+0.5−0.5+0.1+0)/5 = −0.04
    assert m == pytest.approx({"pg_clipfrac": 0.2, "ppo_kl": -0.04, "pg_clipfrac_lower": 0.2}, abs=1e-6)


def test_geo_mean_rollout_is_weights_enter_as_a_geometric_mean():
    mask = torch.ones(1, 2)
    old = torch.zeros(1, 2)
    w = torch.tensor([[1.0, 4.0]])
    loss, _, _ = run("geo_mean", old, old, torch.ones(1, 2), mask, rollout_is_weights=w)
    # r = 1, Â = 1 → L = −1, times the geometric mean of the weights sqrt(1·4) = 2 → −2
    assert loss == pytest.approx(-2.0, abs=1e-6)


# ---- clip_cov --------------------------------------------------------------------------------------------------
# Six valid tokens. A = ±2 (mean 0); logπ = [[−1, −1, −3], [−2, −2, −2]] (mean −11/6), so
# Cov = (A − 0)·(logπ + 11/6) = [[1.667, 1.667, −2.333], [0.333, 0.333, 0.333]]. Candidates need 1 < Cov < 5:
# (0,0) and (0,1); but (0,1) has ratio e^0.5 = 1.6487 > 1.2 with A > 0, i.e. it is already clipped by the ratio
# clip and excluded. n = max(⌊0.0002·6⌋, 1) = 1 → exactly token (0,0) is detached.
CC_ADV = torch.tensor([[2.0, 2, 2], [-2, -2, -2]])
CC_LP = torch.tensor([[-1.0, -1, -3], [-2, -2, -2]])
CC_OLD = CC_LP - torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, 0.0]])


def test_clip_cov_detaches_the_hand_picked_token():
    mask = torch.ones(2, 3)
    loss, m, grad = run("clip_cov", CC_OLD, CC_LP, CC_ADV, mask)
    # per-token L: (0,0) detached → 0; (0,1) clipped −2·1.2 = −2.4; (0,2) −2·1 = −2; row 1: +2 each.
    # token-mean: (0 − 2.4 − 2 + 6)/6 = 0.2666667 (vanilla without the detach: −0.0666667).
    assert loss == pytest.approx(1.6 / 6, abs=1e-6)
    # ∂L/∂logπ = −A·r/6 where the gradient flows: 0 at (0,0) (detached) and (0,1) (clipped).
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, -2 / 6], [2 / 6, 2 / 6, 2 / 6]]))
    # pg_clipfrac = detached fraction 1/6; ppo_kl = −0.5/6
    assert m == pytest.approx({"pg_clipfrac": 1 / 6, "ppo_kl": -0.5 / 6, "pg_clipfrac_lower": 0.0}, abs=1e-6)


def test_clip_cov_bounds_and_random_choice_among_candidates():
    mask = torch.ones(2, 3)
    clipped = torch.zeros(2, 3, dtype=torch.bool)
    # without the ratio clip both (0,0) and (0,1) are candidates; n = 1 → one of them, drawn by the generator
    picks = {tuple(torch.nonzero(clip_cov_selection(CC_LP, CC_ADV, mask, clipped, 0.0002, 1.0, 5.0,
                                                    torch.Generator().manual_seed(s))).tolist()[0]) for s in range(20)}
    assert picks == {(0, 0), (0, 1)}
    sel = clip_cov_selection(CC_LP, CC_ADV, mask, clipped, 0.0002, 1.0, 5.0, torch.Generator().manual_seed(3))
    assert torch.equal(sel, clip_cov_selection(CC_LP, CC_ADV, mask, clipped, 0.0002, 1.0, 5.0,
                                               torch.Generator().manual_seed(3)))
    # ⌊0.34·6⌋ = 2 → both; an upper bound below 1.667 leaves no candidate; the lower bound 0 admits the row-1 tokens
    assert torch.nonzero(clip_cov_selection(CC_LP, CC_ADV, mask, clipped, 0.34, 1.0, 5.0)).tolist() == [[0, 0], [0, 1]]
    assert not clip_cov_selection(CC_LP, CC_ADV, mask, clipped, 0.34, 1.0, 1.5).any()
    assert clip_cov_selection(CC_LP, CC_ADV, mask, clipped, 1.0, 0.0, 5.0).sum() == 5  # all but Cov = −2.333
    # a padded token is never selected, whatever its covariance
    pad = torch.tensor([[0.0, 1, 1], [1, 1, 1]])
    assert not clip_cov_selection(CC_LP, CC_ADV, pad, clipped, 1.0, -9.0, 9.0)[0, 0]
    with pytest.raises(ValueError, match="clip_cov_ratio"):
        run("clip_cov", CC_OLD, CC_LP, CC_ADV, mask, clip_cov_ratio=0.0)


# ---- kl_cov ----------------------------------------------------------------------------------------------------
# Six valid tokens. A = ±2; logπ = [[−1, −1.5, −3], [−2, −2, −2]] (mean −1.9166667), so
# Cov = [[1.8333, 0.8333, −2.1667], [0.1667, 0.1667, 0.1667]]: the largest is (0,0), then (0,1).
# δ = logπ − logπ_old = [[0.2, −0.1, 0], [0, 0, 0]].
KC_ADV = CC_ADV
KC_LP = torch.tensor([[-1.0, -1.5, -3], [-2, -2, -2]])
KC_OLD = KC_LP - torch.tensor([[0.2, -0.1, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize("ratio, picked, expected_loss, grad01", [
    # k = max(1, ⌊6·0.0002⌋) = 1 → (0,0) only. L: (0,0) −2e^0.2 + 0.1·0.2 = −2.4228056; (0,1) −2e^−0.1 = −1.8096749;
    # (0,2) −2; row 1 +2 each → token-mean (−2.4228056 − 1.8096749 − 2 + 6)/6 = −0.0387467.
    # ∂/∂logπ at (0,1): −2e^−0.1/6 = −0.3016125.
    (0.0002, [[0, 0]], -0.0387467, -2 * math.exp(-0.1) / 6),
    # k = ⌊6·0.34⌋ = 2 → (0,0), (0,1): (0,1) adds 0.1·|−0.1| = 0.01 → −0.0370801; its gradient adds
    # 0.1·sign(δ)/6 = −0.1/6 → −0.3182791.
    (0.34, [[0, 0], [0, 1]], -0.0370801, (-2 * math.exp(-0.1) - 0.1) / 6),
])
def test_kl_cov_penalises_the_largest_covariance_tokens(ratio, picked, expected_loss, grad01):
    mask = torch.ones(2, 3)
    assert torch.nonzero(kl_cov_selection(KC_LP, KC_ADV, mask, ratio)).tolist() == picked
    loss, m, grad = run("kl_cov", KC_OLD, KC_LP, KC_ADV, mask, kl_cov_ratio=ratio)
    assert loss == pytest.approx(expected_loss, abs=1e-6)
    # (0,0): (−2e^0.2 + 0.1·sign(0.2))/6 = −0.3904676; (0,2): −2/6; row 1: +2/6 (r = 1, no penalty)
    expected = torch.tensor([[(-2 * math.exp(0.2) + 0.1) / 6, grad01, -2 / 6], [2 / 6, 2 / 6, 2 / 6]])
    torch.testing.assert_close(grad, expected)
    # ppo_kl is the mean |δ| = (0.2 + 0.1)/6 (as verl logs for this loss)
    assert m == pytest.approx({"pg_clipfrac": 0.0, "ppo_kl": 0.05, "pg_clipfrac_lower": 0.0}, abs=1e-6)


def test_kl_cov_ignores_padding_and_rejects_a_zero_ratio():
    pad = torch.tensor([[0.0, 1, 1], [1, 1, 1]])  # (0,0), the top token, is padding now
    sel = kl_cov_selection(KC_LP, KC_ADV, pad, 0.0002)
    assert not sel[0, 0] and sel.sum() == 1
    assert not kl_cov_selection(KC_LP, KC_ADV, torch.zeros(2, 3), 0.5).any()
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        run("kl_cov", KC_OLD, KC_LP, KC_ADV, torch.ones(2, 3), kl_cov_ratio=0.0)


@pytest.mark.parametrize("mode", ["gspo", "gpg", "geo_mean", "clip_cov", "kl_cov"])
def test_micro_batch_contributions_sum_to_the_batch_loss(mode):
    # with global counts, two halves' contributions add up to the whole batch's loss (selection-free settings for
    # the covariance losses: clip_cov with an empty interval, kl_cov penalising every token)
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(5) < torch.tensor([[5], [3], [4], [2]])).float()
    old = torch.randn(4, 5, generator=g) * 0.2 - 1
    lp = old + torch.randn(4, 5, generator=g) * 0.1
    adv = torch.randn(4, 1, generator=g).expand(4, 5).contiguous()
    over = {"clip_cov_lb": 10.0, "kl_cov_ratio": 1.0}
    agg = "seq-mean-token-mean"
    whole, _ = call_loss(mode, old, lp, adv, mask, agg, **over)
    n_tok, n_seq = float(mask.sum()), 4.0
    parts = [call_loss(mode, old[s], lp[s], adv[s], mask[s], agg, global_tokens=n_tok, global_seqs=n_seq, **over)[0]
             for s in (slice(0, 2), slice(2, 4))]
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item(), abs=1e-6)
