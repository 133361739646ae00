"""Prompt rendering, truncation, padding and the overlong-prompt filter shared by the RL and SFT datasets."""
from __future__ import annotations

import multiprocessing as mp
from typing import Any, Sequence

import torch

from rlhf_core.data import DataError
from rlhf_core.progress import progress

TRUNCATIONS = ("error", "left", "right", "middle")


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], chat_template: str | None = None,
                  template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt exactly as the rollout engine sees it (verl: ``apply_chat_template(..., tokenize=False)``).

    ``tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)``;
    ``template_kwargs`` is ``data.apply_chat_template_kwargs`` (e.g. ``{enable_thinking: false}``: extra variables
    the template sees). The same string is used by the dataset, the overlong filter and ``full_prompts``.
    """
    kwargs = dict(template_kwargs or {})
    if chat_template:
        kwargs["chat_template"] = chat_template
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without extra special tokens (the template already holds them)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def truncate_ids(ids: Sequence[int], max_length: int, truncation: str, where: str = "") -> list[int]:
    """Cut ``ids`` to at most ``max_length`` tokens (verl's ``truncation`` semantics).

    ``left`` keeps the last ``L``; ``right`` keeps the first ``L``; ``middle`` keeps the first ``L // 2`` and
    the last ``L - L // 2`` (ids 0..9, L=5 → 0,1,7,8,9); ``error`` raises.

    Raises:
        DataError: ``truncation == "error"`` and the ids are too long (names ``where``).
        ValueError: an unknown ``truncation``.
    """
    ids = list(ids)
    if truncation not in TRUNCATIONS:
        raise ValueError(f"data.truncation must be one of {TRUNCATIONS}, got {truncation!r}")
    if len(ids) <= max_length:
        return ids
    if truncation == "error":
        raise DataError(
            f"{where}: prompt has {len(ids)} tokens, more than max_prompt_length={max_length} "
            "(raise max_prompt_length, set data.truncation to left/right/middle, or filter_overlong_prompts=True)"
        )
    if truncation == "left":
        return ids[-max_length:]
    if truncation == "right":
        return ids[:max_length]
    head = max_length // 2
    tail = max_length - head
    return ids[:head] + (ids[-tail:] if tail else [])


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``clamp(cumsum(mask) - 1, min=0)`` along the last dim; int64, same shape as the mask."""
    return torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0).to(torch.int64)


def pad_ids(ids: Sequence[int], length: int, pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``, each ``(length,)`` int64, padded on the left or right with ``pad_id``."""
    n = len(ids)
    if n > length:
        raise ValueError(f"cannot pad {n} ids to length {length}")
    pad = [pad_id] * (length - n)
    ids_t = torch.tensor((pad + list(ids)) if left else (list(ids) + pad), dtype=torch.int64)
    ones, zeros = [1] * n, [0] * (length - n)
    mask = torch.tensor((zeros + ones) if left else (ones + zeros), dtype=torch.int64)
    return ids_t, mask


def pad_token_id(tokenizer: Any) -> int:
    """``pad_token_id``, or ``eos_token_id`` when the tokenizer has no pad token (verl's ``hf_tokenizer``)."""
    for value in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if value is not None:
            return int(value)
    raise ValueError("the tokenizer has neither a pad token nor an eos token")


# ---- overlong filter ---------------------------------------------------------------------------------
# Worker state. With "fork" the children inherit the tokenizer and the prompts, so only (start, stop)
# ranges and the resulting lengths cross the process boundary; with "spawn" both are sent once per worker.
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: Any, prompts: list[list[dict[str, Any]]] | None,
                 template_kwargs: dict[str, Any] | None = None) -> None:
    _WORKER["tokenizer"] = tokenizer
    _WORKER["template_kwargs"] = template_kwargs
    if prompts is not None:
        _WORKER["prompts"] = prompts


def _lengths(span: tuple[int, int]) -> list[int]:
    tok, prompts, kwargs = _WORKER["tokenizer"], _WORKER["prompts"], _WORKER["template_kwargs"]
    return [len(encode(tok, render_prompt(tok, m, template_kwargs=kwargs))) for m in prompts[span[0]:span[1]]]


def prompt_lengths(tokenizer: Any, prompts: list[list[dict[str, Any]]], workers: int = 1,
                   template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Rendered-prompt token counts (``len(encode(render_prompt(m, template_kwargs=...)))``), in ``workers``
    processes when > 1.

    Processes come from a ``multiprocessing`` Pool ("fork" where available, as HF ``datasets.filter(num_proc)``
    in verl). The prompts are split into contiguous spans and the results re-joined in order, so the
    result is identical for any ``workers``.
    """
    if workers <= 1 or len(prompts) < 2:
        _init_worker(tokenizer, prompts, template_kwargs)
        try:
            spans = progress([(i, i + 1) for i in range(len(prompts))], "measuring prompt lengths", unit="prompt")
            return [n for span in spans for n in _lengths(span)]
        finally:
            _WORKER.clear()
    workers = min(workers, len(prompts))
    size = -(-len(prompts) // (workers * 4))
    spans = [(i, min(i + size, len(prompts))) for i in range(0, len(prompts), size)]
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    if method == "fork":
        _init_worker(tokenizer, prompts, template_kwargs)  # inherited by the children; nothing pickled
        initargs: tuple[Any, ...] = (tokenizer, None, template_kwargs)
    else:
        initargs = (tokenizer, prompts, template_kwargs)
    try:
        with mp.get_context(method).Pool(workers, initializer=_init_worker, initargs=initargs) as pool:
            parts = list(progress(pool.imap(_lengths, spans), "measuring prompt lengths", total=len(spans),
                                  unit="chunk"))
    finally:
        _WORKER.clear()
    return [n for part in parts for n in part]


def keep_short_prompts(
    tokenizer: Any, prompts: list[list[dict[str, Any]]], max_prompt_length: int, workers: int = 1,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Indices of prompts whose rendered length is ``<= max_prompt_length`` (exactly L is kept)."""
    lengths = prompt_lengths(tokenizer, prompts, workers, template_kwargs)
    return [i for i, n in enumerate(lengths) if n <= max_prompt_length]
