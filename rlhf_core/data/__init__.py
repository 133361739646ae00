"""Data plane: remote-file cache, GSM8K preprocessing, RL and SFT datasets, resumable dataloader.

Everything here reads the verl parquet schema (``data_source``, ``prompt`` as a chat message list,
``ability``, ``reward_model{style, ground_truth}``, ``extra_info{split, index, ...}``) so a
verl-prepared parquet loads unchanged. Bad input raises :class:`DataError`, naming the file, the row
and the field, when the dataset is built (before any training starts).

Modules: ``fs`` (copy_to_local) · ``readers`` (parquet/jsonl rows) · ``gsm8k`` (preprocess_gsm8k) ·
``prompts`` (render_prompt, truncation, padding, overlong filter) · ``rl_dataset`` (RLHFDataset, collate_fn) ·
``datagen`` (DynamicGenDataset) · ``factory`` (create_rl_dataset) ·
``sft_dataset`` (SFTDataset) · ``loader`` (build_dataloader) · ``custom`` (custom_cls) · ``cli`` (rlhf data).
The main names are importable from here too (lazily, so ``import rlhf_core.data`` stays light).
"""
from __future__ import annotations

import importlib
from typing import Any


class DataError(ValueError):
    """Malformed input data; the message names the file, the row (or line) and the field."""


class RemoteUnavailableError(ConnectionError):
    """A remote source (the Hugging Face hub, an fsspec URL) could not be reached; the message says how to use
    local files instead. A ``ConnectionError``, but an input error: the ``rlhf`` commands print it as one line and
    the pipeline does not retry it (``tasks.plan.is_retriable``)."""


_LAZY = {
    "copy_to_local": "fs",
    "preprocess_gsm8k": "gsm8k",
    "render_prompt": "prompts",
    "RLHFDataset": "rl_dataset",
    "collate_fn": "rl_dataset",
    "create_rl_dataset": "factory",
    "SFTDataset": "sft_dataset",
    "create_sft_dataset": "sft_dataset",
    "build_dataloader": "loader",
}

__all__ = ["DataError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
