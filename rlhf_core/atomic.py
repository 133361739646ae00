"""Atomic writes: a file or a folder is either the old one or the complete new one, never half-written.

The one way this project writes anything a reader may open while it is being written (the checkpoint tracker,
``data.pt``, sample/parquet files, the results store's tables, cached downloads, merged models):

* :func:`atomic_write` — a file: written to a temporary sibling in the same folder (so the rename never crosses a
  file system), flushed and ``fsync``-ed, moved over the target with ``os.replace`` (atomic on POSIX), then the
  folder is ``fsync``-ed so the rename itself survives a crash. On any error the temporary file is removed and the
  old file is left as it was.
* :func:`atomic_directory` — a folder: filled in a temporary sibling, its files ``fsync``-ed, then swapped in with
  :func:`replace_directory` (an existing folder is moved aside first, because a non-empty folder cannot be
  replaced in one rename, and removed after).

Temporary names start with ``.`` and end in ``.tmp``; they get the permissions of a normally created file
(``0o666``/``0o777`` minus the umask), not ``mkstemp``'s ``0o600``.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from typing import IO, Iterator

_UNSUPPORTED_DIR_FSYNC = (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES)


def _tmp_sibling(path: str) -> str:
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")


def fsync_dir(path: str) -> None:
    """``fsync`` the folder ``path`` so renames inside it are durable (skipped where the file system refuses)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        if exc.errno in _UNSUPPORTED_DIR_FSYNC:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED_DIR_FSYNC:
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; on a clean exit it replaces ``path`` atomically.

    ``mode``: ``"wb"`` (default) or ``"w"`` (text, with ``encoding``, default UTF-8). The folder is created if
    missing. Usable with any writer that takes a file object (``pq.write_table(table, f)``, ``torch.save(obj, f)``).

    Raises:
        ValueError: ``mode`` is not a write mode.
        Whatever the body raises: the temporary file is removed and ``path`` keeps its old content.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode {mode!r}: use 'w' or 'wb'")
    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = _tmp_sibling(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, mode, encoding=(encoding or "utf-8") if mode == "w" else None) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    fsync_dir(os.path.dirname(path))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write`)."""
    with atomic_write(path, "w") as fh:
        fh.write(text)


def _fsync_tree(root: str) -> None:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            full = os.path.join(folder, name)
            if os.path.islink(full):
                continue
            fd = os.open(full, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)


def replace_directory(tmp: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Swap the complete folder ``tmp`` in at ``dest``: its files are ``fsync``-ed, an existing ``dest`` is moved
    aside (a non-empty folder cannot be replaced by one rename) and removed once ``tmp`` is in place.

    ``tmp`` must be on the same file system as ``dest`` (a sibling). A reader sees the old folder, then briefly
    no folder, then the new one; never a partial one.
    """
    tmp, dest = os.fspath(tmp), os.path.abspath(os.fspath(dest))
    _fsync_tree(tmp)
    old = None
    if os.path.isdir(dest):
        old = _tmp_sibling(dest)
        os.replace(dest, old)
    os.replace(tmp, dest)
    fsync_dir(os.path.dirname(dest))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[str]:
    """Yield a new temporary sibling folder of ``path``; on a clean exit it becomes ``path``
    (:func:`replace_directory`); on an error it is removed and ``path`` is left as it was."""
    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = _tmp_sibling(path)
    os.mkdir(tmp, 0o777)
    try:
        yield tmp
        replace_directory(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
