"""Per-response parameter versions of the off-policy drivers (one-step, fully async) and the staleness metrics
computed from them.

Each generated response carries, in the batch, the parameter version (syncs of the actor's weights to the rollout
group so far) under which its first and its last token were sampled: ``min_global_steps`` and ``max_global_steps``,
``(B,)`` int64 tensors, verl 0.9's per-sample names (its agent loop's ``extra_fields``, read by
``verl/experimental/fully_async_policy/detach_utils.py`` and ``verl/trainer/ppo/v1/trainer_base.py``). Without a
partial rollout both are the version that generated the response; a partial rollout that a sync interrupted and
resumed has ``max = min + (syncs in its course)``.

From them a step trained at version ``current`` logs verl's names:

* ``training/off_policy/trajectory_spans/{mean,max,min}``: ``max - min + 1`` (1: one version made the response);
* ``training/off_policy/trajectory_staleness/{mean,max,min}``: ``current - max`` (the lag of its newest tokens);
* ``training/off_policy/trajectory_staleness_worst/{mean,max,min}``: ``current - min`` (of its oldest tokens);
* ``fully_async/partial/{total_partial_num,partial_ratio,max_partial_span}``: responses with ``max != min``, their
  share, the largest ``max - min``;
* the count of stale trajectories of the batch (verl's ``stale_trajectory_processed`` increment: ``current - max
  >= 1``), returned apart since the drivers log it cumulated.

verl's v1 trainer writes ``(global_steps - 1) - max_global_steps``: its ``global_steps - 1`` is the version being
updated, our ``current``.
"""
from __future__ import annotations

from typing import Sequence

import torch

from rlhf_core.protocol import Batch

MIN_KEY = "min_global_steps"
MAX_KEY = "max_global_steps"


def _per_row(value: torch.Tensor | int, n: int) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.long)
    return t.expand(n).clone() if t.dim() == 0 else t.clone()


def tag_versions(batch: Batch, start: torch.Tensor | int, end: torch.Tensor | int | None = None) -> Batch:
    """Set ``min_global_steps`` / ``max_global_steps`` ``(B,)`` int64 on ``batch`` (in place; returned): ``start``
    and ``end`` are per-response tensors or one version for every row (``end`` defaults to ``start``).

    Raises:
        ValueError: a tensor whose length is not the batch's, or ``end < start`` in some row.
    """
    n = len(batch)
    lo = _per_row(start, n)
    hi = lo.clone() if end is None else _per_row(end, n)
    if lo.shape != (n,) or hi.shape != (n,):
        raise ValueError(f"response versions: {tuple(lo.shape)} / {tuple(hi.shape)} for a batch of {n} rows")
    if bool((hi < lo).any()):
        row = int((hi < lo).nonzero()[0])
        raise ValueError(f"response versions: row {row} ends at version {int(hi[row])} before it starts "
                         f"({int(lo[row])})")
    batch.tensors[MIN_KEY], batch.tensors[MAX_KEY] = lo, hi
    return batch


def segment_versions(versions: Sequence[int], last_segment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A partial rollout's ``(min, max)`` per response: ``versions[g]`` is the version segment ``g`` ran under,
    ``last_segment (B,)`` int64 the segment of each response's last token (every response starts in segment 0:
    ``rlhf_core/workers/rollout/hf_partial.py``). E.g. versions ``[3, 4]``, last segments ``[0, 1]`` → min
    ``[3, 3]``, max ``[3, 4]``."""
    table = torch.tensor(list(versions), dtype=torch.long)
    last = torch.as_tensor(last_segment, dtype=torch.long)
    return table[torch.zeros_like(last)], table[last]


def _stats(name: str, x: torch.Tensor) -> dict[str, float]:
    x = x.double()
    return {f"{name}/mean": float(x.mean()), f"{name}/max": float(x.max()), f"{name}/min": float(x.min())}


def version_metrics(batch: Batch, current: int, partial: bool) -> tuple[dict[str, float], int]:
    """The step's staleness metrics (module docstring) of a batch tagged by :func:`tag_versions`, trained at
    version ``current``; ``partial`` adds ``fully_async/partial/*``. Returns (metrics, stale trajectories in the
    batch). An untagged or empty batch gives ``({}, 0)``."""
    if MIN_KEY not in batch.tensors or len(batch) == 0:
        return {}, 0
    lo, hi = batch.tensors[MIN_KEY], batch.tensors[MAX_KEY]
    metrics = {**_stats("training/off_policy/trajectory_spans", hi - lo + 1),
               **_stats("training/off_policy/trajectory_staleness", current - hi),
               **_stats("training/off_policy/trajectory_staleness_worst", current - lo)}
    if partial:
        span = hi - lo
        n_partial = int((span != 0).sum())
        metrics.update({"fully_async/partial/total_partial_num": n_partial,
                        "fully_async/partial/partial_ratio": n_partial / len(span),
                        "fully_async/partial/max_partial_span": int(span.max())})
    return metrics, int(((current - hi) >= 1).sum())
