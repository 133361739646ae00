"""Progress bars for long loops (prompt filtering, rollout, SFT epochs, evaluation scoring).

A bar shows only where a person is watching: on a terminal, and not under CI. The rule lives in
:func:`bars_enabled`; :func:`progress` wraps an iterable in a ``tqdm`` bar that follows it.
"""
from __future__ import annotations

import os
import sys
from typing import IO, Iterable, Iterator, TypeVar

from tqdm import tqdm

T = TypeVar("T")

_TRUTHY = {"true", "1", "yes"}


def bars_enabled(stream: IO[str] | None = None) -> bool:
    """Whether progress bars are drawn on ``stream`` (default ``sys.stderr``).

    False when the environment variable ``CI`` is truthy (``true``, ``1`` or ``yes``, case-insensitive, surrounding
    spaces ignored), so CI logs stay free of carriage-return bars even under a pseudo-terminal; False when
    ``stream`` is not a TTY (piped, redirected to a file, a Ray worker's log, or a stream without ``isatty``);
    True otherwise.
    """
    if os.environ.get("CI", "").strip().lower() in _TRUTHY:
        return False
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):  # a closed or detached stream
        return False


def progress(iterable: Iterable[T], desc: str, total: int | None = None, unit: str = "it",
             stream: IO[str] | None = None, leave: bool = True) -> Iterator[T]:
    """Yield the items of ``iterable`` unchanged, drawing a ``tqdm`` bar on ``stream`` (default ``sys.stderr``)
    when :func:`bars_enabled` says so.

    ``desc`` labels the bar, ``unit`` names one item (``"prompt"``, ``"step"``), ``total`` is the number of items
    (default ``len(iterable)`` where it has one; otherwise the bar shows a count without a percentage);
    ``leave=False`` erases the bar when done (for loops run once per training step). A disabled bar writes
    nothing. The bar is closed when the loop ends, breaks, or raises.
    """
    stream = sys.stderr if stream is None else stream
    bar = tqdm(iterable, desc=desc, total=total, unit=unit, file=stream, disable=not bars_enabled(stream),
               dynamic_ncols=True, leave=leave)
    try:
        yield from bar
    finally:
        bar.close()


def quiet_progress_bars_when_redirected(stream: IO[str] | None = None) -> bool:
    """Set ``HF_HUB_DISABLE_PROGRESS_BARS=1`` (huggingface_hub's switch, which transformers' own bars follow, read
    when they are imported) unless the user set it, when ``stream`` (default: stderr, where the bars draw) is not a
    terminal: a redirected ``rlhf ppo > run.log`` got a "Loading weights" bar redrawn into the file for every model
    load (a new user's trial). Ray workers started from here inherit it. Returns whether it set it."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if "HF_HUB_DISABLE_PROGRESS_BARS" in os.environ or (callable(isatty) and isatty()):
        return False
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    return True
