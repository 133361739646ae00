"""verl 0.9's own launch scripts pass `rlhf config check` here, with only a CPU user's swaps.

The scripts are vendored unchanged in tests/data/verl09_examples/ (README there: source paths, commits, licence).
Each is read as a shell would (flows/verl_script.py: arrays, arithmetic, if/case) with ``DEVICE=gpu`` and an empty
``MACHINE`` (what a user's shell holds when running the GPU branch of verl 0.9's examples), then the swaps of
:func:`cpu_args` (local model and data, the distillation teachers' model_path local too, 2 CPU workers, the HF rollout
engine, sequence parallelism 1, a local reward file) are applied to the verl command's own overrides, what the user's shell fills in is filled in (``$HOME``,
``$(date +FORMAT)``), and `rlhf config check` runs on them. Every key of every
script must be known here: the conversion to an experiment file reports none as unknown.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from flows.from_verl import CONFIG_OF, convert
from flows.verl_script import read_script
from rlhf_cli import main as rlhf_main
from tests.fixtures.verl_example_fixtures import CPU_VALUES, SEQUENCE_PARALLEL
from tests.paths import TEST_DATA

EXAMPLES = TEST_DATA / "verl09_examples"
SCRIPTS = sorted(EXAMPLES.glob("*.sh"))
PRESET = {"DEVICE": "gpu", "MACHINE": ""}

# Hand-read from each script: (what it exercises, stage, algorithm.adv_estimator or None)
EXPECTED = {
    "ppo_trainer__run_qwen3_8b_fsdp.sh": ("PPO with a GAE critic, critic.fsdp.*", "ppo", "gae"),
    "grpo_trainer__run_qwen3_8b_fsdp.sh": ("GRPO, device case/if branches", "ppo", "grpo"),
    "rloo_trainer__run_qwen3_8b_fsdp.sh": ("RLOO", "ppo", "rloo"),
    "reinforce_plus_plus_trainer__run_qwen3_8b_fsdp.sh": ("REINFORCE++", "ppo", "reinforce_plus_plus"),
    "remax_trainer__run_qwen3_8b_fsdp.sh": ("ReMax", "ppo", "remax"),
    "gspo_trainer__run_qwen3_8b_fsdp.sh": ("GSPO (policy_loss.loss_mode=gspo)", "ppo", "grpo"),
    "cispo_trainer__run_qwen3_8b_fsdp.sh": ("CISPO (policy_loss.loss_mode=cispo)", "ppo", "grpo"),
    "sapo_trainer__run_qwen3_8b_fsdp.sh": ("SAPO (tau_pos/tau_neg)", "ppo", "grpo"),
    "otb_trainer__run_qwen3_8b_fsdp.sh": ("optimal token baseline, calculate_sum_pi_squared", "ppo",
                                          "optimal_token_baseline"),
    "gdpo_trainer__run_qwen3_8b_fsdp.sh": ("GDPO, the reward.* section", "ppo", "gdpo"),
    "rollout_correction__run_qwen2_5_7b_fsdp.sh": ("rollout_correction with RLOO at rollout.n=1", "ppo", "rloo"),
    "rollout_correction__run_qwen2_5_7b_fsdp_multi_rs.sh": ("algorithm.rollout_correction: two rejection options, "
                                                            "bypass mode", "ppo", "grpo"),
    "recipe_dapo__run_dapo_qwen2.5_32b.sh": ("DAPO dynamic sampling (algorithm.filter_groups), $((arithmetic))",
                                             "ppo", "grpo"),
    "tuning_lora__run_qwen3_8b_fsdp.sh": ("GRPO with LoRA", "ppo", "grpo"),
    "prefix_grouper__run_qwen3_8b_fsdp.sh": ("prefix-grouped forward (use_prefix_grouper) with dynamic bsz", "ppo",
                                             "grpo"),
    "recipe_retool__run_qwen2_7b_dapo.sh": ("multi-turn tools (ReTool, a sandbox code tool), DAPO loss", "ppo", "grpo"),
    "one_step_off_policy__grpo_0.6b_gsm8k_fsdp2_2_6.sh": ("one-step off-policy trainer", "ppo", "grpo"),
    "fully_async_policy__dapo_7b_async_retool.sh": ("fully async trainer, multi-turn tools", "ppo", "grpo"),
    "sft_gsm8k__run_qwen2_5_0_5b_fsdp.sh": ("engine SFT (model.path, engine=fsdp)", "sft", None),
    "sft_multiturn__run_qwen2_5_0_5b_fsdp.sh": ("multi-turn SFT (data.messages_key)", "sft", None),
    "on_policy_distillation_trainer__run_qwen3_8b_fsdp.sh": ("on-policy distillation (distillation.*), one teacher",
                                                             "ppo", "grpo"),
    "on_policy_distillation_trainer__run_qwen3_8b_mopd_fsdp.sh": ("multi-teacher on-policy distillation "
                                                                  "(+distillation.teacher_models.<name>.*)", "ppo",
                                                                  "grpo"),
}

MODEL_KEYS = {"actor_rollout_ref.model.path", "critic.model.path", "model.path", "model.partial_pretrain"}
TEACHER_PATH = re.compile(r"distillation\.teacher_models\.[^.]+\.model_path")  # a distillation teacher: local too
DATA_KEYS = {"data.train_files": "train", "data.val_files": "val"}
REWARD_KEYS = {"reward.custom_reward_function.path", "custom_reward_function.path"}


# Scripts `rlhf config check` refuses, and why (the line it prints must match): the rest pass.
REFUSED = {
    # SEMANTICS "estimators": RLOO's baseline is the mean of the *other* samples, so n = 1 is a config error (verl
    # silently trains on the raw score); the script leaves rollout.n at its default, 1
    "rollout_correction__run_qwen2_5_7b_fsdp.sh": r"algorithm.adv_estimator=rloo needs actor_rollout_ref.rollout.n >= 2",
}

# Scripts refused for one key only, whose error names the fix; with that fix they pass (and the rest of the test runs)
FIXED_BY: dict = {
    # (none: verl's fully async scripts set data.train_batch_size=0, read here as ppo_mini_batch_size ×
    # require_batches with a notice, rlhf_core/config/off_policy.py derive_fully_async_batch)
}


def cpu_args(args: list[str], stage: str, model_dir: str, data_dir: Path, reward_file: str) -> list[str]:
    """The verl command's overrides with a CPU user's swaps: local model and data, :data:`CPU_VALUES`, sequence
    parallelism 1, the reward file local (what the test's docstring lists; nothing else changes)."""
    out = []
    data = {"train": data_dir / ("sft.parquet" if stage == "sft" else "train.parquet"),
            "val": data_dir / ("sft.parquet" if stage == "sft" else "val.parquet")}
    for arg in args:
        written, _, value = arg.partition("=")
        key = written.lstrip("+")
        if key in MODEL_KEYS or TEACHER_PATH.fullmatch(key):
            value = model_dir
        elif key in DATA_KEYS:
            value = f"['{data[DATA_KEYS[key]]}']"
        elif key in REWARD_KEYS:
            value = reward_file
        elif key in CPU_VALUES:
            value = CPU_VALUES[key]
        elif SEQUENCE_PARALLEL.fullmatch(key):
            value = "1"
        elif key == "trainer.default_local_dir":
            value = str(data_dir / "ckpt")
        value = _shell_fills(value)
        out.append(f"{written}={value}" if _ or written != arg else arg)
    if stage == "ppo" and not any(a.startswith("actor_rollout_ref.rollout.name=") for a in out):
        out.append("actor_rollout_ref.rollout.name=hf")  # a script that never names the engine: verl's vllm
    if stage == "ppo" and not any(a.startswith("trainer.n_gpus_per_node=") for a in out):
        out.append(f"trainer.n_gpus_per_node={CPU_VALUES['trainer.n_gpus_per_node']}")  # nor its GPUs: verl's 8
    return out


def _shell_fills(value: str) -> str:
    """What the user's shell puts in place of ``$HOME`` and ``$(date +FORMAT)`` (left unexpanded by the reader)."""
    value = re.sub(r"\$\(date \+([^)]*)\)", lambda m: time.strftime(m.group(1)), value)
    return re.sub(r"\$\{?HOME\}?", os.environ.get("HOME", "/root"), value)


def test_every_vendored_script_is_expected_and_the_issue_s_kinds_are_covered():
    assert {p.name for p in SCRIPTS} == set(EXPECTED) and len(set(EXPECTED) - set(REFUSED)) >= 10
    kinds = " ".join(what for what, _, _ in EXPECTED.values())
    for kind in ("GAE", "GRPO", "RLOO", "REINFORCE++", "ReMax", "GSPO", "CISPO", "DAPO dynamic sampling",
                 "rollout_correction", "LoRA", "multi-turn tools", "SFT"):
        assert kind in kinds, kind


@pytest.mark.filterwarnings("ignore::rlhf_core.config.notices.ConfigNotice")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_a_verl_09_script_passes_config_check_once_local(script, tmp_path, capsys):
    _, stage, adv = EXPECTED[script.name]
    [cmd] = read_script(script.read_text(), str(script), PRESET).commands
    assert cmd.stage == stage
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "qwen2"}')
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    args = cpu_args(cmd.args, stage, str(tmp_path / "model"), tmp_path, str(reward))
    config_name = CONFIG_OF[stage]
    code = rlhf_main(["config", "check", "--config-name", config_name, *args])
    err = capsys.readouterr().err
    if script.name in FIXED_BY:
        refusal, fix = FIXED_BY[script.name]
        assert code == 1 and re.search(refusal, err) and err.count("\n  - ") == 1, err  # that key alone
        args = [*args, *fix]
        code = rlhf_main(["config", "check", "--config-name", config_name, *args])
        err = capsys.readouterr().err
    if script.name in REFUSED:
        assert code == 1 and re.search(REFUSED[script.name], err), err
        return
    assert code == 0, f"{script.name}: {err}"
    assert f"OK: {config_name} is valid" in err
    if adv is not None:
        assert f"algorithm.adv_estimator={adv}" in args
    conv = convert(script.read_text(), str(script), PRESET)
    assert conv.unknown == [], conv.unknown  # every key of the script is one this project knows
