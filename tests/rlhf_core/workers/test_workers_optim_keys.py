"""verl 0.9's optimizer keys: ``optim.optimizer``, ``optim.override_optimizer_config``, ``optim.zero_indexed_step``
(actor, critic, SFT), and ``critic.data_loader_seed``."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.config import load_config
from tests.rlhf_core.workers.test_lr_schedule import _lrs
from rlhf_core.workers.optim import build_optimizer

A = "actor_rollout_ref.actor.optim."


def _params():
    return [torch.nn.Parameter(torch.ones(3))]


@pytest.mark.parametrize("name, cls", [("adam", torch.optim.AdamW), ("adamw", torch.optim.AdamW),
                                       ("AdamW", torch.optim.AdamW), ("Adam", torch.optim.Adam),
                                       ("SGD", torch.optim.SGD), ("RMSprop", torch.optim.RMSprop)])
def test_optimizer_names_the_torch_class(name, cls):
    opt = build_optimizer(_params(), load_config("ppo_trainer", [f"{A}optimizer={name}"]).actor_rollout_ref.actor.optim)
    assert type(opt) is cls
    group = opt.param_groups[0]
    assert ("betas" in group) == ("adam" in name.lower())  # verl: betas only for the Adam family


def test_adam_and_adamw_differ_by_decoupled_weight_decay():
    # one step from w = 1 with gradient 0, lr 0.1, weight_decay 0.5:
    #   AdamW: w ← w·(1 − lr·wd) = 0.95 (decoupled; the zero Adam step adds nothing)
    #   Adam:  g ← g + wd·w = 0.5, the first Adam step is lr·g/(|g| + eps) ≈ 0.1 → w ≈ 0.9
    out = {}
    for name in ("AdamW", "Adam"):
        cfg = load_config("ppo_trainer", [f"{A}optimizer={name}", f"{A}lr=0.1", f"{A}weight_decay=0.5"])
        params = _params()
        opt = build_optimizer(params, cfg.actor_rollout_ref.actor.optim)
        params[0].grad = torch.zeros(3)
        opt.step()
        out[name] = params[0].detach()
    torch.testing.assert_close(out["AdamW"], torch.full((3,), 0.95))
    torch.testing.assert_close(out["Adam"], torch.full((3,), 0.9), atol=1e-6, rtol=0)


@pytest.mark.parametrize("section, prefix", [("ppo_trainer", A), ("ppo_trainer", "critic.optim."),
                                             ("sft_trainer", "optim.")])
def test_override_optimizer_config_reaches_the_optimizer(section, prefix):
    cfg = load_config(section, [f"+{prefix}override_optimizer_config.amsgrad=true",
                                f"+{prefix}override_optimizer_config.eps=0.125"])
    node = cfg
    for part in prefix.rstrip(".").split("."):
        node = node[part]
    group = build_optimizer(_params(), node).param_groups[0]
    assert group["amsgrad"] is True and group["eps"] == 0.125  # the override is applied last (verl)


def test_unknown_override_keyword_fails_naming_the_key():
    cfg = load_config("ppo_trainer", [f"+{A}override_optimizer_config.momentum=0.9"])
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.optim\.override_optimizer_config.*'momentum'"):
        build_optimizer(_params(), cfg.actor_rollout_ref.actor.optim)


def test_sgd_override_gets_its_keywords_and_no_betas():
    cfg = load_config("ppo_trainer", ["critic.optim.optimizer=SGD",
                                      "+critic.optim.override_optimizer_config.momentum=0.5"])
    opt = build_optimizer(_params(), cfg.critic.optim)
    assert type(opt) is torch.optim.SGD and opt.param_groups[0]["momentum"] == 0.5


@pytest.mark.parametrize("prefix", [A, "critic.optim."])
def test_zero_indexed_step_false_shifts_the_cosine_schedule_by_one(prefix):
    # cosine, no warmup, T = 4, lr 1, min ratio 0, one half cycle: multiplier(s) = ½(1 + cos(π·s/4))
    # zero_indexed_step=True: s = 0, 1, 2, 3 → 1, 0.8536, 0.5, 0.1464; False: s + 1 → 0.8536, 0.5, 0.1464, 0
    base = [f"{prefix}lr=1.0", f"{prefix}lr_scheduler_type=cosine", f"{prefix}total_training_steps=4",
            f"{prefix}lr_warmup_steps=0"]
    node = lambda cfg: cfg.critic.optim if prefix.startswith("critic") else cfg.actor_rollout_ref.actor.optim
    zero = _lrs(node(load_config("ppo_trainer", base)), 4)
    one = _lrs(node(load_config("ppo_trainer", base + [f"{prefix}zero_indexed_step=False"])), 4)
    expect = [0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(5)]
    assert zero == pytest.approx(expect[:4], abs=1e-9)
    assert one == pytest.approx(expect[1:], abs=1e-9)


def test_zero_indexed_step_is_ignored_by_the_constant_schedule():
    # verl's get_constant_schedule_with_warmup takes no zero_indexed_step: the warmup is the same either way
    base = [f"{A}lr=1.0", f"{A}lr_warmup_steps=2", f"{A}total_training_steps=4"]
    cfg = lambda *o: load_config("ppo_trainer", base + list(o)).actor_rollout_ref.actor.optim
    assert _lrs(cfg(), 4) == _lrs(cfg(f"{A}zero_indexed_step=False"), 4)


def test_sft_zero_indexed_step_false_shifts_its_cosine_schedule():
    from rlhf_core.workers.lr_schedule import build_sft_lr_scheduler

    def lrs(*overrides):
        cfg = load_config("sft_trainer", ["optim.lr=1.0", "optim.lr_scheduler=cosine", "optim.lr_warmup_steps=0",
                                          *overrides]).optim
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = build_sft_lr_scheduler(opt, cfg, 4)
        out = []
        for _ in range(4):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out

    # as the PPO case: ½(1 + cos(π·s/4)) at s = 0..3, or at s + 1 = 1..4
    expect = [0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(5)]
    assert lrs() == pytest.approx(expect[:4], abs=1e-9)
    assert lrs("optim.zero_indexed_step=False") == pytest.approx(expect[1:], abs=1e-9)


@pytest.mark.parametrize("section, prefix", [("ppo_trainer", A), ("ppo_trainer", "critic.optim."),
                                             ("sft_trainer", "optim.")])
def test_eps_is_read_from_every_optim_section(section, prefix):
    node = load_config(section, [])
    for part in prefix.rstrip(".").split("."):
        node = node[part]
    assert build_optimizer(_params(), node).param_groups[0]["eps"] == 1e-8  # the declared default, torch's
    node.eps = 0.25
    assert build_optimizer(_params(), node).param_groups[0]["eps"] == 0.25
