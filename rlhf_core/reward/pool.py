"""A small process pool that scores samples with a per-sample timeout and kills hung workers.

Used by the ``prime`` reward manager. Standard library only (``multiprocessing`` with the ``spawn`` context)
and import-light (no torch), so a worker starts in well under a second.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot kill one hung task, and a timeout measured from
submission (what verl's ``prime`` does) penalises samples that merely waited in the queue. Here each sample's
clock starts when a worker receives it; a worker past ``timeout_s`` is killed (SIGKILL) and replaced, and its
sample is reported as ``"timeout"``. A scorer that raises, or a worker that dies, gives ``"error"``.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

logger = logging.getLogger(__name__)

OK, TIMEOUT, ERROR = "ok", "timeout", "error"


def _worker_main(conn: Connection, scorer: Callable[..., Any]) -> None:
    """Worker loop: receive ``(idx, kwargs)``, reply ``(status, idx, result)``; ``None`` stops it."""
    conn.send(("ready", -1, None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        idx, kwargs = msg
        try:
            reply = (OK, idx, scorer(**kwargs))
            conn.send(reply)
        except BaseException as exc:  # noqa: BLE001 - a scorer's failure must not kill the pool
            conn.send((ERROR, idx, f"{type(exc).__name__}: {exc}"))


@dataclass
class _Worker:
    proc: Any
    conn: Connection
    spawned_at: float
    ready: bool = False
    task: int | None = None
    task_started_at: float = 0.0


class ScorerPool:
    """``num_processes`` spawn workers calling ``scorer(**kwargs)``; reused across :meth:`map` calls.

    Args:
        scorer: a picklable callable (a module-level function or a
            :class:`~rlhf_core.reward.custom.FileRewardFunction`).
        num_processes: worker count (>= 1).
        timeout_s: per-sample limit in seconds, counted from when a worker receives the sample.
        startup_timeout_s: limit for a fresh worker to import and report ready.

    Raises:
        TypeError: when ``scorer`` cannot be pickled.
        ValueError: when ``num_processes < 1`` or ``timeout_s <= 0``.
    """

    def __init__(
        self,
        scorer: Callable[..., Any],
        num_processes: int = 4,
        timeout_s: float = 300.0,
        startup_timeout_s: float = 120.0,
    ) -> None:
        if num_processes < 1 or timeout_s <= 0:
            raise ValueError(f"need num_processes >= 1 and timeout_s > 0, got {num_processes}, {timeout_s}")
        try:
            pickle.dumps(scorer)
        except Exception as exc:
            raise TypeError(
                f"the prime reward manager needs a picklable reward function (a module-level function or a "
                f"custom_reward_function file); {scorer!r} is not: {exc}"
            ) from exc
        self.scorer, self.num_processes = scorer, num_processes
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self._startup_failures = 0

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(child, self.scorer), daemon=True)
        proc.start()
        child.close()
        return _Worker(proc, parent, time.monotonic())

    def _kill(self, w: _Worker) -> None:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(timeout=5)
        w.conn.close()

    def map(self, kwargs_list: list[dict]) -> tuple[list[Any], list[str]]:
        """Score every ``kwargs`` dict; returns ``(results, statuses)`` in input order.

        ``statuses[i]`` is ``"ok"`` (``results[i]`` is the scorer's return value), ``"timeout"`` or ``"error"``
        (``results[i]`` is ``None`` for a timeout and the error text for an error). Never blocks longer than
        about ``timeout_s`` per sample (plus worker start-up).
        """
        n = len(kwargs_list)
        results: list[Any] = [None] * n
        statuses: list[str] = [""] * n
        pending = deque(range(n))
        while len(self._workers) < min(self.num_processes, n):
            self._workers.append(self._spawn())
        remaining = n
        while remaining:
            now = time.monotonic()
            for w in self._workers:  # hand out work
                if w.ready and w.task is None and pending:
                    idx = pending.popleft()
                    try:
                        w.conn.send((idx, kwargs_list[idx]))
                    except Exception as exc:  # unpicklable arguments
                        results[idx], statuses[idx] = f"cannot send sample: {exc}", ERROR
                        remaining -= 1
                        continue
                    w.task, w.task_started_at = idx, now
            by_conn = {w.conn: w for w in self._workers}
            for conn in wait(list(by_conn), timeout=0.05):
                w = by_conn[conn]
                try:
                    status, idx, value = conn.recv()
                except (EOFError, OSError):  # the worker died (os._exit, segfault, killed)
                    if w.ready:
                        remaining -= self._replace(w, results, statuses, ERROR, "reward worker died")
                    else:  # died while starting (e.g. the scorer cannot be unpickled there): do not respawn
                        self._startup_failures += 1
                        self._kill(w)
                        self._workers.remove(w)
                    continue
                if status == "ready":
                    w.ready = True
                    continue
                results[idx], statuses[idx] = value, status
                w.task = None
                remaining -= 1
            now = time.monotonic()
            for w in list(self._workers):
                if w.task is not None and now - w.task_started_at > self.timeout_s:
                    remaining -= self._replace(w, results, statuses, TIMEOUT, None)
                elif not w.ready and now - w.spawned_at > self.startup_timeout_s:
                    self._kill(w)
                    self._workers.remove(w)
            if not self._workers and pending:  # nothing can start: fail the rest instead of waiting forever
                logger.error("no reward worker could start; %d samples scored 0", len(pending))
                for idx in pending:
                    results[idx], statuses[idx] = "no reward worker could start", ERROR
                remaining -= len(pending)
                pending.clear()
        return results, statuses

    def _replace(self, w: _Worker, results: list, statuses: list, status: str, value: Any) -> int:
        """Kill ``w``, record its sample (if any) as ``status``, start a fresh worker; returns samples closed."""
        closed = 0
        if w.task is not None:
            results[w.task], statuses[w.task] = value, status
            closed = 1
        self._kill(w)
        self._workers[self._workers.index(w)] = self._spawn()
        return closed

    def close(self) -> None:
        """Stop all workers (idle ones politely, busy ones by force)."""
        for w in self._workers:
            try:
                if w.task is None:
                    w.conn.send(None)
                    w.proc.join(timeout=2)
            except (OSError, BrokenPipeError):
                pass
            self._kill(w)
        self._workers = []

    def __del__(self) -> None:  # best effort; workers are daemons and die with the parent anyway
        try:
            self.close()
        except Exception:
            pass
