"""Helpers for the data-plane tests: verl ``data`` configs and small files in the verl schema."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import OmegaConf

# The ``data`` section of ppo_trainer.yaml with verl's defaults (config-reference.zh.txt).
PPO_DATA_DEFAULTS: dict[str, Any] = {
    "tokenizer": None, "train_files": None, "val_files": None, "train_max_samples": -1, "val_max_samples": -1,
    "prompt_key": "prompt", "max_prompt_length": 512, "max_response_length": 512, "train_batch_size": 1024,
    "return_raw_input_ids": False, "return_raw_chat": False, "return_full_prompt": False, "shuffle": True,
    "seed": 42, "filter_overlong_prompts": False, "filter_overlong_prompts_workers": 1, "truncation": "error",
    "image_key": "images", "trust_remote_code": True, "custom_cls": {"path": None, "name": None},
    "dataloader_num_workers": 0, "validation_shuffle": False, "sampler": {"class_path": None, "class_name": None},
    "datagen": {"path": None, "name": None}, "apply_chat_template_kwargs": {},
}

# The ``data`` section of verl's sft_trainer.yaml (the keys the dataset reads).
SFT_DATA_DEFAULTS: dict[str, Any] = {
    "train_batch_size": 256, "micro_batch_size_per_gpu": 4, "train_files": None, "val_files": None,
    "prompt_key": "question", "response_key": "answer", "prompt_dict_keys": None, "response_dict_keys": None,
    "multiturn": {"enable": False, "messages_key": "messages"}, "max_length": 1024, "truncation": "error",
    "balance_dp_token": False, "chat_template": None, "custom_cls": {"path": None, "name": None},
    "apply_chat_template_kwargs": {},
}


def ppo_data_cfg(**overrides: Any):
    return OmegaConf.create({**PPO_DATA_DEFAULTS, **overrides})


def sft_data_cfg(**overrides: Any):
    return OmegaConf.create({**SFT_DATA_DEFAULTS, **overrides})


def verl_row(question: str, answer: str = "42", index: int = 0, split: str = "train") -> dict[str, Any]:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index},
    }


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
