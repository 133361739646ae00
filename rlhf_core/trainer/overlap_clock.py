"""How long generation and the actor update ran at once, for the off-policy drivers' ``timing_s/overlap_gen_update``
(ours; verl logs no such figure): the seconds of a step's ``update_actor`` stage during which a generation of the
rollout group was running (the one-step driver's look-ahead, the fully async rollouter's chunk, a partial
rollout's pauses at a sync included). On-policy this is 0 by construction: generation and update alternate.
"""
from __future__ import annotations

import threading
import time


class OverlapClock:
    """Wall-clock spans (``time.perf_counter`` seconds) of generations, opened and closed from any thread, and their
    overlap with an interval of the caller's thread (:meth:`overlap`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[list[float | None]] = []  # [start, end or None while running]

    def start(self) -> list[float | None]:
        """Open a span now; pass the returned handle to :meth:`stop`."""
        span: list[float | None] = [time.perf_counter(), None]
        with self._lock:
            self._spans.append(span)
        return span

    def stop(self, span: list[float | None]) -> None:
        """Close ``span`` now."""
        with self._lock:
            span[1] = time.perf_counter()

    def overlap(self, t0: float, t1: float) -> float:
        """Seconds of ``[t0, t1]`` covered by the spans (a running one counts up to ``t1``; spans do not overlap one
        another: one generation at a time). Spans that ended before ``t0`` are dropped: call with increasing
        ``t0``."""
        total = 0.0
        with self._lock:
            self._spans = [s for s in self._spans if s[1] is None or s[1] > t0]
            for start, end in self._spans:
                total += max(0.0, min(t1 if end is None else end, t1) - max(start, t0))
        return total
