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
    """Env ``RLHF_METRICS_FILE``, else ``<trainer.default_local_dir>/metrics.jsonl`` (the PPO and SFT schemas both
    have ``trainer.default_local_dir``)."""
    if os.environ.get("RLHF_METRICS_FILE"):
        return os.environ["RLHF_METRICS_FILE"]
    return os.path.join(str(config.trainer.default_local_dir), "metrics.jsonl")


def planned_metrics_file(config: Any) -> str | None:
    """The file a ``Tracking`` built from ``config`` will append to: env ``RLHF_METRICS_FILE``, else
    ``<trainer.default_local_dir>/metrics.jsonl`` when ``trainer.logger`` lists ``file``; None when it has no file
    sink (:mod:`rlhf_core.trainer.tracking`)."""
    if os.environ.get("RLHF_METRICS_FILE"):
        return os.environ["RLHF_METRICS_FILE"]
    backends = config.trainer.logger
    backends = [backends] if isinstance(backends, str) else list(backends)
    return default_metrics_file(config) if "file" in backends else None


def _record(line: bytes) -> tuple[int, str] | None:
    """``(step, name)`` of a metrics line; None for anything else (a line torn by a kill during the write, or any
    JSON that is not an object with an integer ``step``)."""
    try:
        row = json.loads(line)
        return int(row["step"]), str(row.get("name"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _step(line: bytes) -> int | None:
    rec = _record(line)
    return None if rec is None else rec[0]


def keep_through_step(path: str, step: int) -> tuple[int, int, str | None]:
    """Rewrite ``path`` atomically with its lines of steps ``<= step`` (byte for byte, in order); a line that is not
    a whole record (torn by a kill) is dropped. When whole records of later steps are dropped (a killed attempt's
    steps after its last checkpoint, or a resume from an earlier checkpoint than the last:
    ``trainer.resume_from_path``, or ``auto`` passing over a damaged one), the whole file is first copied to the
    first free ``<path>.N`` (which ``rlhf results register`` does not read): the checkpoint folders of abandoned
    steps are moved aside, not deleted, and so are their metrics. Returns ``(lines kept, lines dropped, the copy's
    path or None)``; ``(0, 0, None)`` when ``path`` does not exist (nothing is created)."""
    import shutil

    from rlhf_core.atomic import atomic_write

    if not os.path.exists(path):
        return 0, 0, None
    kept, dropped, later = [], 0, set()
    with open(path, "rb") as fh:
        for line in fh:
            s = _step(line)
            if s is not None and s <= step:
                kept.append(line if line.endswith(b"\n") else line + b"\n")
            else:
                dropped += 1
                if s is not None:
                    later.add(s)
    copy = None
    if later:
        copy = _free_side_name(path)
        shutil.copy2(path, copy)
    if dropped:
        with atomic_write(path, "wb") as out:
            out.writelines(kept)
    return len(kept), dropped, copy


def move_aside(path: str) -> str | None:
    """Rename a non-empty ``path`` to the first free ``<path>.1``, ``<path>.2``, ...; returns the new name, or None
    when ``path`` is missing or empty (an empty file is left as it is)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    side = _free_side_name(path)
    os.replace(path, side)
    return side


def _free_side_name(path: str) -> str:
    """The first of ``<path>.1``, ``<path>.2``, ... that does not exist."""
    n = 1
    while os.path.exists(f"{path}.{n}"):
        n += 1
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
    kept, dropped, copy = keep_through_step(path, int(resumed_step))
    if dropped:
        logger.warning("metrics file %s: resumed at step %d, kept its %d lines of steps <= %d and dropped %d (the "
                       "steps after it are logged again)%s", path, resumed_step, kept, resumed_step, dropped,
                       f"; the file as it was is kept as {copy}" if copy else "")


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
            rows = [rec for rec in map(_record, lines) if rec is not None]  # (step, name); odd lines skipped
            last = rows[-1][0] if rows else None
            if start == 0 or (last is not None and any(s < last for s, _ in rows)):
                break
    if last is None:
        return None, set()
    return last, {name for s, name in rows if s == last}
