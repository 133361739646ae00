"""Helpers for the data-plane tests: verl ``data`` configs and small files in the verl schema."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from config_fixtures import section


def ppo_data_cfg(**overrides: Any):
    """The typed ``data`` section of ppo_trainer.yaml (the YAML's defaults) with ``overrides`` set."""
    return section("ppo_trainer", "data", **overrides)


def sft_data_cfg(**overrides: Any):
    """The typed ``data`` section of sft_trainer.yaml (the YAML's defaults) with ``overrides`` set."""
    return section("sft_trainer", "data", **overrides)


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
