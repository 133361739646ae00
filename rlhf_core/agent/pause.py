"""The weight gate of an agent-loop rollout under ``async_training.partial_rollout=True`` (fully async driver): a
parameter sync loads new weights between two decoding steps of the agent loops' engine while their trajectories
stay open, and the trajectories then go on with the new weights.

The :class:`~rlhf_core.agent.engine.StepEngine` runs each decoding step (one forward over the running requests'
whole sequences, no KV cache) inside :meth:`WeightGate.step`; :meth:`WeightGate.load` (another thread: the
rollout actor's second Ray thread) waits for the step in flight, loads the weights while no step runs and counts
a version. :meth:`WeightGate.interrupt` stops new steps from starting until that load, so a sync never waits for
the end of a turn or a chunk. A step after the load re-runs the forward over prompt + tokens so far with the new
weights (verl's resume also drops the KV cache at a sync), so each token's log-prob is that of the weights that
sampled it. ``version`` counts the loads; the engine tags every sampled token with the version it ran under.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator


class WeightGate:
    """Serialises decoding steps and weight loads (thread-safe)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._interrupted = False
        self._busy = False
        self.version = 0  # weight loads so far

    def interrupt(self) -> None:
        """Start no further step until the next :meth:`load` (the step in flight finishes)."""
        with self._cond:
            self._interrupted = True

    def release(self) -> None:
        """Clear an interrupt without a load (the sync failed): the waiting steps go on with the weights held."""
        with self._cond:
            self._interrupted = False
            self._cond.notify_all()

    @contextmanager
    def step(self) -> Iterator[int]:
        """One decoding step: waits while interrupted, yields the weight version it runs under."""
        with self._cond:
            self._cond.wait_for(lambda: not self._interrupted)
            self._busy = True
            version = self.version
        try:
            yield version
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def load(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (the weight load) once no step is in flight, with no step starting meanwhile; then count a
        version, clear the interrupt and wake the waiting steps."""
        with self._cond:
            self._cond.wait_for(lambda: not self._busy)
            try:
                fn()
                self.version += 1
            finally:
                self._interrupted = False
                self._cond.notify_all()
