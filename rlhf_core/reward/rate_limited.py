"""The ``rate_limited`` reward manager (verl 0.9 ``RateLimitedRewardManager``): reward calls under API limits.

For scorers that call a paid or shared service (an LLM judge), three limits, as verl's, all from ``reward.*``:

* ``max_concurrent`` calls run at once (a semaphore);
* ``max_rpm`` calls start per minute: a token bucket refilled at ``max_rpm / 60`` per second holding at most one
  second's worth (so a burst of ``max_rpm / 60`` calls, then one every ``60 / max_rpm`` s);
* ``max_tpm`` tokens per minute, each call counted as ``estimated_tokens_per_request`` tokens (a second bucket).

A call past ``timeout`` seconds, or one that raises, scores 0 (``reward_error``; verl logs it and scores 0 too);
an ``async def`` scorer is awaited, a plain one runs in a thread (at most ``max_concurrent`` threads). A timed-out
plain scorer's thread cannot be stopped: it runs on in the background and its result is dropped. A plain-number
result also becomes the ``acc`` extra (verl). The buckets live with the manager, so limits hold across batches.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from rlhf_core.reward.managers import DecodedSample, RewardManagerBase, ScoreFailure, register
from rlhf_core.reward.remote import with_acc
from rlhf_core.reward.scorers import UnknownDataSourceError


class TokenBucket:
    """A token bucket: ``rate`` tokens per second, at most ``capacity`` stored, full at the start.

    :meth:`reserve` takes tokens now and returns how long the caller must wait before using them; the balance may go
    negative, so reservations are served in order, each ``n / rate`` seconds after the previous once the stored
    tokens are spent (the schedule of verl's ``AsyncTokenBucket``).

    Args:
        rate: tokens per second (> 0). capacity: the most tokens stored (> 0; verl: ``rate``).
        clock: seconds, monotonic (``time.monotonic``; a fake in tests).
    Raises:
        ValueError: ``rate`` or ``capacity`` not positive.
    """

    def __init__(self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError(f"a token bucket needs rate > 0 and capacity > 0, got {rate}, {capacity}")
        self.rate, self.capacity, self.clock = float(rate), float(capacity), clock
        self.tokens = float(capacity)
        self.last = clock()

    def reserve(self, n: float = 1.0) -> float:
        """Take ``n`` tokens; returns the seconds to wait (0 when they were stored)."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= n
        return max(0.0, -self.tokens / self.rate)


def per_minute_bucket(per_minute: int | None) -> TokenBucket | None:
    """verl's limiter for ``per_minute`` (rpm or tpm): rate and capacity ``per_minute / 60``; None = no limit."""
    return None if per_minute is None else TokenBucket(per_minute / 60.0, per_minute / 60.0)


@register("rate_limited")
class RateLimitedRewardManager(RewardManagerBase):
    """Args: :class:`RewardManagerBase`'s, then by keyword ``max_concurrent``, ``max_rpm``, ``max_tpm``,
    ``estimated_tokens_per_request``, ``timeout`` (the ``reward.*`` keys of the same names, :meth:`config_kwargs`).

    Raises:
        ValueError: ``max_concurrent < 1`` or ``timeout <= 0``.
    """

    def __init__(self, *args: Any, max_concurrent: int = 1, max_rpm: int | None = None, max_tpm: int | None = None,
                 estimated_tokens_per_request: int = 2000, timeout: float = 300.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if max_concurrent < 1 or timeout <= 0:
            raise ValueError(f"rate_limited reward manager: reward.max_concurrent={max_concurrent} must be >= 1 and "
                             f"reward.timeout={timeout} > 0")
        self.max_concurrent, self.timeout = int(max_concurrent), float(timeout)
        self.tokens_per_request = float(estimated_tokens_per_request)
        self.rpm, self.tpm = per_minute_bucket(max_rpm), per_minute_bucket(max_tpm)
        self.is_async = inspect.iscoroutinefunction(self.compute_score)

    @staticmethod
    def config_kwargs(config: Any) -> dict[str, Any]:
        """The manager's keyword arguments from ``reward.{max_concurrent,max_rpm,max_tpm,
        estimated_tokens_per_request,timeout}``."""
        r = config.reward
        return {"max_concurrent": int(r.max_concurrent), "max_rpm": r.max_rpm, "max_tpm": r.max_tpm,
                "estimated_tokens_per_request": int(r.estimated_tokens_per_request), "timeout": float(r.timeout)}

    def score_samples(self, samples: list[DecodedSample]) -> list[Any]:
        executor = ThreadPoolExecutor(max_workers=self.max_concurrent, thread_name_prefix="rate_limited_reward")
        try:
            return asyncio.run(self._score_all(samples, executor))
        finally:
            executor.shutdown(wait=False, cancel_futures=True)  # a timed-out scorer's thread is not waited for

    async def _score_all(self, samples: list[DecodedSample], executor: ThreadPoolExecutor) -> list[Any]:
        semaphore = asyncio.Semaphore(self.max_concurrent)
        return list(await asyncio.gather(*(self._score_one(s, semaphore, executor) for s in samples)))

    async def _call(self, kwargs: dict, executor: ThreadPoolExecutor) -> Any:
        """The scorer's result: awaited when it is ``async def`` (also behind a custom-file wrapper, whose call
        returns the coroutine), else computed in one of the ``max_concurrent`` threads."""
        if self.is_async:
            return await self.compute_score(**kwargs)
        result = await asyncio.get_running_loop().run_in_executor(executor, lambda: self.compute_score(**kwargs))
        return await result if inspect.isawaitable(result) else result

    async def _score_one(self, s: DecodedSample, semaphore: asyncio.Semaphore, executor: ThreadPoolExecutor) -> Any:
        for bucket, n in ((self.rpm, 1.0), (self.tpm, self.tokens_per_request)):
            if bucket is not None:
                await asyncio.sleep(bucket.reserve(n))
        kwargs = dict(data_source=s.data_source, solution_str=s.response_str, ground_truth=s.ground_truth,
                      extra_info=s.extra_info)
        async with semaphore:
            try:
                return with_acc(await asyncio.wait_for(self._call(kwargs, executor), self.timeout))
            except UnknownDataSourceError:
                raise
            except asyncio.TimeoutError:
                return ScoreFailure(f"timed out after {self.timeout:g} s (reward.timeout)")
            except Exception as exc:  # noqa: BLE001 - a scorer's failure scores 0 and is counted, never fails the step
                return ScoreFailure(f"{self.compute_score!r} raised {type(exc).__name__}: {exc}")


__all__ = ["RateLimitedRewardManager", "TokenBucket", "per_minute_bucket"]
