"""AdamW from ``optim.*`` (the LR schedules are tested in test_lr_schedule*.py)."""
from __future__ import annotations

import torch

from rlhf_core.workers.optim import build_optimizer

from tests.fixtures.config_fixtures import section


def _optim(**values):
    """The typed actor ``optim`` section (YAML defaults) with ``values`` set."""
    return section("ppo_trainer", "actor_rollout_ref.actor.optim", **values)


def test_adamw_reads_betas_and_weight_decay():
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], _optim(lr=0.5, betas=[0.8, 0.9], weight_decay=0.1))
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["weight_decay"]) == (0.5, (0.8, 0.9), 0.1)


def test_fused_adamw_is_the_per_tensor_update():
    # the optimizer built here is torch's fused AdamW on CPU; five steps of it on the same gradients give the
    # weights that the default (per-tensor) AdamW gives, to float rounding, with weight decay and bias correction
    torch.manual_seed(0)
    shapes = [(64, 32), (32,), (7, 3, 5)]
    init = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(5)]
    cfg = _optim(lr=0.01, betas=[0.9, 0.95], weight_decay=0.1)
    fast = [torch.nn.Parameter(t.clone()) for t in init]
    ref = [torch.nn.Parameter(t.clone()) for t in init]
    opt = build_optimizer(fast, cfg)
    assert opt.defaults["fused"] is True
    ref_opt = torch.optim.AdamW(ref, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, eps=float(cfg.eps),
                                foreach=False)
    for step in grads:
        for p, q, g in zip(fast, ref, step):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    for p, q, t in zip(fast, ref, init):
        assert (p - t).abs().max() > 1e-3  # the weights moved
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


def test_frozen_parameters_are_left_out():
    frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2)), frozen], _optim())
    assert len(opt.param_groups[0]["params"]) == 1 and opt.defaults["fused"] is True


def test_a_loaded_state_keeps_this_runs_fused_kernel():
    # a state saved by the per-tensor AdamW (fused None, as before this optimizer went fused) loads its moments and
    # step count, but the param groups keep fused=True
    from rlhf_core.workers.optim import keep_optimizer_implementation

    old_params = [torch.nn.Parameter(torch.ones(3))]
    old = torch.optim.AdamW(old_params, lr=0.1)
    old_params[0].grad = torch.ones(3)
    old.step()
    opt = build_optimizer([torch.nn.Parameter(torch.ones(3))], _optim())
    opt.load_state_dict(old.state_dict())
    assert opt.param_groups[0]["fused"] is None  # what torch's load does
    keep_optimizer_implementation(opt)
    assert opt.param_groups[0]["fused"] is True
    assert int(opt.state[opt.param_groups[0]["params"][0]]["step"]) == 1  # the loaded state is kept
    opt.param_groups[0]["params"][0].grad = torch.ones(3)
    opt.step()  # the fused kernel runs on the loaded moments
    assert int(opt.state[opt.param_groups[0]["params"][0]]["step"]) == 2
