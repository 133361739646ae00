"""The RL prompt dataset (verl's ``RLHFDataset``) and its ``collate_fn``.

Reads verl-schema parquet or jsonl files (local or any fsspec URL), validates every row at construction,
optionally subsamples (``max_samples``) and drops overlong prompts (``filter_overlong_prompts``), and yields
left-padded prompt tensors plus the row's other columns.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rlhf_core.data import DataError
from rlhf_core.data.prompts import (
    TRUNCATIONS,
    encode,
    keep_short_prompts,
    prompt_lengths,
    pad_ids,
    pad_token_id,
    positions_from_mask,
    render_prompt,
    truncate_ids,
)
from rlhf_core.data.readers import RowSource, read_rows
from rlhf_core.protocol import Batch
from rlhf_core.tools.function_tool import load_all_tools

__all__ = ["RLHFDataset", "collate_fn", "render_prompt", "validate_messages"]

_OPTIONAL_TYPES: dict[str, tuple[type, ...]] = {
    "data_source": (str,),
    "ability": (str,),
    "reward_model": (dict,),
    "extra_info": (dict,),
}



def validate_messages(messages: Any, where: str, field: str = "prompt", allow_list_content: bool = False) -> None:
    """Check a chat message list: a non-empty list of ``{"role": str, "content": str}`` dicts.

    Raises:
        DataError: naming ``where`` (file and row), the field and the message index.
    """
    if isinstance(messages, np.ndarray):
        messages = messages.tolist()
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: field {field!r} must be a non-empty list of chat messages, "
                        f"got {type(messages).__name__}")
    for j, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise DataError(f"{where}: field {field!r}[{j}] must be a dict with role and content, "
                            f"got {type(msg).__name__}")
        for key in ("role", "content"):
            if key not in msg or msg[key] is None:
                raise DataError(f"{where}: field {field!r}[{j}] has no {key!r}")
        if not isinstance(msg["role"], str):
            raise DataError(f"{where}: field {field!r}[{j}].role must be a string")
        ok = (str, list) if allow_list_content else (str,)
        if not isinstance(msg["content"], ok):
            raise DataError(f"{where}: field {field!r}[{j}].content must be a string, "
                            f"got {type(msg['content']).__name__}")


def check_same_fields(rows: list[dict[str, Any]], sources: list[Any]) -> None:
    """Every row must have the fields of the first one (jsonl rows may differ; parquet rows never do).

    A row without ``data_source`` or ``extra_info`` would otherwise load and fail only when a batch holding it is
    collated, mid-training, naming its place in the batch instead of its line (verl reads jsonl through
    ``datasets``, which fills the gap with null and fails later in the reward or the index lookup).

    Raises:
        DataError: naming the file and row/line, the field it lacks or adds, and the row it was compared with.
    """
    if not rows:
        return
    first = set(rows[0])
    for row, src in zip(rows, sources):
        if set(row) == first:
            continue
        missing, extra = sorted(first - set(row)), sorted(set(row) - first)
        what = f"has no field {missing[0]!r}" if missing else f"has a field {extra[0]!r}"
        raise DataError(f"{src}: the row {what}, unlike {sources[0]} (fields {sorted(first)}): every row "
                        "needs the same fields")


class RLHFDataset(Dataset):
    """Prompts for RL rollouts, one item per row.

    Args:
        data_files: one path / fsspec URL or a list; ``.parquet`` or ``.jsonl``; remote files are cached
            locally by :func:`rlhf_core.data.fs.copy_to_local`.
        tokenizer: a Hugging Face tokenizer with a chat template.
        config: the ``data`` section of ``ppo_trainer.yaml`` (DictConfig or dict). Read keys: ``prompt_key``,
            ``max_prompt_length``, ``truncation``, ``return_raw_input_ids``, ``return_raw_chat``,
            ``return_full_prompt``, ``shuffle``, ``seed``, ``filter_overlong_prompts``,
            ``filter_overlong_prompts_workers``, ``apply_chat_template_kwargs``, ``tool_config_path`` and
            ``function_tool_path`` (the overlong filter measures prompts with these tools in the template,
            as verl 0.9.1; the items themselves are rendered without them, as there). (``custom_cls`` and ``datagen``
            are honoured by :func:`rlhf_core.data.factory.create_rl_dataset`; ``image_key``/``processor``
            (multimodal) are accepted but images are not processed.)
        processor: multimodal processor; unused (kept for verl's signature).
        max_samples: ``train_max_samples`` / ``val_max_samples``; > 0 keeps a seeded random subset of that
            size when ``config.shuffle``, else the first N rows. Applied before the overlong filter, as verl.

    Item ``i`` (a dict):
        ``input_ids``, ``attention_mask``, ``position_ids``: ``(P,)`` int64, ``P = max_prompt_length``,
        left-padded with the pad id (mask 0 on pads, positions ``clamp(cumsum(mask) - 1, 0)``);
        ``raw_prompt_ids``: ``list[int]`` the same ids unpadded (what the rollout engine gets);
        every other column of the row (``data_source``, ``reward_model``, ``extra_info``, ``ability``, ...);
        ``index``: ``extra_info["index"]`` or the row number; ``raw_prompt`` (message list) when
        ``return_raw_chat``; ``full_prompts`` (the rendered string, untruncated) when ``return_full_prompt``;
        ``raw_input_ids`` (ids of the message contents joined by newlines, no template, truncated like the
        prompt) when ``return_raw_input_ids``.

    Attributes:
        rows, sources, row_numbers: the kept rows, where each came from (file + row/line), and each one's
            position in the concatenation of all files before subsampling and filtering.

    Raises:
        DataError: missing prompt column, wrongly typed column, empty or corrupt file, bad message list,
            non-UTF-8 jsonl line, a row whose fields differ from the first row's — naming the file, row and field;
            on ``__getitem__`` with ``truncation="error"``, a prompt longer than ``max_prompt_length`` (naming the
            row).
        ValueError: unknown ``truncation``.
    """

    def __init__(self, data_files: str | list[str], tokenizer: Any, config: Any, processor: Any = None,
                 max_samples: int = -1) -> None:
        self.tokenizer = tokenizer
        self.processor = processor
        self.config = config
        self.prompt_key = config.prompt_key
        self.max_prompt_length = int(config.max_prompt_length)
        self.truncation = config.truncation
        if self.truncation not in TRUNCATIONS:
            raise ValueError(f"data.truncation must be one of {TRUNCATIONS}, got {self.truncation!r}")
        self.return_raw_chat = bool(config.return_raw_chat)
        self.return_full_prompt = bool(config.return_full_prompt)
        self.return_raw_input_ids = bool(config.return_raw_input_ids)
        self.shuffle = bool(config.shuffle)
        self.seed = config.seed
        # extra variables for the chat template (verl: apply_chat_template(..., **apply_chat_template_kwargs))
        self.apply_chat_template_kwargs = dict(config.apply_chat_template_kwargs)
        self.pad_id = pad_token_id(tokenizer)
        self.data_files = [data_files] if isinstance(data_files, str) else list(data_files)

        rows, sources = read_rows(self.data_files)
        for row, src in zip(rows, sources):
            self._validate_row(row, src)
        check_same_fields(rows, sources)
        positions = np.arange(len(rows))
        if max_samples is not None and 0 < max_samples < len(rows):
            positions = self._subsample(len(rows), int(max_samples))
        # verl 0.9.1 (RLHFDataset): the overlong filter renders the rollout's tool schemas into the template
        self.tool_paths = (config.tool_config_path, config.function_tool_path)
        if config.filter_overlong_prompts:
            workers = int(config.filter_overlong_prompts_workers)
            kept = keep_short_prompts(tokenizer, [rows[p][self.prompt_key] for p in positions],
                                      self.max_prompt_length, workers, self._filter_template_kwargs())
            positions = positions[kept]
        elif self.truncation == "error":
            self._check_lengths(tokenizer, rows, sources, positions, int(config.filter_overlong_prompts_workers))
        self.rows = [rows[p] for p in positions]
        self.sources = [sources[p] for p in positions]
        self.row_numbers = [int(p) for p in positions]

    def _filter_template_kwargs(self) -> dict[str, Any]:
        """``apply_chat_template_kwargs`` plus ``tools``: the schemas of ``data.tool_config_path`` and
        ``data.function_tool_path`` (by default the rollout's ``multi_turn`` keys) as the agent loop renders them
        (``model_dump(exclude_none=True)``), so the filter measures the prompt the rollout will see (verl 0.9.1's
        ``RLHFDataset.maybe_filter_out_long_prompts``). Raises ToolConfigError naming a bad tool file."""
        tools = load_all_tools(*self.tool_paths)
        if not tools:
            return self.apply_chat_template_kwargs
        schemas = [t.get_openai_tool_schema().model_dump(exclude_none=True) for t in tools.values()]
        return {**self.apply_chat_template_kwargs, "tools": schemas}

    def _check_lengths(self, tokenizer, rows, sources, positions, workers: int) -> None:
        """``truncation: error``: fail at construction — before any model is loaded — naming the first row whose
        rendered prompt is longer than ``max_prompt_length`` (verl only finds it when the row is fetched)."""
        lengths = prompt_lengths(tokenizer, [rows[p][self.prompt_key] for p in positions], workers,
                                 self.apply_chat_template_kwargs)
        for p, n in zip(positions, lengths):
            if n > self.max_prompt_length:
                raise DataError(
                    f"{sources[p]}: prompt has {n} tokens > data.max_prompt_length={self.max_prompt_length} "
                    "with data.truncation=error (raise max_prompt_length, set data.truncation to left/right/middle, "
                    "or filter_overlong_prompts=True)")

    def _subsample(self, total: int, n: int) -> np.ndarray:
        if self.shuffle:
            rng = np.random.default_rng(self.seed)
            return rng.choice(total, size=n, replace=False)
        return np.arange(n)

    def _validate_row(self, row: dict[str, Any], src: RowSource) -> None:
        if self.prompt_key not in row:
            raise DataError(f"{src}: missing column {self.prompt_key!r} (data.prompt_key); "
                            f"the row has {sorted(row)}")
        if isinstance(row[self.prompt_key], np.ndarray):
            row[self.prompt_key] = row[self.prompt_key].tolist()
        validate_messages(row[self.prompt_key], str(src), self.prompt_key,
                          allow_list_content=self.processor is not None)
        for key, types in _OPTIONAL_TYPES.items():
            value = row.get(key)
            if value is not None and not isinstance(value, types):
                raise DataError(f"{src}: field {key!r} must be {types[0].__name__}, got {type(value).__name__}")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        messages = row[self.prompt_key]
        where = str(self.sources[i])
        text = render_prompt(self.tokenizer, messages, template_kwargs=self.apply_chat_template_kwargs)
        ids = truncate_ids(encode(self.tokenizer, text), self.max_prompt_length, self.truncation, where)
        input_ids, attention_mask = pad_ids(ids, self.max_prompt_length, self.pad_id, left=True)
        item: dict[str, Any] = {k: v for k, v in row.items() if k != self.prompt_key}
        item.update(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=positions_from_mask(attention_mask), raw_prompt_ids=ids)
        extra = row.get("extra_info") or {}
        item["index"] = extra["index"] if extra.get("index") is not None else self.row_numbers[i]
        if self.return_raw_chat:
            item["raw_prompt"] = messages
        if self.return_full_prompt:
            item["full_prompts"] = text
        if self.return_raw_input_ids:
            plain = "\n".join(m["content"] for m in messages if isinstance(m["content"], str))
            item["raw_input_ids"] = truncate_ids(encode(self.tokenizer, plain), self.max_prompt_length,
                                                 "right" if self.truncation == "error" else self.truncation)
        return item


def collate_fn(items: list[dict[str, Any]]) -> Batch:
    """Stack dataset items into a :class:`Batch` (verl's ``collate_fn``).

    Tensor values (all the same shape per key) are stacked to ``(B, ...)``; every other value becomes a
    ``(B,)`` object array (dicts and lists kept whole).

    Raises:
        ValueError: items with different keys.
    """
    if not items:
        return Batch()
    keys = list(items[0])
    for j, item in enumerate(items[1:], start=1):
        if set(item) != set(keys):
            raise ValueError(f"collate_fn: item {j} has keys {sorted(item)}, item 0 has {sorted(keys)}")
    tensors = {k: torch.stack([it[k] for it in items]) for k in keys if isinstance(items[0][k], torch.Tensor)}
    non_tensors = {k: [it[k] for it in items] for k in keys if k not in tensors}
    return Batch(tensors=tensors, non_tensors=non_tensors)
