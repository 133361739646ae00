"""The ``remote`` reward manager (verl 0.9 ``RemoteRewardManager``): score each sample in separate processes.

verl 0.9 runs ``compute_score`` in ``reward.num_workers`` Ray actors, handing samples to them in turn, because some
scorers (math-verify) misbehave in a thread pool and CPU-heavy scoring scales better in processes. "Remote" is a
process, not a network endpoint. Here the processes are :class:`~rlhf_core.reward.pool.ScorerPool`'s (as
``prime``): ``reward.num_workers`` spawned workers, a per-sample ``timeout_s`` (verl has none: a hung scorer hangs
its step; here it scores 0), and a failed sample scores 0 with ``reward_error`` (verl's actor call raises).

As verl's, a scorer returning a plain number also gets that number as the ``acc`` extra (a dict result keeps its
own keys).
"""
from __future__ import annotations

from typing import Any

from rlhf_core.reward.managers import DecodedSample, ScoreFailure, register
from rlhf_core.reward.prime import PrimeRewardManager


def with_acc(result: Any) -> Any:
    """verl 0.9's reward-loop managers: a plain number ``r`` is reported as ``{"score": r, "acc": r}``; a dict or a
    :class:`ScoreFailure` is returned as is."""
    if isinstance(result, (dict, ScoreFailure)) or result is None or isinstance(result, (str, bytes)):
        return result
    return {"score": result, "acc": result}


@register("remote")
class RemoteRewardManager(PrimeRewardManager):
    """Args: :class:`~rlhf_core.reward.prime.PrimeRewardManager`'s; ``num_processes`` comes from
    ``reward.num_workers`` (:meth:`config_kwargs`)."""

    @staticmethod
    def config_kwargs(config: Any) -> dict[str, Any]:
        """The manager's keyword arguments from the config: ``num_processes=reward.num_workers``, or
        ``reward_model.num_workers`` when that is set (verl 0.9.1 moves it over ``reward.num_workers``)."""
        legacy = config.reward_model.num_workers
        return {"num_processes": int(config.reward.num_workers if legacy is None else legacy)}

    def score_samples(self, samples: list[DecodedSample]) -> list[Any]:
        return [with_acc(r) for r in super().score_samples(samples)]


__all__ = ["RemoteRewardManager", "with_acc"]
