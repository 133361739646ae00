"""AdamW from ``optim.*`` (the LR schedules are tested in test_lr_schedule*.py)."""
from __future__ import annotations

import torch

from rlhf_core.workers.optim import build_optimizer

from config_fixtures import section


def _optim(**values):
    """The typed actor ``optim`` section (YAML defaults) with ``values`` set."""
    return section("ppo_trainer", "actor_rollout_ref.actor.optim", **values)


def test_adamw_reads_betas_and_weight_decay():
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], _optim(lr=0.5, betas=[0.8, 0.9], weight_decay=0.1))
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["weight_decay"]) == (0.5, (0.8, 0.9), 0.1)
