"""verl 0.9's v1 off-policy sampler rule (``trainer.v1.sampler.max_off_policy_threshold`` /
``max_off_policy_strategy``) for the fully async driver under ``trainer.v1.trainer_mode=separate_async``. Pure
functions (no torch, no Ray).

verl (``verl/trainer/ppo/v1/replay_buffer.py``, ``ReplayBufferAsync``): a prompt group's *span* is ``training step -
step its prompt was dispatched at + 1``, the model versions from its generation's start to its training; with
``drop`` a finished group whose span exceeds the threshold is evicted (never trained; verl counts it in
``training/off_policy/evicted_samples`` and its spans in ``.../evicted_samples_staleness/{mean,max,min}``) and one
prompt per evicted group is generated in its place; with ``wait`` nothing is evicted: sampling blocks while an
in-flight group has reached the threshold so that it finishes and is trained.

Here, under separate_async (one weight push per step), a group's queue version is the version of its earliest token
and the step trains with version ``current``: span = ``current - version + 1``, the same count. ``wait`` is what the
fully async trainer already does (it takes groups in loader order, so it never trains a newer group while an older
one is in flight): no eviction. ``drop``: :func:`stale_groups` picks the groups to evict; the trainer regenerates
their prompts with the current weights (:meth:`rlhf_core.trainer.fully_async.FullyAsyncTrainer._evict_stale`).
"""
from __future__ import annotations

from typing import Sequence


def spans(versions: Sequence[int], current: int) -> list[int]:
    """Per group, the versions from its earliest token's (``versions[i]``) to the training one, both counted:
    ``current - versions[i] + 1`` (1 = generated and trained by the same weights)."""
    return [current - int(v) + 1 for v in versions]


def stale_groups(versions: Sequence[int], current: int, threshold: int, strategy: str) -> list[int]:
    """Indices of the groups verl's ``drop`` evicts: span (:func:`spans`) > ``threshold``; none for ``wait``.

    Raises:
        ValueError: ``threshold`` < 1 or ``strategy`` not ``drop`` / ``wait`` (verl asserts both).
    """
    if not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"max_off_policy_threshold={threshold!r} must be an integer >= 1")
    if strategy not in ("drop", "wait"):
        raise ValueError(f"max_off_policy_strategy={strategy!r} must be 'drop' or 'wait'")
    if strategy == "wait":
        return []
    return [i for i, s in enumerate(spans(versions, current)) if s > threshold]


def eviction_metrics(evicted_spans: Sequence[int]) -> dict[str, float]:
    """verl's ``training/off_policy/evicted_samples`` (groups evicted this step, 0 when none) and, when any,
    ``training/off_policy/evicted_samples_staleness/{mean,max,min}`` (their spans)."""
    out: dict[str, float] = {"training/off_policy/evicted_samples": len(evicted_spans)}
    if evicted_spans:
        out.update({"training/off_policy/evicted_samples_staleness/mean": sum(evicted_spans) / len(evicted_spans),
                    "training/off_policy/evicted_samples_staleness/max": max(evicted_spans),
                    "training/off_policy/evicted_samples_staleness/min": min(evicted_spans)})
    return out
