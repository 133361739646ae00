"""The SFT LR schedule: the SEMANTICS example, no LR-0 first update, warmup == total, wsd."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.trainer.sft_schedule import build_sft_scheduler, sft_lr_multiplier

from config_fixtures import section


def lrs(total, values):
    optim = section("sft_trainer", "optim", **values)  # the typed optim section: unset keys take the YAML's value
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=optim.lr)
    sched = build_sft_scheduler(opt, optim, total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_semantics_example_cosine():
    # lr 1.5e-6, warmup 0.1 of 100 steps → W = 10, min ratio 0.1
    got = lrs(100, {"lr": 1.5e-6, "warmup_steps_ratio": 0.1, "min_lr_ratio": 0.1, "lr_scheduler": "cosine"})
    assert got[0] == pytest.approx(1.5e-7, rel=1e-9)            # starts at min_lr_ratio × lr, not 0
    assert got[5] == pytest.approx(1.5e-7 + (1.5e-6 - 1.5e-7) * 5 / 10, rel=1e-9)  # linear warmup
    assert got[10] == pytest.approx(1.5e-6, rel=1e-9) and max(got) == got[10]  # peak at 10 %
    # halfway through the decay (step 10 + 90/2) the cosine is at the midpoint of [min, max]
    assert got[55] == pytest.approx(0.55 * 1.5e-6, rel=1e-9)
    # last update: p = 89/90 → 0.1 + 0.9·½(1 + cos(0.98889π)) = 0.1 + 0.9·0.000305 → 1.5041e-7; 1.5e-7 at s = 100
    assert got[99] == pytest.approx(1.5e-7 * (1 + 9 * 0.5 * (1 + math.cos(math.pi * 89 / 90))), rel=1e-9)
    assert got[99] == pytest.approx(1.5e-7, rel=3e-3)
    assert sft_lr_multiplier(100, 100, 10, "cosine", 0.1) == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(got[10:], got[11:]))


def test_first_update_never_at_zero_and_warmup_equal_total():
    got = lrs(10, {"lr": 1.0, "warmup_steps_ratio": 1.0, "min_lr_ratio": 0.0, "lr_scheduler": "cosine"})
    # W = 10 = total: (s + 1) / 11 for every step, rising to the end
    assert got == pytest.approx([(s + 1) / 11 for s in range(10)])


def test_wsd_holds_then_decays():
    got = lrs(20, {"lr": 1.0, "warmup_steps_ratio": 0.1, "min_lr_ratio": 0.2, "lr_scheduler": "wsd",
                   "stable_ratio": 0.5})
    # W = 2: 0.2, 0.6, then 1.0 held for int(0.5 × 18) = 9 steps (s = 2..10), then a cosine over s = 11..19 with
    # p = (s − 10)/10: p = 1/10 at s = 11 (below the peak), 9/10 at s = 19 (just above 0.2)
    assert got[:2] == pytest.approx([0.2, 0.6])
    assert got[2:11] == pytest.approx([1.0] * 9)
    assert got[11] == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * 0.1)))
    assert got[19] == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * 0.9)))


def test_stable_ratio_zero_stays_zero():
    # stable_ratio=0 (was rewritten to 0.9 by `x or 0.9`): no stable phase, the decay starts right after warmup.
    # W = int(0.1 × 20) = 2, decay_start = 2 + int(0 × 18) = 2, p = (s − 2 + 1)/(20 − 2 + 1) = (s − 1)/19 and the
    # multiplier is ½(1 + cos(πp)) (min_lr_ratio 0). With 0.9, decay_start would be 2 + 16 = 18: s = 2..17 at 1.0.
    got = lrs(20, {"lr": 1.0, "warmup_steps_ratio": 0.1, "min_lr_ratio": 0.0, "lr_scheduler": "wsd",
                   "stable_ratio": 0.0})
    assert got[2] == pytest.approx(0.5 * (1 + math.cos(math.pi / 19)))
    assert got[17] == pytest.approx(0.5 * (1 + math.cos(math.pi * 16 / 19)))


def test_unknown_scheduler():
    with pytest.raises(ValueError, match="lr_scheduler"):
        lrs(5, {"lr": 1.0, "lr_scheduler": "linear"})
