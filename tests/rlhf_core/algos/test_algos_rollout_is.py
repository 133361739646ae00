"""Rollout importance sampling: each level × mode, bounds, veto, metrics, safety clamp, detachment."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.algos import compute_rollout_importance_weights

# ℓ = logπ_old − logπ_rollout. row0: [0.1, 0.2, 0.3]; row1: [ln 3, −0.5 | pad]; row2: [−12 | pad, pad].
# e^{−12} = 6.1e-6 is below the veto threshold 1e-4, so row2 is vetoed wherever the veto is on.
LN3 = math.log(3.0)
ELL = torch.tensor([[0.1, 0.2, 0.3], [LN3, -0.5, 50.0], [-12.0, 40.0, 40.0]])  # pads hold garbage
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
E = math.exp


def _run(level, mode, threshold=2.0, lower=None, veto=1e-4, ell=ELL, mask=MASK):
    rollout = torch.zeros_like(ell)
    return compute_rollout_importance_weights(ell, rollout, mask, level, mode, threshold, lower, veto)


def test_token_truncate_with_veto_and_metrics():
    # raw w = e^ℓ: row0 [1.10517, 1.22140, 1.34986]; row1 [3, 0.60653]; row2 [6.1e-6].
    # truncate at U=2: 3 → 2. veto zeroes row2. Pads are 0.
    w, m = _run("token", "truncate")
    exp = torch.tensor([[E(0.1), E(0.2), E(0.3)], [2.0, E(-0.5), 0], [0, 0, 0]])
    torch.testing.assert_close(w, exp, atol=1e-6, rtol=0)
    raw = [E(0.1), E(0.2), E(0.3), 3.0, E(-0.5), E(-12)]
    assert m["mismatch/rollout_is_mean"] == pytest.approx(sum(raw) / 6, abs=1e-6)
    assert m["mismatch/rollout_is_max"] == pytest.approx(3.0, abs=1e-6)
    assert m["mismatch/rollout_is_min"] == pytest.approx(E(-12), rel=1e-4)
    assert m["mismatch/rollout_is_veto_fraction"] == pytest.approx(1 / 3)
    assert m["mismatch/rollout_is_masked_fraction"] == 0.0
    assert m["mismatch/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 6)  # only 3 > U
    assert m["mismatch/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 6)   # only e^−12 < L = 1/U = 0.5
    assert 0 < m["mismatch/rollout_is_eff_sample_size"] <= 1


def test_token_mask_mode_with_explicit_lower_bound():
    # keep iff 0.7 ≤ w ≤ 2: row0 all kept; row1: 3 (> U) and 0.6065 (< L) masked; row2: 6.1e-6 (< L) masked.
    # masked fraction = 3 of 6 valid tokens.
    w, m = _run("token", "mask", lower=0.7)
    exp = torch.tensor([[E(0.1), E(0.2), E(0.3)], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(w, exp, atol=1e-6, rtol=0)
    assert m["mismatch/rollout_is_masked_fraction"] == pytest.approx(0.5)


def test_sequence_level_truncate():
    # w = e^{Σℓ}: row0 e^{0.6} = 1.82212; row1 3·e^{−0.5} = 1.81959; row2 vetoed.
    # U = 1.82 truncates row0 only; the weight is broadcast over the valid tokens.
    w, m = _run("sequence", "truncate", threshold=1.82)
    r1 = 3 * E(-0.5)
    exp = torch.tensor([[1.82] * 3, [r1, r1, 0], [0, 0, 0]])
    torch.testing.assert_close(w, exp, atol=1e-6, rtol=0)
    # sequence-level stats are over sequences: mean of (1.82212, 1.81959, e^−12)
    assert m["mismatch/rollout_is_mean"] == pytest.approx((E(0.6) + r1 + E(-12)) / 3, abs=1e-6)


def test_sequence_level_mask_mode():
    # U = 1.82, L = 1/U = 0.5495: row0 (1.82212 > U) masked on its 3 tokens; row1 kept; row2 (e^−12) masked.
    # masked fraction over valid tokens = (3 + 1)/6.
    w, m = _run("sequence", "mask", threshold=1.82)
    r1 = 3 * E(-0.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0, 0], [r1, r1, 0], [0, 0, 0]]), atol=1e-6, rtol=0)
    assert m["mismatch/rollout_is_masked_fraction"] == pytest.approx(4 / 6)


def test_geometric_level():
    # w = e^{mean ℓ}: row0 e^{0.2} = 1.22140; row1 e^{(ln3 − 0.5)/2} = sqrt(3·e^{−0.5}) = 1.34892; row2 vetoed.
    w, _ = _run("geometric", "truncate")
    g1 = math.sqrt(3 * E(-0.5))
    exp = torch.tensor([[E(0.2)] * 3, [g1, g1, 0], [0, 0, 0]])
    torch.testing.assert_close(w, exp, atol=1e-6, rtol=0)
    wm, _ = _run("geometric", "mask", threshold=1.3)  # row1 (1.349 > 1.3) masked, row0 kept
    torch.testing.assert_close(wm, torch.tensor([[E(0.2)] * 3, [0.0, 0, 0], [0, 0, 0]]), atol=1e-6, rtol=0)


def test_no_veto_and_no_threshold():
    # veto None: row2 keeps e^−12; threshold None: no truncation, row1's 3 stays.
    w, m = _run("token", "truncate", threshold=None, veto=None)
    exp = torch.tensor([[E(0.1), E(0.2), E(0.3)], [3.0, E(-0.5), 0], [E(-12), 0, 0]])
    torch.testing.assert_close(w, exp, atol=1e-6, rtol=1e-5)
    assert m["mismatch/rollout_is_veto_fraction"] == 0.0


def test_safety_clamp_and_detached():
    # ℓ = 15 on 3 tokens: Σ = 45 is clamped to 20 before exp → e^20, finite. Per-token ℓ = 30 → clamped to 20.
    ell = torch.tensor([[15.0, 15.0, 15.0], [30.0, 0.0, 0.0]], requires_grad=True)
    w, _ = compute_rollout_importance_weights(ell, torch.zeros(2, 3), torch.ones(2, 3), "sequence", "truncate",
                                              None, None, None)
    assert torch.isfinite(w).all() and not w.requires_grad
    assert w[0, 0].item() == pytest.approx(E(20), rel=1e-5)
    wt, _ = compute_rollout_importance_weights(ell, torch.zeros(2, 3), torch.ones(2, 3), "token", "truncate",
                                               None, None, None)
    assert wt[1, 0].item() == pytest.approx(E(20), rel=1e-5)


def test_bad_level_or_mode():
    with pytest.raises(ValueError, match="geometric"):
        _run("sentence", "truncate")
    with pytest.raises(ValueError, match="truncate"):
        _run("token", "clip")
