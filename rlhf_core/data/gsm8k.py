"""GSM8K → the verl parquet schema (mirrors ``examples/data_preprocess/gsm8k.py`` in verl).

Each output row::

    data_source  "openai/gsm8k"
    prompt       [{"role": "user", "content": question + " " + INSTRUCTION}]
    ability      "math"
    reward_model {"style": "rule", "ground_truth": <number after "####", commas removed>}
    extra_info   {"split": split, "index": i, "answer": <raw answer>, "question": <raw question>}
"""
from __future__ import annotations

import os
import re
from typing import Any

from rlhf_core.data import DataError, RemoteUnavailableError
from rlhf_core.data.fs import copy_to_local
from rlhf_core.data.gsm8k_multiturn import to_multiturn
from rlhf_core.data.readers import RowSource, read_jsonl_rows, read_parquet_rows, write_parquet_atomic

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
HUB_URL = "hf://datasets/openai/gsm8k/main/{split}-00000-of-00001.parquet"
SPLITS = ("train", "test")
_SOLUTION = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_solution(answer: str) -> str | None:
    """The number after ``#### `` with commas removed (``"#### 1,234"`` → ``"1234"``); None when absent."""
    match = _SOLUTION.search(answer)
    return match.group(1).replace(",", "") if match else None


def gsm8k_row(question: str, answer: str, split: str, index: int, where: RowSource | str) -> dict[str, Any]:
    """One verl-schema row from a raw (question, answer) pair.

    Raises:
        DataError: question/answer not a string, or no ``#### <number>`` in the answer (names ``where``).
    """
    for field, value in (("question", question), ("answer", answer)):
        if not isinstance(value, str):
            raise DataError(f"{where}: field {field!r} must be a string, got {type(value).__name__}")
    solution = extract_solution(answer)
    if solution is None:
        raise DataError(f"{where}: field 'answer' has no '#### <number>' final answer: {answer[-80:]!r}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def _copy_from_hub(url: str) -> str:
    """``copy_to_local(url)`` for a hub file; any failure becomes a RemoteUnavailableError saying how to use local
    files (an input error: the pipeline fails at once with this message instead of retrying)."""
    try:
        return copy_to_local(url)
    except Exception as exc:  # noqa: BLE001 - offline, proxy, missing huggingface_hub, 404, rate limit...
        raise RemoteUnavailableError(
            f"could not read {DATA_SOURCE} from the Hugging Face hub ({url}): {type(exc).__name__}: {exc}. "
            "Without network access, set GSM8K_DIR (pipeline) or --local-dir (rlhf data gsm8k) to a folder "
            "holding train.jsonl and test.jsonl (GSM8K's original question/answer format)."
        ) from exc


def _raw_rows(local_dir: str | None, split: str) -> tuple[list[dict[str, Any]], list[RowSource]]:
    if local_dir is None:
        url = HUB_URL.format(split=split)
        rows = read_parquet_rows(_copy_from_hub(url), display=url)
        return rows, [RowSource(url, i) for i in range(len(rows))]
    url = local_dir.rstrip("/") + f"/{split}.jsonl"
    rows, lines = read_jsonl_rows(copy_to_local(url), display=url)
    return rows, [RowSource(url, ln, is_line=True) for ln in lines]


def preprocess_gsm8k(local_dir: str | None, out_dir: str, multiturn: bool = False) -> dict[str, str]:
    """Convert GSM8K's ``train``/``test`` splits to verl parquet files ``<out_dir>/{train,test}.parquet``.

    Args:
        local_dir: folder (local path or any fsspec URL) with ``train.jsonl`` and ``test.jsonl`` in the
            original format (``question``, ``answer``); None reads the Hugging Face hub parquet files
            (``hf://datasets/openai/gsm8k/main/...``) through huggingface_hub's fsspec filesystem.
        out_dir: local output folder (created). Files are written atomically (temporary name, then rename).
        multiturn: write verl's multi-turn tool schema instead (:mod:`rlhf_core.data.gsm8k_multiturn`).

    Returns:
        ``{"train": path, "test": path}``.

    Raises:
        DataError: a row without a string ``question``/``answer`` or a ``####`` answer (names file, line, field),
            or an empty split. RemoteUnavailableError: (``local_dir=None``) the hub could not be read — the message
            names the cause and says to set ``GSM8K_DIR`` / ``--local-dir`` to a folder with the jsonl files.
    """
    out_dir = os.path.expanduser(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    outputs: dict[str, str] = {}
    for split in SPLITS:
        raw, sources = _raw_rows(local_dir, split)
        if not raw:
            raise DataError(f"{sources[0].file if sources else split}: the split {split!r} has no rows")
        rows = []
        for idx, (row, src) in enumerate(zip(raw, sources)):
            for field in ("question", "answer"):
                if field not in row:
                    raise DataError(f"{src}: missing field {field!r}")
            rows.append(gsm8k_row(row["question"], row["answer"], split, idx, src))
            if multiturn:
                rows[-1] = to_multiturn(rows[-1])
        path = os.path.join(out_dir, f"{split}.parquet")
        write_parquet_atomic(rows, path)
        outputs[split] = path
    return outputs
