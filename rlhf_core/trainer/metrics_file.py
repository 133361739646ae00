"""The ``file`` sink's metrics file across a resume: each (step, metric) once, nothing of the kept steps lost.

A run resumed from the checkpoint of step ``N`` trains steps ``N+1, ...`` again, which its killed attempt may
already have logged. Before the resumed run's tracker opens the file, :func:`prepare_metrics_file` (called by the
PPO driver's ``prepare_resume`` and the SFT trainer's ``fit``) rewrites it with the lines of steps ``<= N`` only:
the kept lines are copied byte for byte into a temporary sibling, which then replaces the file in one
``os.replace`` (:func:`rlhf_core.atomic.atomic_write`), so a kill at any moment leaves either the old file or the
new one, never a truncated or empty one. A run that starts from scratch (no checkpoint, or
``trainer.resume_mode=disable``) over an existing file moves that file aside to ``<file>.1`` (``.2``, ... when
taken) and writes a new one: those lines belong to an earlier run and are kept, not deleted; the side file's name
does not match ``metrics*.jsonl``, so ``rlhf results register`` reads only the current run's.

A resumed run that validates again at step ``N`` (``trainer.val_before_train``) would log that step's validation a
second time: the file sink skips a (step, metric) that the file already holds at its last step
(:func:`names_at_last_step`), keeping the first value (the checkpoint's weights are the same; on CPU the values are
equal, docs/RESUME.md).
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)


def default_metrics_file(config: Any) -> str:
    """Env ``RLHF_METRICS_FILE``, else ``<trainer.default_local_dir>/metrics.jsonl``, else ``./metrics.jsonl``."""
    if os.environ.get("RLHF_METRICS_FILE"):
        return os.environ["RLHF_METRICS_FILE"]
    try:
        return os.path.join(str(config.trainer.default_local_dir), "metrics.jsonl")
    except Exception:
        return "metrics.jsonl"


def planned_metrics_file(config: Any) -> str | None:
    """The file a ``Tracking`` built from ``config`` will append to: env ``RLHF_METRICS_FILE``, else
    ``<trainer.default_local_dir>/metrics.jsonl`` when ``trainer.logger`` lists ``file``; None when it has no file
    sink (:mod:`rlhf_core.trainer.tracking`)."""
    if os.environ.get("RLHF_METRICS_FILE"):
        return os.environ["RLHF_METRICS_FILE"]
    backends = config.trainer.logger
    backends = [backends] if isinstance(backends, str) else list(backends or [])
    return default_metrics_file(config) if "file" in backends else None


def _step(line: bytes) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):  # a torn last line (a kill during the write): not a record
        return None


def keep_through_step(path: str, step: int) -> tuple[int, int]:
    """Rewrite ``path`` atomically with its lines of steps ``<= step`` (byte for byte, in order); a line that is not
    a whole record (torn by a kill) is dropped. Returns ``(lines kept, lines dropped)``; ``(0, 0)`` when ``path``
    does not exist (nothing is created)."""
    from rlhf_core.atomic import atomic_write

    if not os.path.exists(path):
        return 0, 0
    kept, dropped = [], 0
    with open(path, "rb") as fh:
        for line in fh:
            s = _step(line)
            if s is not None and s <= step:
                kept.append(line if line.endswith(b"\n") else line + b"\n")
            else:
                dropped += 1
    if dropped:
        with atomic_write(path, "wb") as out:
            out.writelines(kept)
    return len(kept), dropped


def move_aside(path: str) -> str | None:
    """Rename a non-empty ``path`` to the first free ``<path>.1``, ``<path>.2``, ...; returns the new name, or None
    when ``path`` is missing or empty (an empty file is left as it is)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    n = 1
    while os.path.exists(f"{path}.{n}"):
        n += 1
    os.replace(path, f"{path}.{n}")
    return f"{path}.{n}"


def prepare_metrics_file(config: Any, resumed_step: int | None, val_only: bool = False) -> None:
    """Before a training run's tracker opens its metrics file (module docstring): resumed from the checkpoint of
    step ``resumed_step``, keep the lines of steps ``<= resumed_step``; from scratch (None), move an existing file
    aside. A no-op without a file sink and for a ``val_only`` run (PPO's ``trainer.val_only``: it trains nothing, so
    it logs no step again).

    Raises:
        OSError: the file cannot be read or replaced (the old file is then left as it was).
    """
    path = planned_metrics_file(config)
    if path is None or val_only:
        return
    if resumed_step is None:
        moved = move_aside(path)
        if moved:
            logger.warning("metrics file %s is from an earlier run (this one starts at step 0): moved to %s",
                           path, moved)
        return
    kept, dropped = keep_through_step(path, int(resumed_step))
    if dropped:
        logger.warning("metrics file %s: resumed at step %d, kept its %d lines of steps <= %d and dropped %d (the "
                       "steps after it are logged again)", path, resumed_step, kept, resumed_step, dropped)


def names_at_last_step(path: str, block: int = 1 << 16) -> tuple[int | None, set[str]]:
    """``(last step, the metric names logged at it)`` of a metrics file, read from its end (a block at a time until
    a line of an earlier step is seen); ``(None, set())`` for a missing or empty file."""
    if not os.path.exists(path):
        return None, set()
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        start = size
        while True:
            start = max(0, start - block)
            fh.seek(start)
            lines = fh.read(size - start).split(b"\n")
            if start > 0:
                lines = lines[1:]  # the first one may be cut by the block's start
            rows = []
            for line in lines:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
            last = next((int(r["step"]) for r in reversed(rows) if "step" in r), None)
            if start == 0 or (last is not None and any(int(r["step"]) < last for r in rows if "step" in r)):
                break
    if last is None:
        return None, set()
    return last, {str(r.get("name")) for r in rows if "step" in r and int(r["step"]) == last}
