"""DAPO dynamic sampling (``algorithm.filter_groups``): keep only prompt groups whose rewards differ.

DAPO (Yu et al. 2025, arXiv:2503.14476, §3.2 and Eq. 11) drops every prompt whose ``rollout.n`` samples all get the
same reward (all right or all wrong): with GRPO their advantages are all zero, so they add no gradient but dilute the
batch. Gen batches of ``data.gen_batch_size`` prompts are generated and scored until ``data.train_batch_size`` groups
have been kept; the kept rows are then cut to exactly ``train_batch_size × n`` (the surplus is discarded, not carried
to the next step, as in verl's DAPO trainer, so a checkpoint after a step holds no half-built batch and resumes
exactly from the dataloader position). ``max_num_gen_batches`` (> 0) bounds the gen batches of one step.

The trainer calls :func:`collect_kept_groups`; :func:`metric_values` and :func:`kept_group_rows` are the pure parts.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterator

import numpy as np

from rlhf_core.protocol import Batch

logger = logging.getLogger(__name__)

# metric names read from the reward tensors rather than from the reward manager's reward_extra_info
SCORE_METRICS = ("reward", "seq_reward")  # Σ_t token_level_scores (verl 0.9 "reward": the canonical pre-KL reward)
FINAL_REWARD_METRIC = "seq_final_reward"  # Σ_t token_level_rewards (= scores here: no KL penalty before filtering)


class OutOfData(RuntimeError):
    """The train dataloader ran out while a step was still collecting groups: that step is not trained."""


def metric_values(batch: Batch, metric: str) -> np.ndarray:
    """The per-sample value whose spread within a group decides whether the group is kept.

    Args:
        batch: scored rollouts with ``token_level_scores (B, T)`` float32 and the reward manager's
            ``reward_extra_info`` columns as non-tensors (each ``(B,)``).
        metric: ``reward`` / ``seq_reward`` (Σ_t token_level_scores), ``seq_final_reward`` (Σ_t token_level_rewards,
            which before the KL penalty are the scores: verl's DAPO trainer sets them equal when
            ``use_kl_in_reward`` is off) or the name of a ``reward_extra_info`` column (``acc``, ``score``, ...).
    Returns:
        ``(B,)`` float64.
    Raises:
        ValueError: ``metric`` is neither a built-in name nor a column of the batch (naming the columns there), or
            a column value is not a number.
    """
    if metric in SCORE_METRICS or metric == FINAL_REWARD_METRIC:
        column = "token_level_rewards" if metric == FINAL_REWARD_METRIC and "token_level_rewards" in batch \
            else "token_level_scores"
        return batch[column].double().sum(-1).numpy()
    if metric not in batch.non_tensors:
        raise ValueError(f"algorithm.filter_groups.metric={metric!r} is not a reward_extra_info field of the reward "
                         f"manager's output; it has {sorted(batch.non_tensors)} (or use one of "
                         f"{list(SCORE_METRICS) + [FINAL_REWARD_METRIC]})")
    try:
        return np.asarray(batch.non_tensors[metric], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"algorithm.filter_groups.metric={metric!r}: its values are not numbers ({exc})") from exc


def kept_group_rows(uids: np.ndarray, values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Which groups DAPO keeps: those with more than one sample whose ``values`` have a nonzero (population) std,
    and every single-sample group (``rollout.n = 1``: nothing to compare, kept as verl keeps it).

    Args:
        uids: ``(B,)`` the group (prompt) id of each row.
        values: ``(B,)`` float, the metric of each row (:func:`metric_values`).
    Returns:
        (the kept uids in order of first appearance, the ``(K,)`` int64 indices of their rows in batch order).
    Raises:
        ValueError: ``uids`` and ``values`` differ in length.
    """
    if len(uids) != len(values):
        raise ValueError(f"{len(uids)} uids but {len(values)} metric values")
    by_uid: dict[str, list[float]] = {}
    for uid, value in zip(uids, values):
        by_uid.setdefault(str(uid), []).append(float(value))
    kept = [uid for uid, vals in by_uid.items() if len(vals) == 1 or float(np.std(vals)) > 0.0]
    kept_set = set(kept)
    rows = np.asarray([i for i, uid in enumerate(uids) if str(uid) in kept_set], dtype=np.int64)
    return kept, rows


def collect_kept_groups(first: Batch, more: Iterator[Batch], rollout: Callable[[Batch], Batch], metric: str,
                        train_batch_size: int, n: int, max_num_gen_batches: int) -> tuple[Batch, dict[str, float]]:
    """Generate and score gen batches until ``train_batch_size`` groups are kept; return exactly those groups' rows.

    Args:
        first: the step's first gen batch of prompts (one row per prompt).
        more: the following gen batches of prompts (the train dataloader, across epochs).
        rollout: prompts → scored rollouts (``uid``, ``n`` rows per prompt, ``token_level_scores``).
        metric: ``algorithm.filter_groups.metric``.
        train_batch_size, n: ``data.train_batch_size`` and ``rollout.n``; the result has ``train_batch_size × n`` rows
            (the first kept groups, in generation order).
        max_num_gen_batches: ``algorithm.filter_groups.max_num_gen_batches``; 0 = no limit.
    Returns:
        (the batch, ``{"train/num_gen_batches": gen batches used, "train/num_kept_groups": groups kept before the
        cut, "train/num_gen_groups": groups generated}``).
    Raises:
        RuntimeError: ``max_num_gen_batches`` gen batches were used without a full batch.
        OutOfData: ``more`` ended first.
    """
    kept_parts: list[Batch] = []
    num_kept = num_gen_batches = num_groups = 0
    prompts: Batch | None = first
    while True:
        scored = rollout(prompts)
        num_gen_batches += 1
        groups, rows = kept_group_rows(scored["uid"], metric_values(scored, metric))
        num_groups += len(set(str(u) for u in scored["uid"]))
        num_kept += len(groups)
        if len(rows):
            kept_parts.append(scored.index(rows))
        if num_kept >= train_batch_size:
            break
        if 0 < max_num_gen_batches <= num_gen_batches:
            raise RuntimeError(
                f"algorithm.filter_groups.max_num_gen_batches={max_num_gen_batches} gen batches kept only {num_kept} of "
                f"the data.train_batch_size={train_batch_size} prompt groups with a nonzero spread of {metric!r}: the "
                f"data may be too hard or too easy; raise max_num_gen_batches (0 = no limit)")
        logger.info("dynamic sampling: %d of %d groups kept after %d gen batches; generating more",
                    num_kept, train_batch_size, num_gen_batches)
        prompts = next(more, None)
        if prompts is None:
            raise OutOfData(f"the train data ran out after {num_gen_batches} gen batches with {num_kept} of "
                            f"data.train_batch_size={train_batch_size} groups kept")
    batch = Batch.concat(kept_parts).index(slice(0, train_batch_size * n))
    batch.meta["global_token_num"] = batch["attention_mask"].sum(-1).tolist()
    return batch, {"train/num_gen_batches": float(num_gen_batches), "train/num_kept_groups": float(num_kept),
                   "train/num_gen_groups": float(num_groups)}


def train_batches(loader, n_epochs: int) -> Iterator[tuple[int, Batch]]:
    """``(epoch, batch)`` from ``loader`` (a :class:`~rlhf_core.data.loader.ResumableDataLoader`) from its saved
    position to the end of epoch ``n_epochs - 1``. The epoch is the loader's own, not ``global_steps // len(loader)``:
    with dynamic sampling a step consumes several batches."""
    while loader.epoch < n_epochs:
        epoch = loader.epoch
        for batch in loader:
            yield epoch, batch
        if loader.epoch == epoch:  # an epoch that yielded nothing (a sampler that is empty): stop, do not spin
            return


def prompts_per_batch(config) -> int:
    """Prompts per train dataloader batch: ``data.gen_batch_size`` (null = ``data.train_batch_size``) with
    ``algorithm.filter_groups.enable``, else ``data.train_batch_size`` (a ``gen_batch_size`` without filtering is
    read by nothing, and said so)."""
    data = config.data
    if not config.algorithm.filter_groups.enable:
        if data.gen_batch_size is not None and int(data.gen_batch_size) != int(data.train_batch_size):
            logger.warning("data.gen_batch_size=%s has no effect without algorithm.filter_groups.enable=True: each "
                           "step generates data.train_batch_size=%s prompts", data.gen_batch_size,
                           data.train_batch_size)
        return int(data.train_batch_size)
    return int(data.train_batch_size if data.gen_batch_size is None else data.gen_batch_size)
