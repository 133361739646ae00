"""What a CPU user changes in a converted verl launch script before running it here (test_from_verl.py,
test_verl09_examples.py): local model and data, CPU worker counts. Nothing else is changed."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from flows.from_verl import CONFIG_OF
from tests.unit.data_fixtures import verl_row, write_parquet

# The swaps a CPU user makes (and why), applied to the loaded YAML document:
CPU_VALUES = {
    "trainer.n_gpus_per_node": "2",                              # 4-16 GPUs -> 2 local workers
    "trainer.nnodes": "1",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",  # TP must divide the 2 workers' world
    "actor_rollout_ref.rollout.name": "hf",                       # vLLM/SGLang are GPU engines (vllm not installed)
    "actor_rollout_ref.rollout.mode": "sync",                     # async is the vLLM/SGLang server mode
}
# Ulysses sequence parallelism splits one sequence over 4-8 GPUs; with 2 CPU workers a user sets it to 1 (any key
# spelling: actor, ref, fsdp_config, critic, SFT engine)
SEQUENCE_PARALLEL = re.compile(r"(?:.*\.)?ulysses_sequence_parallel_size")


def cpu_local(doc: dict, model_dir: str, data_dir: Path, reward_file: str | None = None) -> dict:
    """``doc`` with the model and every data path local, CPU worker counts (:data:`CPU_VALUES`), sequence
    parallelism 1 and, when ``reward_file`` is given, the custom reward function's path set to it (a script that
    finds its reward file in its own checkout of verl, ``$(cd ... && pwd)/verl/utils/...``: the user points it at
    their copy)."""
    doc["model"]["path"] = model_dir
    if reward_file is not None:
        doc["reward"]["path"] = reward_file
    data = doc.setdefault("data", {})  # a script with no main_ppo has no RL data: the user adds it
    data["train_files"], data["val_files"] = [str(data_dir / "train.parquet")], [str(data_dir / "val.parquet")]
    if doc["sft"]["enabled"]:
        doc["sft"]["train_files"], doc["sft"]["val_files"] = [str(data_dir / "sft.parquet")], \
            [str(data_dir / "sft.parquet")]
    for suite in doc.get("evaluation", {}).get("suites", []):
        suite["files"] = [str(data_dir / "val.parquet")]
    for stage in CONFIG_OF:
        overrides = doc.get(stage, {}).get("overrides", [])
        for i, item in enumerate(overrides):
            written = item.split("=", 1)[0]
            key = re.sub(r"^\+*", "", written)
            if key in CPU_VALUES:
                overrides[i] = f"{written}={CPU_VALUES[key]}"
            elif SEQUENCE_PARALLEL.fullmatch(key):
                overrides[i] = f"{written}=1"
    ppo = doc.setdefault("ppo", {}).setdefault("overrides", [])  # a script that never names the engine: verl's vllm
    if not any(re.sub(r"^\+*", "", o.split("=", 1)[0]) == "actor_rollout_ref.rollout.name" for o in ppo):
        ppo.append("actor_rollout_ref.rollout.name=hf")
    return doc


@pytest.fixture(scope="module")
def local_inputs(tmp_path_factory) -> tuple[str, Path]:
    """(model folder, data folder): a folder with a config.json (the dry run resolves the model, never loads it),
    verl-schema RL parquet (train/val) and an SFT parquet in the GSM8K example's layout (extra_info question/answer)."""
    root = tmp_path_factory.mktemp("local")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text('{"model_type": "qwen2"}')
    write_parquet(root / "train.parquet", [verl_row(f"{i} + 1 = ?", str(i + 1), i) for i in range(8)])
    write_parquet(root / "val.parquet", [verl_row(f"{i} + 2 = ?", str(i + 2), i, "test") for i in range(4)])
    write_parquet(root / "sft.parquet", [{"extra_info": {"question": f"{i} + 1 = ?", "answer": f"#### {i + 1}"}}
                                         for i in range(8)])
    return str(root / "model"), root
