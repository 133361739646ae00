"""The one LR schedule module: edge cases, errors naming keys, the deprecated ``optim.warmup_style``."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.config import ConfigError, load_config
from rlhf_core.workers.lr_schedule import build_lr_scheduler, lr_multiplier

A = "actor_rollout_ref.actor.optim."


def _actor_optim(*overrides: str):
    return load_config("ppo_trainer", list(overrides)).actor_rollout_ref.actor.optim


def _lrs(optim_cfg, steps: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=float(optim_cfg.lr))
    sched = build_lr_scheduler(opt, optim_cfg)
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_warmup_equal_to_total_never_zero_and_no_crash():
    # W = T = 5: (s + 1)/6 up to s = 4, 1 at s = 5 for every kind
    for kind in ("constant", "cosine", "wsd"):
        assert lr_multiplier(0, kind=kind, warmup=5, total=5) == pytest.approx(1 / 6)
        assert lr_multiplier(4, kind=kind, warmup=5, total=5) == pytest.approx(5 / 6)
    assert lr_multiplier(5, kind="cosine", warmup=5, total=5) == pytest.approx(1.0)


def test_init_lr_ratio_is_verl_linear_ramp():
    # verl: init + (1 − init)·s/W; init 0.25, W = 3 → 0.25, 0.5, 0.75, then 1
    got = [lr_multiplier(s, kind="constant", warmup=3, total=10, init_lr_ratio=0.25) for s in range(5)]
    assert got == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])


def test_wsd_matches_verl_phases():
    # verl get_wsd_schedule_with_warmup, W = 0, T = 10, stable 0.6 → D = 6 at 1.0 (s = 0..5); decay over 4 updates
    # p = (s − 6)/4: s = 6 → 1.0, s = 8 → ½ → m + (1 − m)/2; after T: m
    m = 0.1
    got = [lr_multiplier(s, kind="wsd", warmup=0, total=10, min_lr_ratio=m, stable_ratio=0.6) for s in range(12)]
    assert got[:7] == pytest.approx([1.0] * 7)
    assert got[8] == pytest.approx(0.55)
    assert got[9] == pytest.approx(m + (1 - m) * 0.5 * (1 + math.cos(math.pi * 0.75)))
    assert got[10:] == pytest.approx([m, m])


def test_wsd_stable_ratio_zero_is_cosine():
    # verl's docstring: stable_ratio 0 behaves exactly like the cosine schedule
    for s in range(10):
        cos = lr_multiplier(s, kind="cosine", warmup=2, total=10, min_lr_ratio=0.2)
        assert lr_multiplier(s, kind="wsd", warmup=2, total=10, min_lr_ratio=0.2, stable_ratio=0.0) == cos


def test_errors_name_the_key():
    with pytest.raises(ValueError, match="total_training_steps"):
        _lrs(_actor_optim(A + "lr_scheduler_type=cosine"), 1)
    with pytest.raises(ValueError, match="total_training_steps"):
        _lrs(_actor_optim(A + "lr_warmup_steps_ratio=0.1"), 1)
    with pytest.raises(ValueError, match="LR schedule 'linear'"):
        lr_multiplier(0, kind="linear", warmup=0, total=1)
    with pytest.raises(ConfigError, match="lr_scheduler_type"):
        load_config("ppo_trainer", [A + "lr_scheduler_type=wsd"])  # verl's PPO has constant and cosine only


def test_deprecated_warmup_style_cosine_gives_a_cosine_lr():
    # verl 0.6 FSDPOptimizerConfig: a set warmup_style replaces lr_scheduler_type. T = 4, W = 0, m = 0:
    # ½(1 + cos(πs/4)) → 1, 0.8536, 0.5, 0.1464
    with pytest.warns(DeprecationWarning, match="warmup_style"):
        optim = _actor_optim(A + "lr=1.0", A + "warmup_style=cosine", A + "total_training_steps=4")
    assert optim.lr_scheduler_type == "cosine"
    assert _lrs(optim, 4) == pytest.approx([0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(4)])
    with pytest.warns(DeprecationWarning):
        critic = load_config("ppo_trainer", ["critic.optim.warmup_style=cosine", "critic.optim.lr=1.0",
                                             "critic.optim.total_training_steps=4"]).critic.optim
    assert _lrs(critic, 3) == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5])


def test_plus_warmup_style_works_as_in_verl():
    # the command line: '+' adds where the current value is null (Hydra's rule), so it takes effect
    with pytest.warns(DeprecationWarning):
        optim = _actor_optim("+" + A + "warmup_style=cosine", A + "total_training_steps=4", A + "lr=1.0")
    assert optim.lr_scheduler_type == "cosine"
    assert _lrs(optim, 3) == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5])
    with pytest.warns(DeprecationWarning):
        assert _actor_optim("++" + A + "warmup_style=cosine").lr_scheduler_type == "cosine"


def test_warmup_style_and_lr_scheduler_type_disagree():
    with pytest.raises(ConfigError, match=r"warmup_style='constant'.*lr_scheduler_type='cosine'"):
        load_config("ppo_trainer", [A + "warmup_style=constant", A + "lr_scheduler_type=cosine"])
    with pytest.raises(ConfigError, match=r"warmup_style=.*choices|warmup_style.*'linear'"):
        load_config("ppo_trainer", [A + "warmup_style=linear"])


def test_sft_stable_ratio_zero_stays_zero():
    # optim.stable_ratio=0 (an old `x or 0.9` turned it into 0.9) means no stable phase: the decay starts right after
    # warmup. T = 20, warmup_steps_ratio 0.1 → W = 2, D = int(0 × 18) = 0, p = (s − 2)/18, multiplier ½(1 + cos(πp))
    # with min_lr_ratio 0. With 0.9, D would be 16 and s = 2..17 would all sit at 1.0.
    from tests.fixtures.config_fixtures import section
    from rlhf_core.workers.lr_schedule import build_sft_lr_scheduler

    optim_cfg = section("sft_trainer", "optim", lr=1.0, warmup_steps_ratio=0.1, min_lr_ratio=0.0,
                        lr_scheduler="wsd", stable_ratio=0.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_sft_lr_scheduler(opt, optim_cfg, 20)
    got = []
    for _ in range(20):
        got.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert got[3] == pytest.approx(0.5 * (1 + math.cos(math.pi / 18)))
    assert got[17] == pytest.approx(0.5 * (1 + math.cos(math.pi * 15 / 18)))
