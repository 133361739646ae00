"""verl 0.6.0's own launch scripts pass `rlhf config check` with their own keys.

tests/data/verl06/examples/ holds the command lines of nine scripts from verl's v0.6.0 `examples/`
(tests/data/verl06/extract_examples.py): PPO, PPO with a reward model, GRPO, GRPO + LoRA, ReMax, RLOO,
REINFORCE++ (plain and baseline), three of them with sequence balancing (use_dynamic_bsz). The test expands
the shell variables, splits the `python3 -m verl.trainer.main_ppo key=value ...` line like bash, applies only
the swaps in SWAPS (machine-specific values), and runs the check. Every other key goes through as verl's
user wrote it.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from rlhf_core.config.cli import main
from tests.paths import TEST_DATA

EXAMPLES = TEST_DATA / "verl06" / "examples"
LOCAL_MODEL = "/tmp/rlhf-tests/tiny-model"  # the check does not open the model: any local path will do
HAS_VLLM = importlib.util.find_spec("vllm") is not None

# The swaps, and why: key -> replacement value (applied when the script sets the key).
SWAPS = {
    # hub model names -> a local folder
    "actor_rollout_ref.model.path": LOCAL_MODEL,
    "critic.model.path": LOCAL_MODEL,
    "reward_model.model.path": LOCAL_MODEL,
    # 8 or 16 GPUs on one node -> 2 local workers (every script's batch sizes divide by 2)
    "trainer.n_gpus_per_node": "2",
    "trainer.nnodes": "1",
    # vLLM tensor parallelism of 2 or 4 GPUs -> 1 (the TP size must divide the 2 workers' world)
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
    # vllm -> hf only where the vllm package is not installed (`config check` requires the engine)
    **({} if HAS_VLLM else {"actor_rollout_ref.rollout.name": "hf"}),
}
_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)|\$@")  # $@: the script's own arguments, none here


def _expand(text: str, env: dict[str, str]) -> str:
    """bash-style $name / ${name} expansion (single-quoted spans included: the scripts use none that matter)."""
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), text)


def overrides_of(script: Path, home: str) -> list[str]:
    """The script's overrides, as bash would pass them to python (``$@`` is empty)."""
    env = {"HOME": home}
    text = script.read_text(encoding="utf-8").replace("\\\n", "")  # line continuations
    for line in text.splitlines():
        if line.startswith("python3 -m verl.trainer.main_ppo"):
            args = shlex.split(_expand(line, env))[3:]
            return [a for a in args if a]
        name, _, value = line.partition("=")
        env[name] = shlex.split(_expand(value, env))[0] if value.strip() else ""
    raise AssertionError(f"{script.name}: no python3 -m verl.trainer.main_ppo line")


def swapped(overrides: list[str]) -> list[str]:
    out = []
    for item in overrides:
        key, _, _value = item.partition("=")
        out.append(f"{key}={SWAPS[key]}" if key in SWAPS else item)
    return out


SCRIPTS = sorted(EXAMPLES.glob("*.sh"))


def test_nine_scripts_across_algorithms():
    estimators = {o.partition("=")[2] for s in SCRIPTS for o in overrides_of(s, "/h")
                  if o.startswith("algorithm.adv_estimator=")}
    assert estimators == {"gae", "grpo", "remax", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"}
    flat = [o for s in SCRIPTS for o in overrides_of(s, "/h")]
    assert "actor_rollout_ref.model.lora_rank=64" in flat  # LoRA
    assert "actor_rollout_ref.actor.use_dynamic_bsz=True" in flat  # sequence balancing
    assert len(SCRIPTS) == 9


def test_parsing_follows_bash_quoting_and_variables():
    script = EXAMPLES / "ppo_trainer__run_qwen2-7b_rm_seq_balance.sh"
    ovs = overrides_of(script, "/h")
    assert "data.train_files=['/h/data/gsm8k/train.parquet', '/h/data/math/train.parquet']" in ovs
    assert "data.truncation=error" in ovs and 'trainer.logger=["console","wandb"]' in ovs
    # 'path=...RM-v0.1\' + newline joins with the next line's indentation: two separate words
    assert "reward_model.model.path=sfairXC/FsfairX-LLaMA3-RM-v0.1" in ovs
    assert "reward_model.model.use_remove_padding=True" in ovs


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_verl_example_passes_config_check(script, tmp_path, capsys):
    ovs = swapped(overrides_of(script, str(tmp_path)))
    code = main(["check", *ovs])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "OK: ppo_trainer is valid" in err
    # keys these scripts set that do nothing on this machine are named, e.g. the reward model's param_offload on CPU;
    # its use_remove_padding packs (workers/reward_model.py), so it gets no notice
    if "reward_model.model.fsdp_config.param_offload=True" in ovs:
        assert "Notice: reward_model.model.fsdp_config.param_offload=True has no effect here (no effect on CPU)" in err
    assert "Notice: reward_model.model.use_remove_padding" not in err
