"""`rlhf config show|check` through rlhf_core.config.cli.main."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlhf_core.config.cli import main


@pytest.mark.parametrize("name", ["ppo_trainer", "sft_trainer", "evaluation"])
def test_check_passes_on_shipped_configs(name, capsys):
    assert main(["check", "--config-name", name]) == 0
    assert f"OK: {name} is valid" in capsys.readouterr().err


def test_check_typo_exits_nonzero_naming_nearest_key(capsys):
    assert main(["check", "actor_rollout_ref.actor.ppo_mini_batchsize=4"]) == 1
    err = capsys.readouterr().err
    assert "Unknown config key 'actor_rollout_ref.actor.ppo_mini_batchsize'" in err
    assert "Did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'?" in err


def test_check_rule_violation_exits_nonzero(capsys):
    assert main(["check", "algorithm.adv_estimator=rloo"]) == 1
    assert "needs actor_rollout_ref.rollout.n >= 2" in capsys.readouterr().err


def test_check_with_world_size(capsys):
    # shipped: 256 prompts x n 1 per mini-batch; 16 workers x micro 8 = 128 divides 256, 3 workers do not
    assert main(["check", "--world-size", "16"]) == 0
    assert main(["check", "--world-size", "3"]) == 1
    assert "is not divisible by world size 3" in capsys.readouterr().err


def test_show_prints_resolved_yaml_with_overrides(capsys):
    assert main(["show", "--config-name", "ppo_trainer", "data.max_prompt_length=300",
                 "trainer.logger=[console,mlflow]"]) == 0
    shown = OmegaConf.create(capsys.readouterr().out)
    assert shown.actor_rollout_ref.rollout.prompt_length == 300  # interpolation resolved after the override
    assert list(shown.trainer.logger) == ["console", "mlflow"]
    assert "${" not in OmegaConf.to_yaml(shown)


def test_show_reports_deprecation_on_stderr(capsys):
    assert main(["show", "actor_rollout_ref.actor.ppo_micro_batch_size=64",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"]) == 0
    captured = capsys.readouterr()
    assert "converted to actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 (64 / world size 8)" in captured.err
    assert OmegaConf.create(captured.out).actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8


def test_bad_command_line_returns_2():
    assert main(["frobnicate"]) == 2
