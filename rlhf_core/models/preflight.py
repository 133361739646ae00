"""Cheap checks of a local model folder and tokenizer, run in the driver before Ray starts or any model loads.

* :func:`check_model_files`: the folder holds a ``config.json`` and complete weights — every shard an index names
  exists, and every safetensors file is as long as its header says (8 + header + data bytes; only the header is
  read, no tensor), every ``.bin`` zip archive has its central directory (a copy cut short has not).
* :func:`require_chat_template`: the tokenizer has a chat template where the prompts are chat messages.

Hub ids and remote URLs are left to the loaders (the weights are not here to check).
"""
from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

from rlhf_core.config.errors import ConfigError

# transformers' file names, in the order from_pretrained looks for them
SAFE, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
_MAX_HEADER = 100 * 1024 * 1024  # safetensors refuses headers above 100 MB


def local_dir(path: str) -> Path | None:
    """The local folder ``path`` names (``~`` expanded, ``file://`` stripped), or None for a hub id, a remote URL or
    a path that is not a folder (:func:`~rlhf_core.models.loading.check_local_path` reports a missing one)."""
    path = os.path.expanduser(str(path))
    path = path[len("file://"):] if path.startswith("file://") else path
    return Path(path) if "://" not in path and os.path.isdir(path) else None


def safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file's length, or None when it is whole.

    The format: an 8-byte little-endian header length N, N bytes of JSON whose entries' ``data_offsets``
    ``[begin, end]`` index the data that follows; the file must be exactly ``8 + N + max(end)`` bytes long
    (safetensors' own ``MetadataIncompleteBuffer`` rule). Reads only the header."""
    size = file.stat().st_size
    with open(file, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{file} is {size} bytes, shorter than a safetensors header"
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            return f"{file} is {size} bytes, but its header alone declares {8 + n} (truncated or not safetensors)"
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return f"{file}: the safetensors header is not valid JSON (damaged file)"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
            and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2]
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        return f"{file} is {size} bytes, but its header declares {expected} (truncated or damaged copy)"
    return None


def bin_problem(file: Path) -> str | None:
    """A ``.bin`` saved by ``torch.save`` (a zip archive since torch 1.6) whose end of central directory is
    missing — a copy cut short; None for a whole one or the legacy non-zip format (not checked)."""
    with open(file, "rb") as fh:
        is_zip_start = fh.read(4) == b"PK\x03\x04"
    if is_zip_start and not zipfile.is_zipfile(file):
        return f"{file} is {file.stat().st_size} bytes and its zip archive has no end (truncated copy)"
    return None


def _shards(folder: Path, index_name: str) -> list[Path]:
    index = folder / index_name
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{index}: not a readable shard index ({type(exc).__name__}: {exc})") from None


def weight_files(folder: Path) -> list[Path]:
    """The weight files ``from_pretrained`` would read from ``folder``: the shards of
    ``model.safetensors.index.json``, else ``model.safetensors``, else the shards of
    ``pytorch_model.bin.index.json``, else ``pytorch_model.bin``; ``[]`` when there is none of these.

    Raises:
        ConfigError: an index that is not JSON with a ``weight_map``.
    """
    if (folder / SAFE_INDEX).is_file():
        return _shards(folder, SAFE_INDEX)
    if (folder / SAFE).is_file():
        return [folder / SAFE]
    if (folder / BIN_INDEX).is_file():
        return _shards(folder, BIN_INDEX)
    return [folder / BIN] if (folder / BIN).is_file() else []


def check_model_files(key: str, path: str) -> None:
    """Refuse a local model folder that ``from_pretrained`` would fail on, or load incompletely, before it loads.

    ``key`` is the config key that names ``path`` (quoted in the message). Checks: ``config.json`` exists; there
    are weights (:func:`weight_files`); every shard an index lists exists; no file is cut short
    (:func:`safetensors_problem`, :func:`bin_problem`). Costs a few reads of file headers, no tensor is loaded.

    Raises:
        ConfigError: one line ``<key>=<path>: <what is missing or truncated>``.
    """
    folder = local_dir(path)
    if folder is None:
        return
    where = f"{key}={path!r}"
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{where}: no config.json in {folder}; a model folder needs one (save it with "
                          "save_pretrained)")
    files = weight_files(folder)
    if not files:
        raise ConfigError(f"{where}: no model weights in {folder} (looked for {SAFE}, {SAFE_INDEX}, {BIN}, "
                          f"{BIN_INDEX}); the copy may be incomplete")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ConfigError(f"{where}: {len(missing)} of the {len(files)} weight shards its index lists are missing "
                          f"in {folder}: {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}")
    for f in files:
        problem = safetensors_problem(f) if f.suffix == ".safetensors" else bin_problem(f)
        if problem:
            raise ConfigError(f"{where}: {problem}")


def require_chat_template(tokenizer: Any, where: str, needed_by: str, template: str | None = None) -> None:
    """Refuse a tokenizer without a chat template when the prompts are chat messages rendered with it.

    ``where``: the key and path of the tokenizer (``"data.tokenizer='/m'"``); ``needed_by``: the key(s) that make a
    template necessary and how to give one. ``template``: a template given by the config (SFT's
    ``data.chat_template``), which makes the tokenizer's unnecessary.

    Raises:
        ConfigError: one line naming ``where`` and ``needed_by``.
    """
    if template or getattr(tokenizer, "chat_template", None):
        return
    raise ConfigError(f"{where}: the tokenizer has no chat template (none in tokenizer_config.json, no "
                      f"chat_template.jinja), but {needed_by}")
