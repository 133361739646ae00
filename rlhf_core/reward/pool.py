"""A process pool that scores samples with a per-sample timeout, on ``pebble``'s ``ProcessPool``.

Used by the ``prime`` reward manager. Why pebble and not ``concurrent.futures.ProcessPoolExecutor``: the latter
cannot stop one hung task, and a timeout measured from submission (what verl's ``prime`` does) penalises samples
that merely waited in the queue. ``pebble.ProcessPool.schedule(..., timeout=)`` starts each sample's clock when a
worker picks it up, terminates a worker past it and starts a fresh one; a worker that dies (``os._exit``, a
segfault, the OOM killer) is replaced as well. Such a sample is reported as ``"timeout"`` or ``"error"`` and the
caller scores it 0 (SEMANTICS: never a hung step); the other samples are scored normally.

Workers are ``spawn``-ed (no forked torch/CUDA state) and import nothing heavy. The scorer is pickled once and
unpickled once per worker (cached there), so a file-based reward function is loaded once per worker.
"""
from __future__ import annotations

import multiprocessing as mp
import pickle
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

from pebble import ProcessExpired, ProcessPool

OK, TIMEOUT, ERROR = "ok", "timeout", "error"

# worker side: pickled scorer -> the scorer (one entry per distinct scorer this worker has seen)
_SCORERS: dict[bytes, Callable[..., Any]] = {}


def _score(scorer_blob: bytes, kwargs: dict) -> Any:
    """Runs in a worker: ``scorer(**kwargs)``, with the scorer unpickled on its first use in this worker."""
    scorer = _SCORERS.get(scorer_blob)
    if scorer is None:
        scorer = _SCORERS[scorer_blob] = pickle.loads(scorer_blob)
    return scorer(**kwargs)


class ScorerPool:
    """``num_processes`` spawn workers calling ``scorer(**kwargs)``; reused across :meth:`map` calls.

    Args:
        scorer: a picklable callable (a module-level function or a
            :class:`~rlhf_core.reward.custom.FileRewardFunction`).
        num_processes: worker count (>= 1).
        timeout_s: per-sample limit in seconds, counted from when a worker picks the sample up.

    Raises:
        TypeError: when ``scorer`` cannot be pickled.
        ValueError: when ``num_processes < 1`` or ``timeout_s <= 0``.
    """

    def __init__(self, scorer: Callable[..., Any], num_processes: int = 4, timeout_s: float = 300.0) -> None:
        if num_processes < 1 or timeout_s <= 0:
            raise ValueError(f"need num_processes >= 1 and timeout_s > 0, got {num_processes}, {timeout_s}")
        try:
            self._scorer_blob = pickle.dumps(scorer)
        except Exception as exc:
            raise TypeError(
                f"the prime reward manager needs a picklable reward function (a module-level function or a "
                f"custom_reward_function file); {scorer!r} is not: {exc}"
            ) from exc
        self.scorer, self.num_processes, self.timeout_s = scorer, num_processes, float(timeout_s)
        self._pool: ProcessPool | None = None

    def map(self, kwargs_list: list[dict]) -> tuple[list[Any], list[str]]:
        """Score every ``kwargs`` dict; returns ``(results, statuses)`` in input order.

        ``statuses[i]`` is ``"ok"`` (``results[i]`` is the scorer's return value), ``"timeout"`` (``results[i]`` is
        ``None``) or ``"error"`` (``results[i]`` is the error text: the scorer raised, its worker died, or the
        arguments could not be sent). Each sample takes at most about ``timeout_s`` once a worker has it.
        """
        if self._pool is None or not self._pool.active:
            self._pool = ProcessPool(max_workers=self.num_processes, context=mp.get_context("spawn"))
        futures = [self._pool.schedule(_score, args=(self._scorer_blob, kwargs), timeout=self.timeout_s)
                   for kwargs in kwargs_list]
        results: list[Any] = []
        statuses: list[str] = []
        for future in futures:
            try:
                results.append(future.result())
                statuses.append(OK)
            except FutureTimeout:
                results.append(None)
                statuses.append(TIMEOUT)
            except ProcessExpired as exc:
                results.append(f"reward worker died (exit code {exc.exitcode})")
                statuses.append(ERROR)
            except Exception as exc:  # noqa: BLE001 - a scorer's failure must not fail the step
                results.append(f"{type(exc).__name__}: {exc}")
                statuses.append(ERROR)
        return results, statuses

    def close(self) -> None:
        """Stop all workers (busy ones by force)."""
        if self._pool is not None:
            self._pool.stop()
            self._pool.join(timeout=10)
            self._pool = None

    def __del__(self) -> None:  # best effort; pebble's workers are daemons and die with the parent anyway
        try:
            self.close()
        except Exception:
            pass
