"""Policy loss modes added for verl 0.9.1 (cispo, dppo_tv, dppo_kl, sapo, dro): hand-derived values and gradients.

Every case is 2×3 with one padded position (row 1, t = 2) holding values that would change the loss if it were
read; 5 valid tokens, so token-mean divides by 5. ``grad`` is ∂loss/∂log_prob. The numbers were also reproduced
with verl 0.9.1's ``core_algos`` functions on the same inputs while writing these tests.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.algos import PolicyLossConfig, PolicyLossInputs, get_policy_loss_fn
from rlhf_core.config import ConfigError, load_config

from tests.rlhf_core.algos.test_algos_policy_loss_modes import SCALARS, call_loss, run

MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
ACTOR = "actor_rollout_ref.actor."
PL = ACTOR + "policy_loss."


def test_registered_under_verls_names():
    for mode in ("cispo", "dppo_tv", "dppo_kl", "sapo", "dro"):
        assert callable(get_policy_loss_fn(mode))


# ---- cispo (ε_low = ε_high = 0.2) ------------------------------------------------------------------------------
# δ = logπ − logπ_old; r = e^δ = [[e^0.1 = 1.1051709, e^0.5 = 1.6487213, e^−0.5 = 0.6065307], [e^0.05 = 1.0512711,
# e^−0.1 = 0.9048374, ·]]; w = clip(r, 0.8, 1.2) = [[1.1051709, 1.2 (above), 0.8 (below)], [1.0512711, 0.9048374]].
# L = −w·A·logπ: 1.1051709·1·1 = 1.1051709; 1.2·1·2 = 2.4; −0.8·(−1)·(−0.5) = −0.4; −1.0512711·(−2)·(−1.5) =
# −3.1538133; −0.9048374·2·(−1) = 1.8096748. Σ = 1.7610324, token-mean /5 = 0.3522065.
# ∂L/∂logπ = −w·A/5 (the clipped tokens keep their gradient, unlike PPO): [[−0.2210342, −0.24, 0.16],
# [0.4205084, −0.3619350, 0]]. pg_clipfrac = 2/5; ppo_kl = −(0.1 + 0.5 − 0.5 + 0.05 − 0.1)/5 = −0.01.
CI_LP = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, -3.0]])
CI_OLD = CI_LP - torch.tensor([[0.1, 0.5, -0.5], [0.05, -0.1, 9.0]])
CI_ADV = torch.tensor([[1.0, 1.0, -1.0], [-2.0, 2.0, 7.0]])


def test_cispo_clips_the_detached_weight_and_keeps_every_gradient():
    loss, m, grad = run("cispo", CI_OLD, CI_LP, CI_ADV, MASK)
    assert loss == pytest.approx(0.3522065, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.2210342, -0.24, 0.16], [0.4205084, -0.3619350, 0.0]]))
    assert m == pytest.approx({"pg_clipfrac": 0.4, "ppo_kl": -0.01, "pg_clipfrac_lower": 0.0}, abs=1e-6)
    # a wider clip (ε_high = 1) lets (0,1) keep r = 1.6487213: L(0,1) = 3.2974425, loss (1.7610324 + 0.8974425)/5
    loss_wide, m_wide, _ = run("cispo", CI_OLD, CI_LP, CI_ADV, MASK, clip_ratio_high=1.0)
    assert loss_wide == pytest.approx(0.5316950, abs=1e-6) and m_wide["pg_clipfrac"] == pytest.approx(0.2)


# ---- dppo_tv (δ_low = δ_high = 0.2, c = 3) ---------------------------------------------------------------------
# p_old → p per token, and the TV test on p − p_old:
#   (0,0) A= 1: 0.5 → 0.6, +0.1 ≤ 0.2 valid;        (0,1) A= 1: 0.3 → 0.6, +0.3 > 0.2 outside (PPO would clip too)
#   (0,2) A=−1: 0.5 → 0.2, −0.3 < −0.2 outside;      (1,0) A=−2: 0.4 → 0.3, −0.1 valid
#   (1,1) A=0.5: 0.01 → 0.05, +0.04 valid although r = 5 (PPO's ratio clip would cut it); r truncated to c = 3.
# L = −A·min(r, 3)·logπ on valid tokens: (0,0) −1.2·ln 0.6 = 0.6129907; (1,0) 2·0.75·ln 0.3 = −1.8059592;
# (1,1) −0.5·3·ln 0.05 = 4.4935984. Σ = 3.3006299, /5 = 0.6601260. ∂/∂logπ = −A·min(r, 3)/5 on valid tokens:
# (0,0) −0.24, (1,0) +0.3, (1,1) −0.3. pg_clipfrac = 2/5 (outside), pg_clipfrac_lower = 1/5 (truncated (1,1));
# ppo_kl = ln(0.5/0.6 · 0.3/0.6 · 0.5/0.2 · 0.4/0.3 · 0.01/0.05)/5 = ln(0.2777778)/5 = −0.2561868.
TV_P = torch.tensor([[0.6, 0.6, 0.2], [0.3, 0.05, 0.1]])
TV_OLD_P = torch.tensor([[0.5, 0.3, 0.5], [0.4, 0.01, 0.9]])
TV_ADV = torch.tensor([[1.0, 1.0, -1.0], [-2.0, 0.5, 3.0]])


def test_dppo_tv_masks_by_probability_difference_and_truncates_the_ratio():
    loss, m, grad = run("dppo_tv", TV_OLD_P.log(), TV_P.log(), TV_ADV, MASK)
    assert loss == pytest.approx(0.6601260, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.24, 0.0, 0.0], [0.3, -0.3, 0.0]]))
    assert m == pytest.approx({"pg_clipfrac": 0.4, "ppo_kl": -0.2561868, "pg_clipfrac_lower": 0.2}, abs=1e-6)
    # δ_high = 0.35 brings (0,1) inside: + (−1·2·ln 0.6 = 1.0216512)/5;
    # c = 10 leaves r = 5 at (1,1): + (−0.5·(5 − 3)·ln 0.05 = 2.9957323)/5
    loss_wide, m_wide, _ = run("dppo_tv", TV_OLD_P.log(), TV_P.log(), TV_ADV, MASK, clip_ratio_high=0.35,
                               clip_ratio_c=10.0)
    assert loss_wide == pytest.approx((3.3006299 + 1.0216512 + 2.9957323) / 5, abs=1e-6)
    assert m_wide["pg_clipfrac"] == pytest.approx(0.2) and m_wide["pg_clipfrac_lower"] == 0.0


# ---- dppo_kl (δ_low = δ_high = 0.2, c = 3) ---------------------------------------------------------------------
# D = KL(Bern(p_old) ‖ Bern(p)) = p_old·ln(p_old/p) + (1 − p_old)·ln((1 − p_old)/(1 − p)) (the 1e-8 is negligible):
#   (0,0) A= 1: 0.3 → 0.6: 0.3·ln 0.5 + 0.7·ln(0.7/0.4) = 0.1837869 ≤ 0.2 valid (dppo_tv: |Δp| = 0.3, outside)
#   (0,1) A= 2: 0.5 → 0.9: 0.5·ln(5/9) + 0.5·ln 5 = 0.5108256 > 0.2 and p rose with A > 0: outside
#   (0,2) A= 1: 0.5 → 0.2: 0.5·ln 2.5 + 0.5·ln(0.625) = 0.2231436 > 0.2, but p fell with A > 0: valid
#   (1,0) A=−1: 0.5 → 0.2: D = 0.2231436 > 0.2 and p fell with A < 0: outside
#   (1,1) A=−2: 0.5 → 0.9: D = 0.5108256 > 0.2, but p rose with A < 0: valid
# L = −A·r·logπ on valid tokens (r = 2, 0.4, 1.8, all < c): −2·ln 0.6 = 1.0216512; −0.4·ln 0.2 = 0.6437752;
# 2·1.8·ln 0.9 = −0.3792978. Σ = 1.2861286, /5 = 0.2572257. ∂/∂logπ = −A·r/5: (0,0) −0.4, (0,2) −0.08, (1,1) +0.72.
# pg_clipfrac = 2/5; pg_clipfrac_lower = 0; ppo_kl = ln(0.5 · 5/9 · 2.5 · 2.5 · 5/9)/5 = ln(0.9645062)/5.
KL_P = torch.tensor([[0.6, 0.9, 0.2], [0.2, 0.9, 0.5]])
KL_OLD_P = torch.tensor([[0.3, 0.5, 0.5], [0.5, 0.5, 0.999]])
KL_ADV = torch.tensor([[1.0, 2.0, 1.0], [-1.0, -2.0, 5.0]])


def test_dppo_kl_masks_by_binary_kl_in_the_direction_of_the_advantage():
    loss, m, grad = run("dppo_kl", KL_OLD_P.log(), KL_P.log(), KL_ADV, MASK)
    assert loss == pytest.approx(0.2572257, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.4, 0.0, -0.08], [0.0, 0.72, 0.0]]))
    assert m == pytest.approx({"pg_clipfrac": 0.4, "ppo_kl": math.log(0.9645062) / 5, "pg_clipfrac_lower": 0.0},
                              abs=1e-6)
    # δ = 0.25 on both sides brings (1,0) inside (D = 0.2231436): + (−(−1)·0.4·ln 0.2 = −0.6437752)/5
    loss_wide, m_wide, _ = run("dppo_kl", KL_OLD_P.log(), KL_P.log(), KL_ADV, MASK, clip_ratio_low=0.25,
                               clip_ratio_high=0.25)
    assert loss_wide == pytest.approx((1.2861286 - 0.6437752) / 5, abs=1e-6)
    assert m_wide["pg_clipfrac"] == pytest.approx(0.2)


# ---- sapo (τ_pos = 1, τ_neg = 1.05), always seq-mean-token-mean -------------------------------------------------
# f(r, τ) = σ(τ(r − 1))·4/τ; ∂f/∂logπ = 4σ(1 − σ)·r. L = −f·A, τ = τ_pos where A > 0 else τ_neg.
#   (0,0) A= 1, r = 1: σ = 0.5, f = 2 → L = −2; ∂L/∂logπ = −4·0.25·1·1 = −1
#   (0,1) A= 1, r = e^0.5 = 1.6487213: σ(0.6487213) = 0.6567222, f = 2.6268890 → L = −2.6268890;
#         ∂ = −4·0.6567222·0.3432778·1.6487213 = −1.4867386 (< 1: the soft gate damps a token far from r = 1)
#   (0,2) A=−1, r = 1 (τ_neg): f = 2/1.05 = 1.9047619 → L = +1.9047619; ∂ = +4·0.25·1 = +1
#   (1,0) A=−2, r = e^−0.5 = 0.6065307 (τ_neg): σ(−0.4131428) = 0.3981588, f = 1.5167953 → L = +3.0335907;
#         ∂ = 2·4·0.3981588·0.6018412·0.6065307 = 1.1627356
#   (1,1) A = 0 (τ_neg): L = 0, ∂ = 0
# rows: (−2 − 2.6268890 + 1.9047619)/3 = −0.9073757 and (3.0335907 + 0)/2 = 1.5167953; loss = their mean 0.3047098.
# ∂loss/∂logπ = ∂L/(row length · 2 rows): row 0 ÷ 6, row 1 ÷ 4.
SA_LP = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, -3.0]])
SA_OLD = SA_LP - torch.tensor([[0.0, 0.5, 0.0], [-0.5, 0.3, 4.0]])
SA_ADV = torch.tensor([[1.0, 1.0, -1.0], [-2.0, 0.0, 6.0]])


def test_sapo_soft_gate_with_asymmetric_temperatures_and_seq_mean_token_mean():
    # loss_agg_mode says token-mean; sapo aggregates seq-mean-token-mean regardless (token-mean would be 0.0622927)
    loss, m, grad = run("sapo", SA_OLD, SA_LP, SA_ADV, MASK, agg="token-mean")
    assert loss == pytest.approx(0.3047098, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-1 / 6, -1.4867386 / 6, 1 / 6], [1.1627356 / 4, 0.0, 0.0]]))
    # nothing is clipped; ppo_kl = −(0 + 0.5 + 0 − 0.5 + 0.3)/5
    assert m == pytest.approx({"pg_clipfrac": 0.0, "ppo_kl": -0.06, "pg_clipfrac_lower": 0.0}, abs=1e-6)
    # τ_pos decides only A > 0 tokens: τ_pos = 2 → (0,0) f = 0.5·4/2 = 1, (0,1) σ(1.2974425) = 0.7854043,
    # f = 1.5708085; row 0 = (−1 − 1.5708085 + 1.9047619)/3 = −0.2220155; loss = (−0.2220155 + 1.5167953)/2
    loss_tau, _, _ = run("sapo", SA_OLD, SA_LP, SA_ADV, MASK, tau_pos=2.0)
    assert loss_tau == pytest.approx(0.6473899, abs=1e-6)
    with pytest.raises(ValueError, match="tau_neg"):
        run("sapo", SA_OLD, SA_LP, SA_ADV, MASK, tau_neg=0.0)


# ---- dro (β = 0.5) ---------------------------------------------------------------------------------------------
# δ = logπ − logπ_old = [[0.2, −0.4, 0], [1.0, 0, ·]]; L = −(A·logπ − ½β·δ²) = −A·logπ + 0.25·δ²:
# (0,0) 1 + 0.01 = 1.01; (0,1) −2 + 0.04 = −1.96; (0,2) 1; (1,0) 0.75 + 0.25 = 1; (1,1) −2. Σ = −0.95, /5 = −0.19.
# ∂L/∂logπ = (−A + β·δ)/5: (−1 + 0.1)/5 = −0.18; (1 − 0.2)/5 = 0.16; −2/5 = −0.4; (−0.5 + 0.5)/5 = 0 (the penalty
# cancels the policy gradient exactly); 2/5 = 0.4. ppo_kl = −(0.2 − 0.4 + 0 + 1 + 0)/5 = −0.16.
DRO_LP = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, -3.0]])
DRO_OLD = DRO_LP - torch.tensor([[0.2, -0.4, 0.0], [1.0, 0.0, 5.0]])
DRO_ADV = torch.tensor([[1.0, -1.0, 2.0], [0.5, -2.0, 9.0]])


def test_dro_quadratic_log_ratio_penalty():
    loss, m, grad = run("dro", DRO_OLD, DRO_LP, DRO_ADV, MASK, dro_beta=0.5)
    assert loss == pytest.approx(-0.19, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.18, 0.16, -0.4], [0.0, 0.4, 0.0]]))
    assert m == pytest.approx({"pg_clipfrac": 0.0, "ppo_kl": -0.16, "pg_clipfrac_lower": 0.0}, abs=1e-6)
    for beta in (None, 0.0):
        with pytest.raises(ValueError, match="dro_beta"):
            run("dro", DRO_OLD, DRO_LP, DRO_ADV, MASK, dro_beta=beta)


# ---- micro-batching --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("mode", ["cispo", "dppo_tv", "dppo_kl", "sapo", "dro"])
def test_micro_batch_contributions_sum_to_the_batch_loss(mode, agg):
    # with the mini-batch's global token/sequence counts, two micro-batches' losses and gradients add up to the
    # whole batch's (thresholds set so that some tokens sit on each side of every clip / trust region)
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(5) < torch.tensor([[5], [3], [4], [2]])).float()
    old = torch.rand(4, 5, generator=g).clamp_min(0.05).log()
    lp = old + torch.randn(4, 5, generator=g) * 0.4
    adv = torch.randn(4, 5, generator=g)
    over = {"clip_ratio_low": 0.1, "clip_ratio_high": 0.1, "clip_ratio_c": 1.3, "dro_beta": 0.3}
    lp_whole = lp.clone().requires_grad_(True)
    whole, m = call_loss(mode, old, lp_whole, adv, mask, agg, **over)
    whole.backward()
    if mode != "sapo" and mode != "dro":
        assert 0.0 < float(m["pg_clipfrac"]) < 1.0  # the threshold decides for some tokens, not all
    lp_parts = lp.clone().requires_grad_(True)
    n_tok, n_seq = float(mask.sum()), 4.0
    total = sum(call_loss(mode, old[s], lp_parts[s], adv[s], mask[s], agg, global_tokens=n_tok, global_seqs=n_seq,
                          **over)[0] for s in (slice(0, 1), slice(1, 4)))
    total.backward()
    assert total.item() == pytest.approx(whole.item(), abs=1e-6)
    torch.testing.assert_close(lp_parts.grad, lp_whole.grad)
    assert float(lp_whole.grad[mask == 0].abs().max()) == 0.0  # padded tokens get no gradient


def test_rollout_is_weights_scale_each_token_loss():
    # dro with A = 1 on one token, logπ = −1, δ = 0: L = 1; a weight 2.5 makes it 2.5, and no gradient reaches the
    # weight (it is detached)
    one = torch.ones(1, 1)
    lp = -one
    w = torch.full((1, 1), 2.5, requires_grad=True)
    config = PolicyLossConfig(loss_agg_mode="token-mean", **{**SCALARS, "dro_beta": 1.0})
    loss, _ = get_policy_loss_fn("dro")(PolicyLossInputs(lp, lp, one, one, rollout_is_weights=w), config)
    assert loss.item() == pytest.approx(2.5)
    assert not loss.requires_grad


# ---- config ----------------------------------------------------------------------------------------------------
def _config_error(*overrides):
    with pytest.raises(ConfigError) as info:
        load_config("ppo_trainer", list(overrides))
    return str(info.value)


def test_config_reads_the_new_keys_and_refuses_bad_values_by_name():
    cfg = load_config("ppo_trainer", [f"{PL}loss_mode=dro", f"{PL}dro_beta=0.25", f"{ACTOR}tau_pos=1.5"])
    config = PolicyLossConfig.from_actor_config(cfg.actor_rollout_ref.actor)
    # verl 0.9.1's defaults: tau_neg 1.05; clip_ratio_c 3.0 (dppo's truncation bound)
    assert (config.dro_beta, config.tau_pos, config.tau_neg, config.clip_ratio_c) == (0.25, 1.5, 1.05, 3.0)
    assert "policy_loss.dro_beta=None must be > 0 with loss_mode=dro" in _config_error(f"{PL}loss_mode=dro")
    assert "actor.tau_neg=0 must be > 0 with policy_loss.loss_mode=sapo" in _config_error(
        f"{PL}loss_mode=sapo", f"{ACTOR}tau_neg=0")
    load_config("ppo_trainer", [f"{ACTOR}tau_neg=0"])  # τ is read by sapo only
    assert "Did you mean 'cispo'?" in _config_error(f"{PL}loss_mode=cipso")
