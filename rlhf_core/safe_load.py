"""Read checkpoint files without running code from them (issue 32, "untrusted files are not code").

A ``.pt`` file is a pickle, and a pickle can name any Python function to call while it is read. Every file a
checkpoint or a dump is read from goes through this module, which only ever builds tensors and plain data:

* :func:`load_state` — ``torch.load(weights_only=True)``: tensors, dicts, lists, tuples, numbers, strings, None
  (and, for checkpoints written before the RNG states were stored as lists, numpy arrays of numbers);
* :func:`dcp_load` / :func:`dcp_load_full` — ``torch.distributed.checkpoint`` folders. Torch 2.13 reads their
  ``.metadata`` with plain ``pickle.load`` and their non-tensor items (optimizer ``param_groups``) with
  ``torch.load(weights_only=False)``; here ``.metadata`` is read by an unpickler that only knows DCP's own
  metadata classes (the "restricting globals" recipe of the ``pickle`` docs), and every non-tensor item is
  first read with ``weights_only=True``.

A file holding anything else is refused with :class:`CheckpointError`, naming the file and the object it wanted
to build; nothing in it has run. Tests: ``tests/reliability/test_checkpoint_trust.py``.
"""
from __future__ import annotations

import io
import os
import pathlib
import pickle
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo

from rlhf_core.data import DataError


class CheckpointError(DataError):
    """A checkpoint that cannot be used as it is (unsafe content, missing or partial files, a folder locked by
    another run); the message names the file or folder and what is wrong."""


# numpy arrays of numbers, as the RNG states of older checkpoints hold them: building an array calls no user
# code (an object array's elements are read by the same restricted unpickler)
_NUMPY_GLOBALS = [np._core.multiarray._reconstruct, np.ndarray, np.dtype] + [
    type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFD"]

# what DCP's .metadata pickles hold (torch 2.13): its dataclasses, torch.Size, dtypes, layouts, a path
_DCP_GLOBALS = {
    dcp_metadata.Metadata, dcp_metadata.MetadataIndex, dcp_metadata.StorageMeta, dcp_metadata.TensorProperties,
    dcp_metadata.TensorStorageMetadata, dcp_metadata.BytesStorageMetadata, dcp_metadata.ChunkStorageMetadata,
    dcp_metadata._MEM_FORMAT_ENCODING, _StorageInfo, pathlib.PosixPath, torch.Size, torch.serialization._get_layout,
}


def _refusal(path: str, exc: BaseException) -> CheckpointError:
    reason = str(exc).strip().splitlines()
    # torch's message starts with advice to load untrusted files unsafely; keep only the line naming the object
    detail = next((line.strip() for line in reason if "GLOBAL" in line or "Unsupported" in line), reason[0] if reason
                  else type(exc).__name__)
    return CheckpointError(f"{path}: refused to load: it holds Python objects other than tensors and plain data "
                           f"({detail}); checkpoint files are never run as code")


def load_state(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``: a state dict, RNG state or dataloader position, never code.

    Returns:
        what the file holds (tensors on ``map_location``).

    Raises:
        CheckpointError: the pickle names any other global (e.g. ``os.system``, a class with ``__reduce__``),
            naming ``path`` and that global; nothing from the file has run.
        FileNotFoundError: ``path`` does not exist.
    """
    try:
        with torch.serialization.safe_globals(_NUMPY_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _refusal(str(path), exc) from None


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds only DCP metadata objects (the ``pickle`` docs' "restricting globals")."""

    def find_class(self, module: str, name: str) -> Any:
        obj = super().find_class(module, name) if module.split(".")[0] in ("torch", "pathlib") else None
        if obj in _DCP_GLOBALS or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
            return obj
        raise pickle.UnpicklingError(f"Unsupported GLOBAL {module}.{name} in a checkpoint's .metadata")


class SafeFileSystemReader(FileSystemReader):
    """DCP's ``FileSystemReader`` whose ``.metadata`` is read by :class:`_MetadataUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        rank = kwargs.get("rank")
        path = self._get_metadata_path(rank)
        with self.fs.create_stream(path, "rb") as fh:
            try:
                metadata = _MetadataUnpickler(fh).load()
            except pickle.UnpicklingError as exc:
                raise _refusal(str(path), exc) from None
        if not isinstance(metadata, dcp_metadata.Metadata):
            raise CheckpointError(f"{path}: not a torch.distributed.checkpoint metadata file")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _checked_bytes(folder: str, fqn: str, value: io.BytesIO) -> io.BytesIO:
    """``value`` rewound, once it has been read with ``weights_only=True`` (so torch's own read runs no code)."""
    try:
        torch.load(value, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _refusal(f"{folder} (item {fqn!r})", exc) from None
    value.seek(0)
    return value


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner whose non-tensor items are checked by :func:`_checked_bytes` first."""

    def __init__(self, folder: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.folder = folder

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        super().load_bytes(read_item, _checked_bytes(self.folder, read_item.dest_index.fqn, value))


class _SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        super().load_bytes(read_item, _checked_bytes(self.folder, read_item.dest_index.fqn, value))


def _unwrapped(call) -> Any:
    """``call()``, re-raising a :class:`CheckpointError` that DCP wrapped into its ``CheckpointException``."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        return call()
    except CheckpointException as exc:
        for failure in exc.failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, CheckpointError):
                raise inner from None
        raise


def dcp_load(state_dict: dict, folder: str) -> None:
    """``dcp.load(state_dict, checkpoint_id=folder)`` in place (collective when a process group is up), reading
    ``.metadata`` and non-tensor items without running code (module docstring).

    Raises:
        CheckpointError: ``.metadata`` or an item holds other Python objects (naming the folder and the object).
    """
    SafeFileSystemReader(folder).read_metadata()  # refused here in one line, before DCP wraps the error
    _unwrapped(lambda: dcp.load(state_dict, storage_reader=SafeFileSystemReader(folder),
                                planner=SafeLoadPlanner(folder)))


def dcp_load_full(folder: str) -> dict[str, Any]:
    """Every item of the DCP folder ``folder`` as one state dict, in this process alone (no process group);
    the safe form of torch's ``dcp_to_torch_save``.

    Raises:
        CheckpointError: as :func:`dcp_load`.
    """
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    SafeFileSystemReader(folder).read_metadata()
    state: dict[str, Any] = {}
    _unwrapped(lambda: _load_state_dict(state, storage_reader=SafeFileSystemReader(folder),
                                        planner=_SafeEmptyPlanner(folder), no_dist=True))
    return state
