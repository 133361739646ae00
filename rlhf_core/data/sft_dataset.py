"""The SFT dataset (verl's ``SFTDataset`` and ``MultiTurnSFTDataset`` in one class).

Loss-mask alignment (the one verl's SFT trainer uses): ``loss_mask[i] == 1`` iff position ``i`` *predicts* a
response token, i.e. ``input_ids[i + 1]`` is a response token. The trainer computes the loss of
``logits[:, :-1]`` against ``labels = input_ids[:, 1:]`` weighted by ``loss_mask[:, :-1]``. For prompt
``[P1, P2, P3]`` and response ``[R1, R2, EOS]`` (``input_ids = P1 P2 P3 R1 R2 EOS``) the mask is
``0 0 1 1 1 0``: positions of P3, R1, R2 predict R1, R2, EOS; EOS predicts nothing.
"""
from __future__ import annotations

import json
from typing import Any

import torch
from torch.utils.data import Dataset

from rlhf_core.data import DataError
from rlhf_core.data.custom import load_custom_cls
from rlhf_core.data.prompts import encode, pad_ids, pad_token_id, positions_from_mask, render_prompt
from rlhf_core.data.readers import RowSource, read_rows
from rlhf_core.data.rl_dataset import validate_messages

__all__ = ["SFTDataset", "create_sft_dataset", "loss_mask_from_labels"]

SFT_TRUNCATIONS = ("error", "left", "right")



def _lookup(row: dict[str, Any], key: str, nested: list[str], where: RowSource, field: str) -> str:
    """``row[key][nested[0]][nested[1]]...``, which must be a string."""
    if key not in row:
        raise DataError(f"{where}: missing column {key!r} (data.{field}_key)")
    value, path = row[key], key
    for sub in nested:
        if not isinstance(value, dict) or sub not in value:
            raise DataError(f"{where}: field {path!r} has no key {sub!r} (data.{field}_dict_keys)")
        value, path = value[sub], f"{path}.{sub}"
    if not isinstance(value, str):
        raise DataError(f"{where}: field {path!r} must be a string, got {type(value).__name__}")
    return value


def loss_mask_from_labels(is_response: list[int]) -> list[int]:
    """Shift a per-token "is a response token" list to "predicts a response token": ``m[i] = r[i + 1]``, last 0."""
    return list(is_response[1:]) + [0] if is_response else []


class SFTDataset(Dataset):
    """Supervised fine-tuning samples, right-padded to ``max_length``.

    Args:
        parquet_files: path / fsspec URL or list (``.parquet`` or ``.jsonl``).
        tokenizer: a Hugging Face tokenizer with a chat template and an eos token.
        config: the ``data`` section of ``sft_trainer.yaml``: ``prompt_key`` (default ``question``),
            ``response_key`` (``answer``), ``prompt_dict_keys``/``response_dict_keys`` (nested lookups),
            ``multiturn.enable`` / ``multiturn.messages_key`` (``messages``), ``max_length`` (1024),
            ``truncation`` (``error``/``left``/``right``), ``chat_template`` (a Jinja template overriding the
            tokenizer's, optional), ``apply_chat_template_kwargs`` (extra template variables).

    Single-turn: the prompt is ``[{"role": "user", "content": prompt}]`` rendered with
    ``add_generation_prompt=True``; the response is ``response + eos_token``; both tokenized without extra
    special tokens. Multi-turn: each assistant message's tokens (content and its end-of-turn token, not the
    ``<|im_start|>assistant`` header) are response tokens; the rendering must be prefix-consistent, unless
    ``ignore_input_ids_mismatch`` (verl 0.9): then a message where the rendering stops extending the previous
    one (a template that re-renders earlier turns, e.g. drops their ``<think>`` part once they are not last) is
    rendered on its own, less the template's preamble, and the sample is the concatenation of the turns as each
    was rendered (a sequence no single rendering of the whole conversation gives). A row's
    ``multiturn.tools_key`` column (a list of tool schemas, or its JSON text) goes to the template as
    ``tools=``; its ``multiturn.enable_thinking_key`` column (else ``enable_thinking_default`` unless that is
    ``none``/null) as ``enable_thinking=``.

    Item: ``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``, each ``(max_length,)`` int64,
    right-padded (pad id, mask 0, loss 0); alignment as in the module docstring.

    Raises:
        DataError: at construction, a missing column / nested key, a non-string prompt or response, a bad
            message list (naming file, row, field); at ``__getitem__``, a sample longer than ``max_length``
            with ``truncation="error"`` or a sample with no response token left (all labels masked).
        ValueError: unknown ``truncation``.
    """

    def __init__(self, parquet_files: str | list[str], tokenizer: Any, config: Any, max_samples: int = -1) -> None:
        self.tokenizer = tokenizer
        self.prompt_key = config.prompt_key
        self.response_key = config.response_key
        # null = the column holds the string itself (no nested keys)
        self.prompt_dict_keys = [] if config.prompt_dict_keys is None else list(config.prompt_dict_keys)
        self.response_dict_keys = [] if config.response_dict_keys is None else list(config.response_dict_keys)
        self.multiturn = bool(config.multiturn.enable)
        self.messages_key = config.multiturn.messages_key
        self.tools_key = config.multiturn.tools_key
        self.enable_thinking_key = config.multiturn.enable_thinking_key
        default = config.enable_thinking_default
        self.enable_thinking_default = None if default is None or str(default).lower() == "none" else bool(default)
        self.ignore_mismatch = bool(config.ignore_input_ids_mismatch)
        self.max_length = int(config.max_length)
        self.truncation = config.truncation
        if self.truncation not in SFT_TRUNCATIONS:
            raise ValueError(f"data.truncation must be one of {SFT_TRUNCATIONS}, got {self.truncation!r}")
        self.chat_template = config.chat_template
        # extra variables for the chat template (verl: apply_chat_template(..., **apply_chat_template_kwargs))
        self.apply_chat_template_kwargs = dict(config.apply_chat_template_kwargs)
        self.pad_id = pad_token_id(tokenizer)
        if not self.multiturn and getattr(tokenizer, "eos_token", None) is None:
            raise ValueError("SFT needs a tokenizer with an eos token (appended to every response)")
        rows, self.sources = read_rows(parquet_files)
        if 0 < max_samples < len(rows):  # verl 0.9's train/val_max_samples: the first N rows (its shuffle is off)
            rows, self.sources = rows[:max_samples], self.sources[:max_samples]
        self.samples: list[Any] = [self._parse(row, src) for row, src in zip(rows, self.sources)]

    def _parse(self, row: dict[str, Any], src: RowSource) -> Any:
        if self.multiturn:
            if self.messages_key not in row:
                raise DataError(f"{src}: missing column {self.messages_key!r} (data.multiturn.messages_key)")
            messages = row[self.messages_key]
            validate_messages(messages, str(src), self.messages_key)
            if not any(m["role"] == "assistant" for m in messages):
                raise DataError(f"{src}: field {self.messages_key!r} has no assistant message to train on")
            return list(messages), self._row_template_kwargs(row, src)
        prompt = _lookup(row, self.prompt_key, self.prompt_dict_keys, src, "prompt")
        response = _lookup(row, self.response_key, self.response_dict_keys, src, "response")
        return prompt, response

    def _row_template_kwargs(self, row: dict[str, Any], src: RowSource) -> dict[str, Any]:
        """The chat-template arguments of one multi-turn row: ``apply_chat_template_kwargs`` plus its ``tools``
        and ``enable_thinking`` (see the class docstring)."""
        kwargs = dict(self.apply_chat_template_kwargs)
        tools = row.get(self.tools_key)
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError as exc:
                raise DataError(f"{src}: field {self.tools_key!r} is not JSON ({exc})") from exc
        if tools is not None:
            if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                raise DataError(f"{src}: field {self.tools_key!r} must be a list of tool schemas (dicts), got "
                                f"{type(tools).__name__}")
            kwargs["tools"] = tools
        thinking = row.get(self.enable_thinking_key, self.enable_thinking_default)
        if thinking is not None:
            kwargs["enable_thinking"] = bool(thinking)
        return kwargs

    def __len__(self) -> int:
        return len(self.samples)

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool,
                template_kwargs: dict[str, Any] | None = None) -> str:
        template_kwargs = self.apply_chat_template_kwargs if template_kwargs is None else template_kwargs
        if generation_prompt:
            return render_prompt(self.tokenizer, messages, self.chat_template, template_kwargs)
        kwargs = dict(template_kwargs)
        if self.chat_template:
            kwargs["chat_template"] = self.chat_template
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False, **kwargs)

    def _segments(self, sample: Any, where: str) -> list[tuple[str, int]]:
        """``[(text, is_response)]`` whose concatenation is the whole rendered sample."""
        if not self.multiturn:
            prompt, response = sample
            prompt_text = self._render([{"role": "user", "content": prompt}], generation_prompt=True)
            return [(prompt_text, 0), (response + self.tokenizer.eos_token, 1)]
        messages, kwargs = sample
        segments: list[tuple[str, int]] = []
        done = ""
        for i, msg in enumerate(messages):
            full = self._render(messages[: i + 1], False, kwargs)
            head = self._render(messages[:i], True, kwargs) if msg["role"] == "assistant" else full
            if head.startswith(done) and full.startswith(head):
                segments.append((head[len(done):], 0))
                if msg["role"] == "assistant":
                    segments.append((full[len(head):], 1))
            elif self.ignore_mismatch:
                segments += self._alone(msg, kwargs, where, i)
            else:
                raise DataError(f"{where}: the chat template is not prefix-consistent at message {i}; cannot locate "
                                "the assistant tokens (data.ignore_input_ids_mismatch=True renders such a message "
                                "on its own)")
            done = full
        return [(t, r) for t, r in segments if t]

    def _alone(self, msg: dict[str, Any], kwargs: dict[str, Any], where: str, i: int) -> list[tuple[str, int]]:
        """Segments of message ``i`` rendered on its own, less the template's preamble (system prompt, tools):
        ``ignore_input_ids_mismatch``'s fallback, as verl 0.9 tokenizes turn by turn.

        The preamble is found with a stand-in message ``x`` of the same role: ``render([x, x])`` is
        ``render([x])`` plus ``x``'s own text, so the preamble is ``render([x])`` less that text; an assistant
        message's header is what ``add_generation_prompt`` adds after a stand-in user message."""
        stand_in = {"role": msg["role"], "content": "x"}
        one = self._render([stand_in], False, kwargs)
        two = self._render([stand_in, stand_in], False, kwargs)
        alone = self._render([msg], False, kwargs)
        own = two[len(one):]
        preamble = one[: len(one) - len(own)]
        if not two.startswith(one) or not one.endswith(own) or not alone.startswith(preamble):
            raise DataError(f"{where}: message {i} rendered on its own does not follow the template's preamble; "
                            "cannot locate its tokens")
        piece = alone[len(preamble):]
        if msg["role"] != "assistant":
            return [(piece, 0)]
        user = [{"role": "user", "content": "x"}]
        header = self._render(user, True, kwargs)[len(self._render(user, False, kwargs)):]
        if not piece.startswith(header):
            raise DataError(f"{where}: assistant message {i} rendered on its own does not start with the "
                            f"generation prompt {header!r}; cannot locate its tokens")
        return [(header, 0), (piece[len(header):], 1)]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        where = str(self.sources[i])
        ids: list[int] = []
        is_response: list[int] = []
        for text, resp in self._segments(self.samples[i], where):
            seg = encode(self.tokenizer, text)
            ids += seg
            is_response += [resp] * len(seg)
        if len(ids) > self.max_length:
            if self.truncation == "error":
                raise DataError(f"{where}: sample has {len(ids)} tokens, more than data.max_length="
                                f"{self.max_length} (raise it or set data.truncation to left/right)")
            cut = slice(-self.max_length, None) if self.truncation == "left" else slice(0, self.max_length)
            ids, is_response = ids[cut], is_response[cut]
        loss = loss_mask_from_labels(is_response)
        if not any(loss):
            raise DataError(f"{where}: no response token left to train on (all labels masked; "
                            f"max_length={self.max_length}, truncation={self.truncation!r})")
        input_ids, attention_mask = pad_ids(ids, self.max_length, self.pad_id, left=False)
        loss_mask = torch.zeros(self.max_length, dtype=torch.int64)
        loss_mask[: len(loss)] = torch.tensor(loss, dtype=torch.int64)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": positions_from_mask(attention_mask),
            "loss_mask": loss_mask,
        }


def create_sft_dataset(data_files: str | list[str], tokenizer: Any, config: Any, max_samples: int = -1) -> Dataset:
    """``config.custom_cls`` when set (called as ``cls(parquet_files=..., tokenizer=..., config=...)``, plus
    ``max_samples=`` when it is not -1), else :class:`SFTDataset` (``max_samples`` > 0: its first rows only)."""
    cls = load_custom_cls(config.custom_cls) or SFTDataset
    extra = {} if max_samples == -1 else {"max_samples": int(max_samples)}
    return cls(parquet_files=data_files, tokenizer=tokenizer, config=config, **extra)
