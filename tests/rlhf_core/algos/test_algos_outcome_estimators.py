"""Advantage estimators opo, grpo_passk, gpg and PF-PPO resampling: hand-derived numbers (equal to verl 0.6's
``core_algos`` on the same inputs: each case was also run through verl's functions while writing these tests)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhf_core.algos import get_adv_estimator, pf_ppo_resample_indices, pf_ppo_weights


def outcome_batch(scores, lengths, t_len=4):
    """Rewards with each score on the last valid token of a right-padded response of the given length."""
    b = len(scores)
    lengths = torch.tensor(lengths)
    mask = (torch.arange(t_len) < lengths[:, None]).float()
    rewards = torch.zeros(b, t_len)
    rewards[torch.arange(b), lengths - 1] = torch.tensor(scores, dtype=torch.float32)
    return rewards, mask


def run(name, scores, lengths, index, **kw):
    rewards, mask = outcome_batch(scores, lengths)
    adv, ret = get_adv_estimator(name)(token_level_rewards=rewards, response_mask=mask,
                                       index=np.array(index, dtype=object), epsilon=1e-6, **kw)
    assert torch.equal(adv, ret) and adv.dtype == torch.float32
    assert torch.all(adv[mask == 0] == 0)
    per_seq = adv[:, 0]
    assert torch.allclose(adv, per_seq[:, None] * mask)  # one value per sequence, on its valid tokens
    return per_seq


def test_opo_baseline_is_the_length_weighted_group_mean():
    # group a: lengths 1, 2, 3 and scores 1, 1, 0 → b = (1·1 + 2·1 + 3·0)/(1+2+3) = 0.5 (the plain mean is 2/3)
    #   → A = [0.5, 0.5, −0.5]; group b has one response: b = 0 → A = its score 0.5 (as verl).
    adv = run("opo", [1.0, 1.0, 0.0, 0.5], [1, 2, 3, 4], ["a", "a", "a", "b"])
    torch.testing.assert_close(adv, torch.tensor([0.5, 0.5, -0.5, 0.5]))


def test_grpo_passk_rewards_only_the_best_response():
    scores, index = [0.2, 1.0, 0.5, 0.0, 1.0, 1.0], ["a"] * 4 + ["b"] * 2
    # group a: r_max = 1.0 (row 1), r_2nd = 0.5 → gain 0.5; unbiased std of [0.2, 1, 0.5, 0] = 0.4349329
    #   → A_1 = 0.5/(0.4349329 + 1e-6) = 1.1495999, every other row 0. Group b ties at the max → 0 for both.
    adv = run("grpo_passk", scores, [4, 3, 2, 1, 4, 4], index, norm_adv_by_std_in_grpo=True)
    torch.testing.assert_close(adv, torch.tensor([0.0, 1.1495999, 0.0, 0.0, 0.0, 0.0]))
    adv = run("grpo_passk", scores, [4, 3, 2, 1, 4, 4], index, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.5, 0.0, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="rollout.n >= 2.*'c'"):
        run("grpo_passk", [1.0, 0.0, 1.0], [1, 1, 1], ["a", "a", "c"])


def test_gpg_scales_the_group_centred_score_by_alpha():
    # B = 5 with 3 non-zero scores → α = 5/3. Group a [1, 0, 0]: mean 1/3 → A = 5/3·[2/3, −1/3, −1/3]
    # = [10/9, −5/9, −5/9]; group b [1, 1] is constant → 0.
    adv = run("gpg", [1.0, 0.0, 0.0, 1.0, 1.0], [1, 2, 3, 4, 2], ["a", "a", "a", "b", "b"])
    torch.testing.assert_close(adv, torch.tensor([10 / 9, -5 / 9, -5 / 9, 0.0, 0.0]))
    # a single-response group has mean 0 (A = α·s); all-zero scores: α = B/1
    adv = run("gpg", [2.0, 0.0], [1, 1], ["x", "y"])
    torch.testing.assert_close(adv, torch.tensor([4.0, 0.0]))  # α = 2/1, A = 2·(2 − 0)


# ---- PF-PPO ----------------------------------------------------------------------------------------------------
def test_pf_ppo_weights_per_method():
    s = torch.tensor([-2.0, 1.0, 0.0, 3.0])
    # pow 2: |s|² = [4, 1, 0, 9]; max_min: 1 on the max (3) and the min (−2); max_random: 0.4 on the max, 0.1 else;
    # then + 1e-8 (a zero weight stays drawable with a tiny chance)
    torch.testing.assert_close(pf_ppo_weights(s, "pow", 2.0), torch.tensor([4.0, 1.0, 1e-8, 9.0]))
    torch.testing.assert_close(pf_ppo_weights(s, "max_min", 2.0), torch.tensor([1.0, 1e-8, 1e-8, 1.0]))
    torch.testing.assert_close(pf_ppo_weights(s, "max_random", 2.0), torch.tensor([0.1, 0.1, 0.1, 0.4]))
    torch.testing.assert_close(pf_ppo_weights(s, "pow", 1.0), torch.tensor([2.0, 1.0, 1e-8, 3.0]))
    with pytest.raises(ValueError, match="pf_ppo.reweight_method='best'"):
        pf_ppo_weights(s, "best", 2.0)


def test_pf_ppo_resampling_follows_the_weights():
    s = torch.tensor([-2.0, 1.0, 0.0, 3.0])
    idx = pf_ppo_resample_indices(s, "max_min", 2.0, torch.Generator().manual_seed(0))
    assert idx.shape == (4,) and set(idx.tolist()) <= {0, 3}  # the others have probability ~1e-8
    same = pf_ppo_resample_indices(s, "max_min", 2.0, torch.Generator().manual_seed(0))
    assert torch.equal(idx, same)
    # pow 2 on scores 1 and 2 (half each): P(draw a "2") = 2·4 / (2·4 + 2·1) = 0.8 per draw
    scores = torch.tensor([1.0, 2.0]).repeat(5000)
    drawn = pf_ppo_resample_indices(scores, "pow", 2.0, torch.Generator().manual_seed(1))
    frac = float((scores[drawn] == 2.0).float().mean())
    assert frac == pytest.approx(0.8, abs=0.015)  # 10000 draws: std 0.004
