"""LR schedules from ``optim.*``: warmup never starts at 0, constant and cosine values by hand."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.workers.optim import build_lr_scheduler, build_optimizer, lr_lambda

from config_fixtures import section


def _optim(**values):
    """The typed actor ``optim`` section (YAML defaults: constant schedule, no warmup) with ``values`` set."""
    return section("ppo_trainer", "actor_rollout_ref.actor.optim", **values)


def _lrs(values: dict, steps: int) -> list[float]:
    cfg = _optim(**values)
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)
    sched = build_lr_scheduler(opt, cfg)
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_warmup_ratio_then_constant():
    # total 10, ratio 0.3 → W = 3: factors 1/4, 2/4, 3/4, then 1
    lrs = _lrs({"lr": 1.0, "lr_warmup_steps_ratio": 0.3, "total_training_steps": 10}, 6)
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_explicit_warmup_steps_win_over_ratio():
    lrs = _lrs({"lr": 2.0, "lr_warmup_steps": 1, "lr_warmup_steps_ratio": 0.5, "total_training_steps": 10}, 3)
    assert lrs == pytest.approx([1.0, 2.0, 2.0])


def test_cosine_to_min_lr_ratio():
    cfg = {"lr": 1.0, "lr_warmup_steps": 0, "lr_scheduler_type": "cosine", "min_lr_ratio": 0.1,
           "total_training_steps": 4, "num_cycles": 0.5}
    lrs = _lrs(cfg, 5)
    # progress p = s/4: 0.1 + 0.9·½(1+cos πp) → 1, 0.8682, 0.55, 0.2318, 0.1
    expected = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(5)]
    assert lrs == pytest.approx(expected)
    assert lrs[-1] == pytest.approx(0.1)


def test_warmup_equal_to_total_does_not_crash_and_never_zero():
    assert lr_lambda(0, 5, 5, "cosine", 0.0, 0.5) == pytest.approx(1 / 6)
    assert lr_lambda(5, 5, 5, "cosine", 0.0, 0.5) == pytest.approx(1.0)


def test_errors_name_the_key():
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], _optim(lr=1.0))
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        build_lr_scheduler(opt, _optim(lr_scheduler_type="wsd", total_training_steps=3))
    with pytest.raises(ValueError, match="total_training_steps"):
        build_lr_scheduler(opt, _optim(lr_scheduler_type="cosine"))
    with pytest.raises(ValueError, match="total_training_steps"):
        build_lr_scheduler(opt, _optim(lr_warmup_steps_ratio=0.1))


def test_adamw_reads_betas_and_weight_decay():
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], _optim(lr=0.5, betas=[0.8, 0.9], weight_decay=0.1))
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["weight_decay"]) == (0.5, (0.8, 0.9), 0.1)
