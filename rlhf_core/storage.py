"""Full disks and read-only stores: one line naming the path and what was kept, never a traceback.

A write that fails because the disk is full (``ENOSPC``), a quota is spent (``EDQUOT``) or the file system is
read-only (``EROFS``) is re-raised as :class:`StorageError` (an ``OSError`` with the same ``errno``) whose message
is one line: what was being written, its path, why, and what is still there. The ``rlhf`` commands print such an
error as that one line and exit 1 (:func:`rlhf_core.cli.run_command`), wherever it was raised: in the driver, or
in a Ray worker (:func:`storage_cause` finds it under Ray's wrapper).

A full disk does not always arrive as an ``OSError``: ``torch.save`` into a file (and so DCP, which also wraps
every rank's error in its ``CheckpointException``) reports a failed write as ``RuntimeError: ... unexpected pos``.
:func:`full_disk_cause` recognises such a failure by the space left where it was writing.

Not from verl (verl lets these errors surface as tracebacks). Import-light: no torch, no MLflow.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
"""``errno`` values that mean the storage, not the program, refused a write."""


class StorageError(OSError):
    """A write refused by full or read-only storage; ``str()`` is one line (``[Errno N] <what> <path> ...``)."""


def is_storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``OSError`` whose ``errno`` is in :data:`STORAGE_ERRNOS`."""
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


def storage_cause(exc: BaseException) -> OSError | None:
    """The storage error (:func:`is_storage_error`) that ``exc`` is or wraps: followed through ``__cause__``,
    Ray's ``RayTaskError.cause`` (an error raised in a worker) and each rank's error of DCP's ``CheckpointException``,
    at most 8 levels; None when there is none."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if is_storage_error(seen):
            return seen  # type: ignore[return-value]
        failures = getattr(seen, "failures", None)  # DCP's CheckpointException: {rank: (error, traceback)}
        if isinstance(failures, dict):
            for failure in failures.values():
                inner = failure[0] if isinstance(failure, tuple) and failure else failure
                if isinstance(inner, BaseException) and storage_cause(inner) is not None:
                    return storage_cause(inner)
        seen = getattr(seen, "cause", None) or seen.__cause__
    return None


FULL_DISK_SLACK = 1 << 20
"""Bytes: a write that failed with less than this free where it was writing failed because the disk is full."""


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged writer may still use on the file system of ``path`` (its nearest existing folder;
    ``shutil.disk_usage``' ``free``, i.e. ``statvfs`` ``f_bavail × f_frsize``)."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def full_disk_cause(exc: BaseException, path: str | os.PathLike) -> OSError | None:
    """The storage error behind a failed write to ``path``, or None when the failure is not the storage's.

    :func:`storage_cause` when ``exc`` is or wraps one; else, when less than :data:`FULL_DISK_SLACK` bytes are
    free at ``path`` (:func:`free_bytes`; call it before removing what the failed write left), an ``OSError``
    ``ENOSPC`` standing for ``exc`` (``torch.save``' ``unexpected pos``, DCP's ``CheckpointException``).
    """
    cause = storage_cause(exc)
    if cause is not None:
        return cause
    try:
        full = free_bytes(path) < FULL_DISK_SLACK
    except OSError:
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) if full else None


def storage_error(exc: OSError, what: str, path: str | os.PathLike, kept: str) -> StorageError:
    """A :class:`StorageError` for ``exc`` (same ``errno``): ``"<what> <path> not written (<reason>); kept: <kept>"``.

    Args:
        exc: the ``OSError`` the write raised (``ENOSPC``, ``EDQUOT``, ``EROFS``).
        what: what was being written, e.g. ``"metrics file"``.
        path: the file or folder that was being written.
        kept: what is still there, e.g. ``"the metrics of steps up to 3 (whole lines)"``.
    """
    reason = exc.strerror or os.strerror(exc.errno or 0)
    return StorageError(exc.errno, f"{what} {os.fspath(path)} not written ({reason}); kept: {kept}")


def read_only_reason(path: str | os.PathLike) -> str | None:
    """Why nothing can be written at ``path`` (a file, or where one would be created), or None when it can.

    Checks ``path`` when it is a file and its nearest existing folder (a SQLite store writes a journal beside its
    file): ``"Read-only file system"`` when the file system is mounted read-only (``statvfs``' ``ST_RDONLY``),
    ``"Permission denied"`` when this process may not write there.
    """
    target = Path(path)
    folder = target if target.is_dir() else target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return os.strerror(errno.EROFS)
    for place in ([target] if target.is_file() else []) + [folder]:
        if not os.access(place, os.W_OK):
            return os.strerror(errno.EACCES)
    return None


def unwritable_output(key: str, path: str | os.PathLike) -> str | None:
    """One line naming the config ``key`` and its value when nothing can be written at the local ``path`` (where a
    command will create its output folder or file), or None when it can (:func:`read_only_reason`). Meant for the
    checks a command runs before loading a model or starting Ray, so that a read-only or forbidden output place is
    refused in seconds, not after the work. Not from verl (verl finds out at its first write)."""
    reason = read_only_reason(path)
    if reason is None:
        return None
    return (f"{key}={os.fspath(path)!r}: nothing can be written there ({reason}); give a writable folder, checked "
            "before any model loads")


def sqlite_store_path(uri: str | None) -> str | None:
    """The file of a ``sqlite:///<path>`` URI (MLflow's SQLite store), or None for any other URI."""
    if uri and uri.startswith("sqlite:///"):
        return uri[len("sqlite:///"):]
    return None


__all__ = ["FULL_DISK_SLACK", "STORAGE_ERRNOS", "StorageError", "free_bytes", "full_disk_cause", "is_storage_error",
           "read_only_reason", "sqlite_store_path", "storage_cause", "storage_error", "unwritable_output"]
