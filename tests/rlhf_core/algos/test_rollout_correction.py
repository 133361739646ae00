"""algorithm.rollout_correction (verl 0.9.1): weights, rejection masks, metrics, bypass loss, config, 0.6 keys.

Inputs are log-ratios ℓ = log π_old − log π_rollout chosen so each weight e^ℓ is a round number.
"""
import math
import warnings
from types import SimpleNamespace

import pytest
import torch

from rlhf_core.algos.policy_loss import PolicyLossConfig, PolicyLossInputs
from rlhf_core.algos.rollout_correction import (LegacyIS, compute_policy_loss_bypass_mode, compute_rollout_correction,
                                                compute_rollout_correction_weights, compute_rollout_rejection_mask)
from rlhf_core.algos.rollout_is import compute_rollout_importance_weights
from rlhf_core.config.rollout_corr import PRESETS, legacy_settings, parse_is_threshold, parse_rs, preset_overrides

L = math.log
# row 0: ratios 3, 1, 0.25 (3 valid); row 1: ratios 1.5, 0.5 + 1 padding token
LOG_RATIO = torch.tensor([[L(3.0), 0.0, L(0.25)], [L(1.5), L(0.5), 7.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def settings(**kw):
    base = dict(PRESETS["disabled"])
    base.update(kw)
    return SimpleNamespace(**base)


def test_token_tis_truncates_at_the_threshold_and_metrics():
    # raw = [3, 1, .25 | 1.5, .5, 0]; U = 2 decides the first token: min(3, 2) = 2
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.25], [1.5, 0.5, 0.0]]))
    assert m["rollout_is_mean"] == pytest.approx((2 + 1 + .25 + 1.5 + .5) / 5)          # 1.05
    assert m["rollout_is_max"] == pytest.approx(2.0) and m["rollout_is_min"] == pytest.approx(0.25)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)   # raw 3 > 2
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)    # raw .25 < 1/U = .5 (.5 itself is not <)
    # ESS = 1/mean((w/mean)^2) = mean^2 / mean(w^2); mean(w^2) = (4 + 1 + .0625 + 2.25 + .25)/5 = 1.5125
    assert m["rollout_is_eff_sample_size"] == pytest.approx(1.05 ** 2 / 1.5125, rel=1e-6)
    assert m["rollout_is_std"] == pytest.approx(math.sqrt(1.5125 - 1.05 ** 2), rel=1e-6)
    # per-row mean weight: row0 3.25/3, row1 1.0
    assert m["rollout_is_seq_max"] == pytest.approx(3.25 / 3) and m["rollout_is_seq_min"] == pytest.approx(1.0)
    # raw row means 4.25/3 = 1.417 and 1.0: neither > 2 nor < .5
    assert m["rollout_is_seq_fraction_high"] == 0.0 and m["rollout_is_seq_fraction_low"] == 0.0
    # a higher threshold no longer decides: 3 stays
    w4, _ = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 4.0)
    assert w4[0, 0] == pytest.approx(3.0)


def test_sequence_tis_and_icepop():
    # row products: 3·1·.25 = .75, 1.5·.5 = .75 (the padded 7.0 is not counted); U = .7 decides: both → .7
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "sequence", 0.7)
    assert torch.allclose(w, torch.tensor([[.7, .7, .7], [.7, .7, 0.0]]))
    assert m["rollout_is_max"] == pytest.approx(0.75) and m["rollout_is_ratio_fraction_high"] == 1.0
    # IcePop "0.5_2.0" on tokens: 3 (> 2) and .25 (< .5) zeroed, .5 kept (bounds inclusive)
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", "0.5_2.0")
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.0], [1.5, 0.5, 0.0]]))
    assert m["rollout_is_oob_ratio"] == pytest.approx(2 / 5)
    # IcePop lower bound .8 decides at sequence level: .75 < .8 → both rows 0
    w, _ = compute_rollout_correction_weights(LOG_RATIO, MASK, "sequence", "0.8_2.0")
    assert float(w.abs().sum()) == 0.0


def test_batch_normalised_weights_average_one():
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 2.0, rollout_is_batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(1.05)      # mean of the truncated weights
    assert float((w * MASK).sum() / MASK.sum()) == pytest.approx(1.0, rel=1e-6)
    assert w[0, 0] == pytest.approx(2.0 / 1.05)
    # sequence: rows 3·1·.5 = 1.5 (TIS 2 keeps it) and .75 → factor = mean over rows = 1.125
    lr = torch.tensor([[L(3.0), 0.0, L(0.5)], [L(1.5), L(0.5), 0.0]])
    w, m = compute_rollout_correction_weights(lr, MASK, "sequence", 2.0, rollout_is_batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(1.125)
    assert torch.allclose(w[:, 0], torch.tensor([1.5 / 1.125, .75 / 1.125]))


def test_rejection_token_and_sequence_modes():
    # token_k1 keeps log L <= −ℓ <= log U, i.e. ratio in [1/U, 1/L]: "0.5_2.0" keeps ratios in [.5, 2]
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1", "0.5_2.0")
    assert torch.equal(mask, torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]))
    assert m["rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    # seq_sum_k1: −Σℓ = −log .75 = .2877 for both rows; threshold 1.3 → [log(1/1.3), log 1.3] = [−.262, .262]: reject
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_sum_k1", 1.3)
    assert float(mask.sum()) == 0.0
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_sum_k1", 1.4)   # log 1.4 = .336 > .2877: keep
    assert torch.equal(mask, MASK)
    # seq_max_k2: max ℓ²/2 per row: row0 (log 4)²/2 = .961 (from .25), row1 (log 2)²/2 = .240; U = .5 rejects row 0
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_max_k2", 0.5)
    assert torch.equal(mask, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    assert m["rollout_rs_seq_max_k2_max"] == pytest.approx(L(4.0) ** 2 / 2, rel=1e-6)
    assert m["rollout_rs_seq_max_k2_fraction_high"] == pytest.approx(1 / 2)        # rows: .961 > .5, .240 not
    assert m["rollout_rs_seq_max_k2_seq_mean"] == pytest.approx((L(4.0) ** 2 + L(2.0) ** 2) / 4, rel=1e-6)
    assert m["rollout_rs_seq_max_k2_seq_masked_fraction"] == pytest.approx(1 / 2)
    # seq_mean_k3: row0 mean of (3−1−L3, 0, .25−1+L4)/3 = (.9014 + .6363)/3 = .5126; row1 (.5−L1.5 + −.5+L2)/2 = .1438
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_mean_k3", 0.3)
    assert torch.equal(mask, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    # two options, both must pass: token_k3 <= .2 drops ratios 3 (.90), .25 (.64), .5 (.193 passes), 1.5 (.095 passes)
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k3,seq_max_k2", "0.2,10")
    assert torch.equal(mask, torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]))


def test_unified_entry_prefixes_metrics_and_keeps_rejection_separate():
    old = torch.log(torch.tensor([[0.6, 0.5, 0.1], [0.3, 0.2, 0.9]]))
    roll = old - LOG_RATIO
    w, mask, m = compute_rollout_correction(old, roll, MASK, settings(rollout_is="token", rollout_rs="token_k1",
                                                                      rollout_rs_threshold="0.5_2.0"))
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.25], [1.5, 0.5, 0.0]]), atol=1e-6)
    assert torch.equal(mask, torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]))
    # kl = mean(log π_rollout − log π_old) = −mean ℓ over valid = −(L3 + L.25 + L1.5 + L.5)/5
    assert m["rollout_corr/kl"] == pytest.approx(-(L(3) + L(.25) + L(1.5) + L(.5)) / 5, rel=1e-5)
    assert m["rollout_corr/chi2_token"] == pytest.approx((9 + 1 + .0625 + 2.25 + .25) / 5 - 1, rel=1e-5)
    w, _, m = compute_rollout_correction(old, roll, MASK, settings())    # rollout_is null: metrics only
    assert w is None and "rollout_corr/rollout_is_mean" not in m and "rollout_corr/training_ppl" in m


@pytest.mark.parametrize("loss_type", ["reinforce", "ppo_clip"])
def test_bypass_loss_value_and_gradient(loss_type):
    # one row, 2 tokens; π_rollout = old_log_prob; ratio π_θ/π_rollout = 3 and 0.5; A = (1, −2); token-mean
    roll = torch.log(torch.tensor([[0.2, 0.4]]))
    log_prob = (roll + torch.tensor([[L(3.0), L(0.5)]])).requires_grad_(True)
    adv = torch.tensor([[1.0, -2.0]])
    inputs = PolicyLossInputs(roll, log_prob, adv, torch.ones(1, 2))
    cfg = PolicyLossConfig("token-mean", 0.2, 0.2, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, tau_pos=1.0, tau_neg=1.05,
                           dro_beta=None)
    rc = settings(rollout_is="token", rollout_is_threshold=2.0, bypass_mode=True, loss_type=loss_type)
    loss, m = compute_policy_loss_bypass_mode(inputs, cfg, rc)
    loss.backward()
    lp = log_prob.detach()
    if loss_type == "reinforce":
        # w = (min(3, 2), .5) detached; L = mean(−A·log π·w) = (−1·lp0·2 + 2·lp1·.5)/2; ∂L/∂lp = (−A·w)/2 = (−1, .5)
        assert float(loss.detach()) == pytest.approx(float(-2 * lp[0, 0] + lp[0, 1]) / 2, rel=1e-6)
        assert torch.allclose(log_prob.grad, torch.tensor([[-1.0, 0.5]]))
        assert float(m["ppo_kl"]) == pytest.approx(-(L(3) + L(.5)) / 2, rel=1e-6)
    else:
        # PPO-clip, no IS weights: token0 A>0, r=3: max(−3, −1.2) = −1.2 (clipped, no grad); token1 A<0, r=.5:
        # max(1, 2·.8 = 1.6) = 1.6 (clipped, no grad). loss = (−1.2 + 1.6)/2 = .2, gradient 0
        assert float(loss.detach()) == pytest.approx(0.2, rel=1e-6)
        assert torch.allclose(log_prob.grad, torch.zeros(1, 2))
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.25)   # weights still computed for metrics


def test_bypass_rejection_masks_the_loss():
    roll = torch.log(torch.tensor([[0.2, 0.4]]))
    log_prob = (roll + torch.tensor([[L(3.0), L(0.8)]])).requires_grad_(True)
    rc = settings(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0", bypass_mode=True, loss_type="reinforce")
    loss, _ = compute_policy_loss_bypass_mode(PolicyLossInputs(roll, log_prob, torch.ones(1, 2), torch.ones(1, 2)),
                                              PolicyLossConfig("token-mean", .2, .2, 3., 0, 0, 0, 0, 0, tau_pos=1.0,
                                                               tau_neg=1.05, dro_beta=None), rc)
    loss.backward()   # token 0 (ratio 3) rejected: L = −log π_1 / 1, ∂L/∂lp = (0, −1)
    assert torch.allclose(log_prob.grad, torch.tensor([[0.0, -1.0]]))


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode,lower", [("truncate", None), ("mask", None), ("mask", 0.3)])
@pytest.mark.parametrize("veto", [1e-4, 0.3])
def test_06_keys_give_the_same_weights(level, mode, lower, veto):
    torch.manual_seed(0)
    old = torch.randn(4, 6) * 0.5 - 1
    roll = old + torch.randn(4, 6) * 0.6
    roll[1, 2] = old[1, 2] + 25.0                   # beyond the ±20 safety bound
    mask = (torch.rand(4, 6) > 0.3).float()
    mask[:, 0] = 1
    before, _ = compute_rollout_importance_weights(old, roll, mask, level, mode, 1.5, lower, veto)
    new = legacy_settings(True, 1.5, lower, level, mode)
    rc = settings(**new)
    after, _, _ = compute_rollout_correction(old, roll, mask, rc, LegacyIS(level=level, veto_threshold=veto))
    assert torch.allclose(before, after, atol=1e-6)


def test_config_parsing_and_presets():
    assert parse_is_threshold(2) == (2.0, None) and parse_is_threshold("0.5_5.0") == (5.0, 0.5)
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        parse_is_threshold("5_0.5")
    assert parse_rs("seq_mean_k1,token_k2,seq_mean_k1", "0.9_1.1,0.1") == [("seq_mean_k1", 0.9, 1.1),
                                                                            ("token_k2", None, 0.1)]
    with pytest.raises(ValueError, match="rollout_rs="):
        parse_rs("seq_max_k1", 1.0)
    assert "algorithm.rollout_correction.loss_type=reinforce" in preset_overrides("bypass_pg_is")
    assert "algorithm.rollout_correction.rollout_is=null" in preset_overrides("bypass_ppo_clip")


def _check(*overrides):
    from rlhf_core.config.loader import load_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config("ppo_trainer", ["actor_rollout_ref.rollout.name=hf",
                                          "actor_rollout_ref.rollout.calculate_log_probs=true", *overrides])
    return cfg, [str(w.message) for w in caught if "rollout_is*" in str(w.message)]


def test_config_accepts_09_lines_and_translates_06_keys():
    cfg, notes = _check("algorithm.rollout_correction.rollout_is=token",
                        "algorithm.rollout_correction.rollout_is_threshold=2.0")
    rc = cfg.algorithm.rollout_correction
    assert rc.rollout_is == "token" and rc.rollout_is_threshold == 2.0 and not notes
    cfg, notes = _check("algorithm.rollout_is=true", "algorithm.rollout_is_threshold=3.0",
                        "algorithm.rollout_is_mode=mask", "algorithm.rollout_is_level=sequence")
    rc = cfg.algorithm.rollout_correction
    assert rc.rollout_is == "sequence" and parse_is_threshold(rc.rollout_is_threshold) == (3.0, pytest.approx(1 / 3))
    assert len(notes) == 1 and "algorithm.rollout_correction.rollout_is_threshold" in notes[0]
    with pytest.raises(ValueError, match="algorithm.rollout_is_threshold .*algorithm.rollout_correction.rollout_is_threshold=4"):
        _check("algorithm.rollout_is=true", "algorithm.rollout_is_threshold=3.0",
               "algorithm.rollout_correction.rollout_is_threshold=4")


@pytest.mark.parametrize("overrides,expect", [
    (["algorithm.rollout_correction.loss_type=reinforce"], "loss_type=reinforce is read only with"),
    (["algorithm.rollout_correction.rollout_rs=seq_mean_k3"], "needs algorithm.rollout_correction.rollout_rs_threshold"),
    (["algorithm.rollout_correction.rollout_is_threshold=-1"], "rollout_is_threshold=-1: bounds must be > 0"),
])
def test_config_refuses_bad_combinations(overrides, expect):
    with pytest.raises(ValueError, match=expect):
        _check(*overrides)


def test_every_preset_passes_the_section_checks_and_a_string_threshold_survives_the_overrides():
    from rlhf_core.config.schemas.ppo_trainer import RolloutCorrectionConfig

    for name, values in PRESETS.items():
        RolloutCorrectionConfig(**values)   # raises SectionErrors on a bad combination
    cfg, _ = _check(*preset_overrides("bypass_pg_token_icepop"))
    assert cfg.algorithm.rollout_correction.rollout_is_threshold == "0.5_5.0"   # a string: IcePop, not 0.55
    assert cfg.algorithm.rollout_correction.loss_type == "reinforce" and cfg.algorithm.rollout_correction.bypass_mode


def test_a_06_conflict_names_only_the_keys_the_user_set():
    # issue 35's trial: only algorithm.rollout_is_threshold was set (rollout_is stays False: 0.9's rollout_is=null,
    # metrics only), against rollout_correction.rollout_is=token; the error named algorithm.rollout_is, unset
    with pytest.raises(ValueError) as info:
        _check("algorithm.rollout_is_threshold=3.0", "algorithm.rollout_correction.rollout_is=token")
    msg = str(info.value)
    assert "algorithm.rollout_is_threshold (verl 0.6) means algorithm.rollout_correction.rollout_is=None" in msg, msg
    assert "algorithm.rollout_is " not in msg and "algorithm.rollout_is=" not in msg, msg
    # rollout_is_level=sequence set with rollout_is=true: both named, they decide the value together
    with pytest.raises(ValueError) as info:
        _check("algorithm.rollout_is=true", "algorithm.rollout_is_level=sequence", "algorithm.rollout_is_threshold=3.0",
               "algorithm.rollout_correction.rollout_is=token")
    assert ("algorithm.rollout_is and algorithm.rollout_is_level (verl 0.6) mean "
            "algorithm.rollout_correction.rollout_is='sequence'") in str(info.value), str(info.value)
