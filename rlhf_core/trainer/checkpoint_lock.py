"""One writer per checkpoint folder: ``<default_local_dir>/.rlhf_run.lock``, held by the run that writes it.

The lock is an ``flock`` on that file, taken by the trainer's driver before any worker starts and held until
:meth:`CheckpointDirLock.release` (the trainer's ``shutdown``) or the end of the process: the kernel drops it when
the process dies in any way, SIGKILL included. The file holds the holder's PID, host and start time, so a second
run on the same folder fails at once naming them. A lock file whose process has ended (its ``flock`` is free) is
taken over, with a notice naming the previous holder. Tests: ``tests/reliability/test_checkpoint_resume_safety.py``.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from typing import IO

from rlhf_core.safe_load import CheckpointError

logger = logging.getLogger(__name__)
LOCK_FILE = ".rlhf_run.lock"


def _describe(text: str) -> str:
    """``PID 12 on host h (since 2025-01-01 10:00:00)`` from a lock file's content (or the raw text)."""
    try:
        holder = json.loads(text)
        return f"PID {holder['pid']} on host {holder['host']} (since {holder['started']})"
    except (ValueError, KeyError, TypeError):
        return repr(text.strip()) if text.strip() else "an unknown process"


class CheckpointDirLock:
    """The exclusive lock of the checkpoint folder ``root`` (module docstring)."""

    def __init__(self, root: str) -> None:
        self.root = str(root)
        self.path = os.path.join(self.root, LOCK_FILE)
        self._fh: IO | None = None

    @property
    def held(self) -> bool:
        return self._fh is not None

    def acquire(self) -> None:
        """Take the lock (creating ``root``); a no-op when this object already holds it.

        Raises:
            CheckpointError: another live process holds it, naming its PID, host, start time and the lock file (its
                ``holder`` attribute: that description alone).
        """
        if self._fh is not None:
            return
        os.makedirs(self.root, exist_ok=True)
        while True:
            fh = open(self.path, "a+")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                holder = _describe(fh.read())
                fh.close()
                err = CheckpointError(
                    f"trainer.default_local_dir={self.root!r} is in use by another run: {holder} holds {self.path}; "
                    f"wait for it to end or give this run another trainer.default_local_dir")
                err.holder = holder  # for callers that word their own message (flows.resume)
                raise err from None
            try:  # the previous holder removes the file as it releases: make sure ours is still the one on disk
                same = os.stat(self.path).st_ino == os.fstat(fh.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            fh.close()
        fh.seek(0)
        previous = fh.read()
        if previous.strip():
            logger.warning("taking over %s: its holder %s has ended without releasing it", self.path,
                           _describe(previous))
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        """Remove the lock file and drop the lock (a no-op when not held)."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        fh.close()
