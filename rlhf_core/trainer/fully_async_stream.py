"""Prompt-by-prompt streaming for ``async_training.mode=fully_async``: the rollouter's sub-batches, its per-prompt
groups and the trainer's step assembled from groups. Pure functions (torch tensors, no Ray, no threads).

verl 0.9's rollouter (``FullyAsyncRollouter``) draws one prompt at a time (``data.gen_batch_size=1``), keeps up to
``max_concurrent_samples = active replicas × async_training.concurrent_samples_per_replica`` prompts in flight
(capped at ``max_required_samples``) and puts each finished prompt with its ``rollout.n`` responses (a
``RolloutSample``, one *group*) into the message queue; its trainer takes ``ppo_mini_batch_size ×
require_batches`` groups per step, whatever parameter versions generated them.

Here the loader still draws batches of ``data.train_batch_size`` = ``required_samples`` prompts (one trainer step's;
the config check holds them equal). The rollouter cuts each into *sub-batches* of at most
:func:`sub_batch_size` prompts (``k``). On the HF engine without agent loops it submits them to continuous batching
and queues each prompt's group as soon as its last response ends (``fully_async_rollouter.py``); otherwise it
generates one sub-batch at a time as one batched call (a slot freed by a short response is not refilled until the
sub-batch ends) and queues each prompt's group when its sub-batch is done; either way tagged with the version of its
earliest token. A parameter sync between two sub-batches of one loader batch gives that batch's groups
different versions, so a step trains groups of several versions (each response's ``min_global_steps`` /
``max_global_steps`` record them, ``rlhf_core/trainer/response_versions.py``).

Step boundaries stay loader-batch boundaries: the queue is first in, first out, one rollouter thread fills it in
loader order, and every loader batch holds exactly ``required_samples`` groups, so the ``required_samples`` groups a
step takes are one loader batch's (:func:`assemble_step` checks it and raises otherwise, e.g. after a dropped
sample). A checkpoint therefore still records a loader position between batches and a resumed run trains every
prompt once (no position inside a batch is needed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from rlhf_core.protocol import Batch


def sub_batch_size(rollout_ranks: int, concurrent_samples_per_replica: int, required_samples: int) -> int:
    """``k``, prompts the rollouter generates at once: verl's ``max_concurrent_samples`` = ``rollout_ranks`` (each
    rollout rank is one HF engine replica) × ``concurrent_samples_per_replica``, capped at ``required_samples`` (a
    sub-batch stays inside one loader batch; verl caps at ``max_required_samples`` ≥ ``required_samples``).
    Every sub-batch's rows split evenly over the rollout ranks when ``required_samples × rollout.n`` does (checked
    when the config loads): ``k`` is either ``required_samples`` or a multiple of ``rollout_ranks``, and the
    remainder ``required_samples mod k`` then differs from ``required_samples`` by a multiple of ``rollout_ranks``.

    Raises:
        ValueError: any argument < 1.
    """
    if min(rollout_ranks, concurrent_samples_per_replica, required_samples) < 1:
        raise ValueError(f"rollout_ranks={rollout_ranks}, concurrent_samples_per_replica="
                         f"{concurrent_samples_per_replica} and required_samples={required_samples} must be >= 1")
    return min(rollout_ranks * concurrent_samples_per_replica, required_samples)


def sub_batch_bounds(prompts: int, k: int) -> list[tuple[int, int]]:
    """``[start, end)`` prompt ranges of one loader batch of ``prompts`` prompts cut into sub-batches of ``k`` (the
    last may be shorter), e.g. ``(6, 4)`` → ``[(0, 4), (4, 6)]``."""
    return [(s, min(s + k, prompts)) for s in range(0, prompts, k)]


def queue_unit(k: int, required_samples: int) -> int:
    """The granularity (samples) in which the rollouter acquires staleness budget: sub-batches of ``k`` and the
    loader batch's remainder ``required_samples mod k`` are all multiples of ``gcd(k, required_samples)``; this is
    the ``chunk`` of :func:`~rlhf_core.trainer.fully_async_queue.max_staleness` (a finer unit only loosens that
    upper bound)."""
    return math.gcd(k, required_samples)


@dataclass
class Group:
    """One prompt's ``rollout.n`` responses as the rollouter queues them (verl's ``RolloutSample``).

    Attributes:
        batch: the group's rows (``n`` rows, with ``min_global_steps`` / ``max_global_steps``).
        epoch: the loader epoch of its prompt.
        loader_batch: index (0-based, counted from the rollouter's start) of the loader batch it came from.
        seconds: the generation seconds of its sub-batch, on the sub-batch's last group only (0.0 on the others), so
            the groups of a step sum to the seconds of its sub-batches.
        position: the loader's ``state_dict()`` right after its loader batch was drawn.
        prompt: its prompt's row (with ``uid``) as drawn, to generate it again (verl's v1 ``drop``,
            :mod:`rlhf_core.trainer.off_policy_sampler`); None when not kept.
        index: its prompt's index in its loader batch (groups may be queued in finishing order; a step puts them
            back in loader order).
    """
    batch: Batch
    epoch: int
    loader_batch: int
    seconds: float
    position: Any
    prompt: Batch | None = None
    index: int = 0


def split_groups(batch: Batch, n: int) -> list[Batch]:
    """The ``len(batch) // n`` groups of a generated sub-batch whose rows are ``rollout.n`` = ``n`` consecutive
    responses per prompt (``repeat_interleave``). Per-row lists in ``meta`` (``global_token_num``) follow the rows.

    Raises:
        ValueError: ``len(batch)`` not a multiple of ``n``, or the rows of one group carry different ``uid``s.
    """
    if n < 1 or len(batch) % n:
        raise ValueError(f"a sub-batch of {len(batch)} rows is not whole groups of rollout.n={n}")
    groups = []
    for start in range(0, len(batch), n):
        group = batch.index(slice(start, start + n))
        for key, value in batch.meta.items():
            if isinstance(value, list) and len(value) == len(batch):
                group.meta[key] = value[start:start + n]
        if "uid" in group.non_tensors and len(set(group.non_tensors["uid"].tolist())) != 1:
            raise ValueError(f"rows {start}..{start + n - 1} of the sub-batch are not one prompt's group "
                             f"(uids {sorted(set(group.non_tensors['uid'].tolist()))})")
        groups.append(group)
    return groups


def assemble_step(groups: Sequence[Group], required_samples: int) -> tuple[Batch, int, Any, float]:
    """One trainer step from ``required_samples`` queued groups: (the rows concatenated in queue order, its epoch,
    the loader position a checkpoint of the step records, the generation seconds of its sub-batches).

    ``meta`` is the first group's with ``global_token_num`` recomputed over all rows (``attention_mask`` sums).

    Raises:
        RuntimeError: not ``required_samples`` groups, or groups of more than one loader batch (a sample was
            dropped or the queue lost order: training on would skip or repeat prompts).
    """
    if len(groups) != required_samples:
        raise RuntimeError(f"the fully async rollouter ended inside a step: {len(groups)} of {required_samples} "
                           "groups queued")
    batches = sorted({g.loader_batch for g in groups})
    if len(batches) != 1:
        raise RuntimeError(f"a fully async step took groups of loader batches {batches}; a step must be one loader "
                           "batch (a dropped or reordered sample would skip or repeat prompts on resume)")
    groups = sorted(groups, key=lambda g: g.index)  # loader order (stable: the sub-batch path's are in order)
    batch = Batch.concat([g.batch for g in groups])
    batch.meta = dict(groups[0].batch.meta)
    if "attention_mask" in batch:
        batch.meta["global_token_num"] = batch["attention_mask"].sum(-1).tolist()
    return batch, groups[-1].epoch, groups[-1].position, sum(g.seconds for g in groups)
