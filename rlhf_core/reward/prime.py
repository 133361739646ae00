"""The ``prime`` reward manager: score a batch in a process pool with a per-sample timeout.

Mirrors verl's ``PrimeRewardManager`` (``verl/workers/reward_manager/prime.py``): same inputs and outputs as
``naive``, but scoring runs in worker processes; a sample whose scorer raises, crashes the worker or runs past
``timeout_s`` (default 300 s, as verl) scores 0 instead of failing or hanging the step. Unlike verl, a hung
worker is killed and replaced on its own (verl kills the whole pool) and the clock starts when the sample
reaches a worker, not when it was queued.

Besides the scorer's own extras, ``reward_extra_info`` always carries ``reward_timeout`` and ``reward_error``
(per-sample 0/1), and the manager keeps running totals ``num_timeouts`` / ``num_errors``.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from rlhf_core.protocol import Batch
from rlhf_core.reward.managers import DecodedSample, RewardManagerBase, register
from rlhf_core.reward.pool import ERROR, TIMEOUT, ScorerPool

logger = logging.getLogger(__name__)


@register("prime")
class PrimeRewardManager(RewardManagerBase):
    """Args: :class:`RewardManagerBase`'s (``tokenizer``, ``num_examine``, ``compute_score``, ``reward_fn_key``),
    then, by keyword, ``timeout_s`` per sample (seconds) and ``num_processes`` (default ``min(8, cpu_count)``).
    The pool starts on the first call and lives until :meth:`close`."""

    def __init__(self, *args: Any, timeout_s: float = 300.0, num_processes: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_s = float(timeout_s)
        self.num_processes = int(num_processes or min(8, os.cpu_count() or 1))
        self.num_timeouts = 0
        self.num_errors = 0
        self._pool: ScorerPool | None = None

    def score_samples(self, samples: list[DecodedSample]) -> list[Any]:
        if self._pool is None:
            self._pool = ScorerPool(self.compute_score, self.num_processes, self.timeout_s)
        kwargs = [
            dict(
                data_source=s.data_source,
                solution_str=s.response_str,
                ground_truth=s.ground_truth,
                extra_info=s.extra_info,
            )
            for s in samples
        ]
        results, statuses = self._pool.map(kwargs)
        self._last_statuses = statuses
        n_timeout, n_error = statuses.count(TIMEOUT), statuses.count(ERROR)
        self.num_timeouts += n_timeout
        self.num_errors += n_error
        if n_timeout or n_error:
            first_error = next((r for r, s in zip(results, statuses) if s == ERROR), None)
            logger.warning(
                "prime reward: %d of %d samples timed out (> %.0f s) and %d failed (scored 0); first error: %s",
                n_timeout, len(samples), self.timeout_s, n_error, first_error,
            )
        return [r if s not in (TIMEOUT, ERROR) else 0.0 for r, s in zip(results, statuses)]

    def __call__(self, batch: Batch, return_dict: bool = False) -> Any:
        self._last_statuses = None
        out = super().__call__(batch, return_dict=True)
        statuses = self._last_statuses
        if statuses is not None:  # not a precomputed rm_scores batch
            extra = out["reward_extra_info"]
            if "score" in extra:  # a failed sample has no dict: keep the 'score' list consistent
                extra["score"] = [0.0 if s in (TIMEOUT, ERROR) else v for v, s in zip(extra["score"], statuses)]
            extra["reward_timeout"] = [int(s == TIMEOUT) for s in statuses]
            invalid = extra.get("reward_error") or [0] * len(statuses)  # a returned None / NaN / inf
            extra["reward_error"] = [int(s == ERROR or bool(bad)) for s, bad in zip(statuses, invalid)]
        return out if return_dict else out["reward_tensor"]

    def __getstate__(self) -> dict:
        """Pickle without the pool (e.g. to send the manager to a Ray actor); it restarts on the next call."""
        return {**self.__dict__, "_pool": None}

    def close(self) -> None:
        """Stop the worker processes."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


__all__ = ["PrimeRewardManager"]
