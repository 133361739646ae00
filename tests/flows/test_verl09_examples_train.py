"""Four of verl 0.9's own launch scripts (GRPO with LoRA, RLOO, CISPO, the prefix grouper) train a few steps here
(tests/data/verl09_examples/, README there).

Each script's verl command is read as a shell would (``DEVICE=gpu``), the CPU user's swaps of
``tests/flows/test_verl09_examples.py::cpu_args`` are applied (local tiny model and GSM8K rows, CPU worker counts, HF
rollout), and then the sizes of a smoke run replace the script's production sizes (:data:`SMOKE`: 2 prompts x 2
samples, 8 response tokens, 2 steps, one worker, no validation; :data:`SCRIPT_SMOKE`: a script's own batching at
smoke size). Everything else the script sets, its algorithm above all (estimator, policy loss, LoRA, dynamic
sampling, rollout correction, the prefix-grouped forward), is trained as written.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from flows.verl_script import read_script
from rlhf_core.trainer.tracking import read_metrics_jsonl
from tests.flows.test_verl09_examples import EXAMPLES, PRESET, cpu_args

pytestmark = pytest.mark.ray  # starts Ray: calls run_ppo


# the untrained tiny model never answers correctly; a reward from the text's length makes a group's samples differ
LENGTH_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return (len(solution_str) % 5) / 4.0
"""


@pytest.fixture(scope="module")
def gsm8k_parquet(tmp_path_factory, gsm8k_dir) -> tuple[Path, Path]:
    """8 train and 2 test rows of the real GSM8K, in verl's parquet layout."""
    import pandas as pd

    from rlhf_core.data.gsm8k import preprocess_gsm8k

    out = tmp_path_factory.mktemp("gsm8k_parquet")
    files = preprocess_gsm8k(str(gsm8k_dir), str(out / "full"))
    pd.read_parquet(files["train"]).head(8).to_parquet(out / "train.parquet")
    pd.read_parquet(files["test"]).head(2).to_parquet(out / "test.parquet")
    return out / "train.parquet", out / "test.parquet"

# key -> smoke-run value; a key the script does not set is added (the runs' sizes must not depend on defaults)
SMOKE = {
    "data.train_batch_size": "2", "data.max_prompt_length": "64", "data.max_response_length": "8",
    "data.filter_overlong_prompts": "False", "data.truncation": "left", "data.dataloader_num_workers": "0",
    "actor_rollout_ref.rollout.n": "2", "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2", "actor_rollout_ref.actor.use_dynamic_bsz": "False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "4",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "False",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "4",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": "False",
    "actor_rollout_ref.rollout.dtype": "float32", "actor_rollout_ref.model.enable_gradient_checkpointing": "False",
    "actor_rollout_ref.actor.use_torch_compile": "False",
    "trainer.n_gpus_per_node": "1", "trainer.device": "cpu", "trainer.total_training_steps": "2",
    "trainer.total_epochs": "1", "trainer.test_freq": "-1", "trainer.val_before_train": "False",
    "trainer.save_freq": "-1", "trainer.logger": "[console,file]", "ray_init.num_cpus": "2",
}
RUNS = ("tuning_lora__run_qwen3_8b_fsdp.sh", "rloo_trainer__run_qwen3_8b_fsdp.sh",
        "cispo_trainer__run_qwen3_8b_fsdp.sh", "prefix_grouper__run_qwen3_8b_fsdp.sh")
# a script whose point is its batching keeps it, at smoke size: the prefix-grouper example's dynamic bsz on all three
# passes, budgets of 150 tokens (GSM8K prompts cut to 64 tokens + 8: two rows, one group, per micro-batch; checked
# once by hand: the ref and update passes ran the grouped forward on (2, 72) micro-batches of one uid each)
SCRIPT_SMOKE = {"prefix_grouper__run_qwen3_8b_fsdp.sh": {
    "actor_rollout_ref.actor.use_dynamic_bsz": "True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "150",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "150",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": "True",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "150"}}


def smoke_args(args: list[str], out: Path, script: str = "") -> list[str]:
    """``args`` with :data:`SMOKE`'s values and the script's :data:`SCRIPT_SMOKE` (set or added) and the run's
    folders under ``out``."""
    sizes = dict(SMOKE, **SCRIPT_SMOKE.get(script, {}),
                 **{"trainer.default_local_dir": str(out), "trainer.validation_data_dir": str(out / "val"),
                    "trainer.project_name": "t", "trainer.experiment_name": "e"})
    kept = [a for a in args if re.sub(r"^\+*", "", a.split("=", 1)[0]) not in sizes]
    return kept + [f"{k}={v}" for k, v in sizes.items()]


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(RUNS))
def test_a_verl_09_script_trains_two_steps_on_cpu(script, tiny_model_dir, gsm8k_parquet, tmp_path, monkeypatch):
    from rlhf_core.config import load_config
    from rlhf_core.trainer.main_ppo import run_ppo

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    train, test = gsm8k_parquet
    reward = tmp_path / "length_reward.py"
    reward.write_text(LENGTH_REWARD)
    [cmd] = read_script((EXAMPLES / script).read_text(), script, PRESET).commands
    args = cpu_args(cmd.args, "ppo", str(tiny_model_dir), Path(train).parent, str(reward))
    args = [a.replace("val.parquet", Path(test).name) for a in args]
    args += [f"custom_reward_function.path={reward}"] if not any("custom_reward_function.path" in a
                                                                 for a in args) else []
    out = tmp_path / "run"
    cfg = load_config("ppo_trainer", smoke_args(args, out, script))
    for key, value in SCRIPT_SMOKE.get(script, {}).items():  # trained as the script sets it, at smoke size
        assert str(OmegaConf.select(cfg, key)) == value, key
    assert run_ppo(cfg)["global_step"] == 2
    m = read_metrics_jsonl(str(out / "metrics.jsonl"))
    for step in (1, 2):
        assert "actor/pg_loss" in m[step] and all(torch.isfinite(torch.tensor(v)) for v in m[step].values())
