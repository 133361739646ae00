"""Validation metrics (mean@N, best/worst@n, maj@n, pass@k) and their val-core / val-aux names."""
from __future__ import annotations

import math

import pytest

from rlhf_core.metrics.validation import (
    majority_value, pass_at_k, process_validation_metrics, val_metrics_to_names,
)


def test_four_samples_one_correct():
    # One prompt, N = 4 samples, only the first is right.
    acc = [1.0, 0.0, 0.0, 0.0]
    m = process_validation_metrics(["gsm"] * 4, ["u0"] * 4, {"acc": acc})["gsm"]["acc"]
    assert m["mean@4"] == 0.25
    assert m["std@4"] == pytest.approx(math.sqrt((0.75**2 + 3 * 0.25**2) / 4))  # population std = 0.4330
    assert m["pass@1"] == 0.25  # 1 − C(3,1)/C(4,1) = 1 − 3/4
    assert m["pass@2"] == 0.5  # 1 − C(3,2)/C(4,2) = 1 − 3/6
    assert m["pass@4"] == 1.0  # 1 − C(3,4)/C(4,4) = 1 − 0
    # best@4: a bootstrap of 4 draws *with replacement* holds the right one with prob 1 − (3/4)^4 = 0.684;
    # 1000 draws give a standard error of 0.015, so 0.05 is > 3 sigma (without replacement it would be 1.0).
    assert m["best@4/mean"] == pytest.approx(1 - 0.75**4, abs=0.05)
    assert m["best@2/mean"] == pytest.approx(1 - 0.75**2, abs=0.05)  # 0.4375
    assert m["worst@4/mean"] == pytest.approx(0.25**4, abs=0.02)  # all four draws right: 0.004
    assert "maj@4/mean" not in m  # no "pred" reported


def test_pass_at_k_formula_and_errors():
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # C(3,2)=3, C(5,2)=10
    assert pass_at_k(4, 3, 2) == 1.0  # C(1,2) = 0: any two samples include a right one
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_majority_tie_goes_to_first_seen_prediction():
    # "b" and "a" both appear twice; "b" is seen first, so its value (0) wins.
    assert majority_value(["b", "a", "a", "b"], [0.0, 1.0, 1.0, 0.0]) == 0.0
    assert majority_value(["a", "b", "b", "a"], [1.0, 0.0, 0.0, 1.0]) == 1.0
    assert majority_value(["x", "y", "y"], [0.0, 1.0, 1.0]) == 1.0  # a strict majority needs no tie rule
    assert majority_value([[1, 2], [1, 2], [3]], [1.0, 1.0, 0.0]) == 1.0  # unhashable preds vote by text


def test_maj_at_n_with_bootstrap():
    # Predictions "5","5","5","7" with acc 1,1,1,0; the majority's acc is 1 unless "7" wins a subset.
    # n=2: "7" wins when both draws are "7" (1/16) or on a 1–1 tie where "7" is drawn first (2·3/16 / 2 = 3/16)
    #      → P(7 wins) = 1/4, maj@2/mean ≈ 0.75.
    # n=4: "7" wins with ≥ 3 of 4 draws (4·(1/4)^3·(3/4) + (1/4)^4 = 0.0508) or on a 2–2 tie drawn first
    #      (6·(1/4)^2·(3/4)^2 / 2 = 0.1055) → P = 0.156, maj@4/mean ≈ 0.844.
    infos = {"acc": [1.0, 1.0, 1.0, 0.0], "pred": ["5", "5", "5", "7"]}
    m = process_validation_metrics(["ds"] * 4, ["u"] * 4, infos)["ds"]
    assert "pred" not in m  # string variables are not summarised
    assert m["acc"]["maj@2/mean"] == pytest.approx(0.75, abs=0.05)
    assert m["acc"]["maj@4/mean"] == pytest.approx(1 - 0.1563, abs=0.05)


def test_groups_are_per_uid_not_per_prompt_text():
    # Two prompt instances (same text, different uids) of 2 samples each: [1, 0] and [0, 0].
    infos = {"reward": [1.0, 0.0, 0.0, 0.0]}
    m = process_validation_metrics(["ds"] * 4, ["u1", "u1", "u2", "u2"], infos)["ds"]["reward"]
    assert "mean@4" not in m  # merged into one group of 4 would have produced mean@4
    assert m["mean@2"] == 0.25  # (0.5 + 0.0) / 2
    assert m["std@2"] == 0.25  # (0.5 + 0.0) / 2
    assert m["pass@2"] == 0.5  # group 1: 1 − C(1,2)/C(2,2) = 1; group 2: 0
    assert m["pass@1"] == 0.25  # (1/2 + 0) / 2


def test_data_sources_are_separate_and_seed_is_deterministic():
    infos = {"reward": [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]}
    args = (["a", "a", "a", "b", "b", "b"], ["x", "x", "x", "y", "y", "y"], infos)
    m = process_validation_metrics(*args)
    assert m["a"]["reward"]["mean@3"] == pytest.approx(1 / 3) and m["b"]["reward"]["mean@3"] == 1.0
    assert process_validation_metrics(*args, seed=42) == m
    assert process_validation_metrics(*args, seed=7)["a"]["reward"]["best@2/mean"] != m["a"]["reward"]["best@2/mean"]


def test_single_sample_and_length_mismatch():
    m = process_validation_metrics(["ds"], ["u"], {"reward": [0.0]})["ds"]["reward"]
    assert m == {"mean@1": 0.0, "pass@1": 0.0, "pass@1/num_prompts": 1.0}  # one prompt, covered by pass@1
    with pytest.raises(ValueError, match="reward"):
        process_validation_metrics(["ds", "ds"], ["u", "u"], {"reward": [1.0]})


def test_val_core_and_aux_names():
    infos = {"reward": [1.0, 0.0, 0.0, 0.0], "acc": [1.0, 0.0, 0.0, 0.0], "pred": ["1", "2", "2", "3"]}
    names = val_metrics_to_names(process_validation_metrics(["gsm"] * 4, ["u"] * 4, infos))
    core = sorted(k for k in names if k.startswith("val-core/"))
    # acc is the core variable; at the largest n = 4: mean@4, maj@4/{mean,std}, best@4/{mean,std} (verl's rule)
    assert core == [
        "val-core/gsm/acc/best@4/mean", "val-core/gsm/acc/best@4/std",
        "val-core/gsm/acc/maj@4/mean", "val-core/gsm/acc/maj@4/std", "val-core/gsm/acc/mean@4",
    ]
    for aux in ("acc/std@4", "acc/best@2/mean", "acc/worst@4/mean", "acc/pass@1", "acc/pass@4", "reward/mean@4"):
        assert f"val-aux/gsm/{aux}" in names
    assert "val-aux/gsm/reward/pass@1" not in names  # pass@k only for the core variable
    # without acc, reward is the core variable
    names = val_metrics_to_names(process_validation_metrics(["gsm"] * 2, ["u"] * 2, {"reward": [1.0, 0.0]}))
    assert names["val-core/gsm/reward/mean@2"] == 0.5 and "val-aux/gsm/reward/pass@1" in names
