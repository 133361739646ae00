"""Pins of the LR schedules' numbers (PPO actor/critic ``optim.*`` and SFT ``optim.*``), from the shipped YAML.

Written before the two schedule modules became one, and kept passing after. Every expected value is derived
by hand in the comments: ``W`` warmup steps, ``T`` total steps, ``m`` min_lr_ratio, ``s`` the 0-based update.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.config import load_config
from rlhf_core.workers.lr_schedule import build_lr_scheduler, build_sft_lr_scheduler

A = "actor_rollout_ref.actor.optim."


def _run(opt, sched, steps):
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def ppo_lrs(section: str, overrides: list[str], steps: int) -> list[float]:
    cfg = load_config("ppo_trainer", overrides)
    optim_cfg = cfg.actor_rollout_ref.actor.optim if section == "actor" else cfg.critic.optim
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=float(optim_cfg.lr))
    return _run(opt, build_lr_scheduler(opt, optim_cfg), steps)


def sft_lrs(overrides: list[str], total: int, steps: int | None = None) -> list[float]:
    cfg = load_config("sft_trainer", overrides)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=float(cfg.optim.lr))
    return _run(opt, build_sft_lr_scheduler(opt, cfg.optim, total), steps or total)


def _cos(m: float, p: float, cycles: float = 0.5) -> float:
    return m + (1 - m) * 0.5 * (1 + math.cos(2 * math.pi * cycles * p))


def test_ppo_default_is_constant_without_warmup():
    # YAML defaults: constant, lr_warmup_steps=-1, ratio 0 → W = 0 → factor 1 everywhere
    assert ppo_lrs("actor", [], 4) == pytest.approx([1e-6] * 4)
    assert ppo_lrs("critic", [], 4) == pytest.approx([1e-5] * 4)


def test_ppo_constant_with_warmup_steps_never_starts_at_zero():
    # W = 4 explicit: (s + 1) / (W + 1) = 0.2, 0.4, 0.6, 0.8, then 1
    got = ppo_lrs("actor", [A + "lr=1.0", A + "lr_warmup_steps=4"], 7)
    assert got == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0])


def test_ppo_warmup_steps_zero_ignores_the_ratio():
    # lr_warmup_steps=0 (>= 0) wins over lr_warmup_steps_ratio=0.5 → no warmup (verl: ratio only when < 0)
    got = ppo_lrs("actor", [A + "lr=1.0", A + "lr_warmup_steps=0", A + "lr_warmup_steps_ratio=0.5",
                            A + "total_training_steps=10"], 3)
    assert got == pytest.approx([1.0, 1.0, 1.0])


def test_ppo_cosine_with_ratio_warmup_and_min_lr_ratio():
    # T = 10, ratio 0.2 → W = int(2.0) = 2: s = 0, 1 → 1/3, 2/3; then p = (s − 2)/8, 0.1 + 0.9·½(1 + cos πp);
    # s = 6 is the midpoint (p = ½) → 0.55; s = 10 is p = 1 → 0.1
    got = ppo_lrs("actor", [A + "lr=1.0", A + "lr_scheduler_type=cosine", A + "lr_warmup_steps_ratio=0.2",
                            A + "min_lr_ratio=0.1", A + "total_training_steps=10"], 11)
    expected = [1 / 3, 2 / 3] + [_cos(0.1, (s - 2) / 8) for s in range(2, 11)]
    assert got == pytest.approx(expected)
    assert got[6] == pytest.approx(0.55) and got[10] == pytest.approx(0.1)


def test_ppo_cosine_full_cycle():
    # num_cycles = 1, W = 0, T = 8, m = 0: ½(1 + cos 2πp), p = s/8 → 1 at s = 0, 0 at s = 4, back to 1 at s = 8
    got = ppo_lrs("actor", [A + "lr=1.0", A + "lr_scheduler_type=cosine", A + "num_cycles=1.0",
                            A + "total_training_steps=8"], 9)
    assert got == pytest.approx([_cos(0.0, s / 8, 1.0) for s in range(9)], abs=1e-12)
    assert got[4] == pytest.approx(0.0, abs=1e-12) and got[8] == pytest.approx(1.0)


def test_critic_cosine_null_min_lr_ratio_is_zero():
    # critic.optim.min_lr_ratio defaults to null, read as 0.0 (verl); W = 1: 1/2, then p = (s − 1)/4
    got = ppo_lrs("critic", ["critic.optim.lr=2.0", "critic.optim.lr_scheduler_type=cosine",
                             "critic.optim.lr_warmup_steps=1", "critic.optim.total_training_steps=5"], 6)
    expected = [1.0] + [2.0 * _cos(0.0, (s - 1) / 4) for s in range(1, 6)]
    assert got == pytest.approx(expected, abs=1e-12)
    assert got[5] == pytest.approx(0.0, abs=1e-12)


def test_sft_cosine_zero_min_ratio():
    # T = 20, ratio 0.1 → W = 2, m = 0: warmup (s + 1)/(W + 1) = 1/3, 2/3; then ½(1 + cos πp), p = (s − 2)/18
    got = sft_lrs(["optim.lr=1.0", "optim.warmup_steps_ratio=0.1"], 20)
    assert got == pytest.approx([1 / 3, 2 / 3] + [_cos(0.0, (s - 2) / 18) for s in range(2, 20)])
    assert min(got) > 0  # the last update (p = 17/18) is still above 0


def test_sft_cosine_semantics_example():
    # SEMANTICS: lr 1.5e-6, warmup 0.1, m = 0.1, T = 100 → W = 10; warmup from m: 0.1 + 0.9·s/10
    got = sft_lrs(["optim.lr=1.5e-6", "optim.warmup_steps_ratio=0.1", "optim.min_lr_ratio=0.1"], 100)
    lr = 1.5e-6
    assert got[0] == pytest.approx(1.5e-7, rel=1e-9)
    assert got[3] == pytest.approx(lr * (0.1 + 0.9 * 3 / 10), rel=1e-9)
    assert got[10] == pytest.approx(lr, rel=1e-9) and max(got) == got[10]
    assert got[55] == pytest.approx(lr * 0.55, rel=1e-9)                     # p = 45/90 = ½
    assert got[99] == pytest.approx(lr * _cos(0.1, 89 / 90), rel=1e-9)      # ends just above 1.5e-7


def test_sft_warmup_equal_to_total():
    # ratio 1 → W = T = 5, m = 0: (s + 1)/6 for every update, no division by zero in the decay
    got = sft_lrs(["optim.lr=1.0", "optim.warmup_steps_ratio=1.0"], 5)
    assert got == pytest.approx([(s + 1) / 6 for s in range(5)])


def test_sft_wsd():
    # T = 20, W = 2, m = 0.2, stable_ratio 0.5 → warmup from m: 0.2, 0.6; stable D = int(0.5 × 18) = 9 updates
    # (s = 2..10) at 1.0; then the decay over s = 11..19 as pinned here
    got = sft_lrs(["optim.lr=1.0", "optim.warmup_steps_ratio=0.1", "optim.min_lr_ratio=0.2",
                   "optim.lr_scheduler=wsd", "optim.stable_ratio=0.5"], 20)
    assert got[:2] == pytest.approx([0.2, 0.6])
    assert got[2:11] == pytest.approx([1.0] * 9)
    # verl's get_wsd_schedule_with_warmup: p = (s − 11)/9 over the 9 decay updates s = 11..19, so s = 11 is still
    # at the peak. Changed from the first version (p = (s − 10)/10, already below the peak at s = 11).
    assert got[11:] == pytest.approx([_cos(0.2, (s - 11) / 9) for s in range(11, 20)])
    assert got[11] == pytest.approx(1.0) and got[19] == pytest.approx(_cos(0.2, 8 / 9))
