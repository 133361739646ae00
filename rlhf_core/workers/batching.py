"""Mini- and micro-batching shared by the actor and the critic (verl ``dp_actor``/``dp_critic`` loops).

* mini-batches: contiguous slices of this rank's shard (``ppo_mini_batch_size × n ÷ world``), reshuffled per
  epoch when ``shuffle`` (a ``torch.Generator`` seeded by ``data_loader_seed``, the update call and the epoch);
* micro-batches: ``micro_batch_size`` rows each, or — ``use_dynamic_bsz`` — consecutive rows packed so that the
  valid tokens of a micro-batch stay within ``max_token_len`` (order kept, so outputs concatenate back directly).
  With several ranks every rank then runs the largest rank's number of micro-batches (verl's
  ``rearrange_micro_batches`` all-reduces the count too): FSDP2 gathers and reduces parameters in every forward and
  backward, so ranks that ran different numbers of them would pair mismatched collectives and hang or fail.
* global counts: the mini-batch's valid tokens / sequences summed over this rank's micro-batches and all ranks,
  for ``agg_loss(..., global_tokens, global_seqs)`` (micro-batch- and world-size-invariant losses).
"""
from __future__ import annotations

from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from rlhf_core.protocol import Batch


def uid_runs(uids: Sequence | None, n: int) -> list[list[int]]:
    """The runs of consecutive rows with the same ``uid`` as row-index lists (each row its own run without uids)."""
    if uids is None:
        return [[i] for i in range(n)]
    runs: list[list[int]] = []
    for i in range(n):
        if runs and str(uids[i]) == str(uids[i - 1]):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def token_budget_partition(seq_lens: list[int], max_token_len: int, key: str = "max_token_len",
                           uids: Sequence | None = None) -> list[list[int]]:
    """Consecutive groups of row indices whose summed ``seq_lens`` stay ``<= max_token_len``.

    ``uids`` (``actor.use_prefix_grouper``): a run of consecutive rows with the same uid that fits the budget is
    not cut; the micro-batch closes before it instead (rows stay in order; a run longer than the budget is cut where
    it fills, and the prefix grouper then runs each piece as a smaller group). Without ``uids`` every row is its own
    run.

    Raises ``ValueError`` naming ``key`` when a single row is longer than the budget (verl asserts the same)."""
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for run in uid_runs(uids, len(seq_lens)):
        for i in run:
            if seq_lens[i] > max_token_len:
                raise ValueError(f"{key}={max_token_len} is smaller than a sequence of {seq_lens[i]} tokens; raise it "
                                 "to at least the longest prompt + response")
        tokens = sum(seq_lens[i] for i in run)
        if current and used + tokens > max_token_len >= tokens:  # the whole run fits a micro-batch of its own
            groups.append(current)
            current, used = [], 0
        for i in run:
            if current and used + seq_lens[i] > max_token_len:
                groups.append(current)
                current, used = [], 0
            current.append(i)
            used += seq_lens[i]
    if current:
        groups.append(current)
    return groups


def split_to_count(groups: list[list[int]], seq_lens: list[int], count: int,
                   uids: Sequence | None = None) -> list[list[int]]:
    """``groups`` (consecutive row indices, from :func:`token_budget_partition`) split further until there are
    ``count`` of them: each split halves, at the row boundary nearest its token midpoint, the group with the most
    tokens among those of two or more rows (the first such on a tie); with ``uids``, at the boundary between two
    uids nearest the midpoint when the group has one. Order is kept and no group grows, so every group stays within
    the budget it was cut for.

    Raises:
        ValueError: ``count`` exceeds the number of rows (a micro-batch needs at least one row)."""
    if count > sum(len(g) for g in groups):
        raise ValueError(f"cannot run {count} micro-batches over {sum(len(g) for g in groups)} rows: another rank's "
                         "token budget cut its rows into more micro-batches than this rank has rows")
    groups = [list(g) for g in groups]
    while len(groups) < count:
        tokens = [sum(seq_lens[r] for r in g) if len(g) > 1 else -1 for g in groups]
        i = tokens.index(max(tokens))
        g, running = groups[i], 0
        cuts = []
        for c in range(1, len(g)):
            running += seq_lens[g[c - 1]]
            inside = uids is not None and str(uids[g[c]]) == str(uids[g[c - 1]])  # the cut would split a uid
            cuts.append((inside, abs(tokens[i] - 2 * running), c))
        cut = min(cuts)[2]
        groups[i:i + 1] = [g[:cut], g[cut:]]
    return groups


def _all_reduce(values: list[float], dtype: torch.dtype, op=dist.ReduceOp.SUM) -> list[float]:
    """``values`` reduced element-wise over all ranks with ``op`` (one all-reduce when there are several; on the
    GPU for nccl), as Python numbers."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return list(values)
    t = torch.tensor(values, dtype=dtype)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=op)
    return t.tolist()


def micro_batches(batch: Batch, micro_batch_size: int | None, use_dynamic_bsz: bool = False,
                  max_token_len: int | None = None, key: str = "max_token_len", keep_uids: bool = False,
                  sp_size: int = 1) -> list[Batch]:
    """Split ``batch`` into micro-batches in order (by count, or by token budget when ``use_dynamic_bsz``; then
    every rank makes the largest rank's number of micro-batches, :func:`split_to_count`, so call it on all ranks).
    ``keep_uids`` (``actor.use_prefix_grouper``): the token-budget cuts avoid splitting a run of one ``uid`` where
    they can (:func:`token_budget_partition`); no effect without a ``uid`` column or ``use_dynamic_bsz``.
    ``sp_size`` (``ulysses_sequence_parallel_size``): ``batch`` holds the SP group's gathered rows and each
    micro-batch's tokens are split over its ``sp_size`` ranks, so the budget is ``max_token_len × sp_size`` (verl
    multiplies the same: 0.6 ``dp_actor.py`` and 0.9 ``workers/engine/utils.py``).

    Raises ``ValueError`` when neither a positive ``micro_batch_size`` nor a dynamic budget is given, and from
    :func:`token_budget_partition` / :func:`split_to_count`."""
    if use_dynamic_bsz:
        if not max_token_len or max_token_len <= 0:
            raise ValueError(f"use_dynamic_bsz needs a positive {key}")
        if sp_size > 1:  # the error then names the key, its value and the SP factor
            key = f"{key}={max_token_len} x ulysses_sequence_parallel_size={sp_size}: budget"
            max_token_len = int(max_token_len) * sp_size
        lens = [int(n) for n in batch["attention_mask"].sum(dim=-1).tolist()]
        uids = batch["uid"] if keep_uids and "uid" in batch else None
        try:
            groups, error = token_budget_partition(lens, int(max_token_len), key, uids), None
        except ValueError as exc:  # still join the all-reduce, so the other ranks fail too instead of waiting
            groups, error = [], exc
        count, failed = _all_reduce([len(groups), int(error is not None)], torch.int64, dist.ReduceOp.MAX)
        if error is not None:
            raise error
        if failed:
            raise ValueError(f"{key}={max_token_len} is smaller than a sequence on another rank; raise it to at "
                             "least the longest prompt + response")
        return [batch.index(g) for g in split_to_count(groups, lens, count, uids)]
    if not micro_batch_size or micro_batch_size <= 0:
        raise ValueError("a micro-batch size per GPU must be set when use_dynamic_bsz is False")
    return batch.split(int(micro_batch_size))


def mini_batches(batch: Batch, mini_batch_size: int, epoch: int, shuffle: bool, seed: int,
                 call_index: int = 0) -> Iterator[Batch]:
    """This rank's mini-batches for one epoch (the last one may be smaller when sizes do not divide)."""
    if mini_batch_size <= 0:
        raise ValueError(f"mini-batch size per rank must be positive, got {mini_batch_size}")
    if shuffle:
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + call_index * 1009 + epoch)
        batch = batch.index(torch.randperm(len(batch), generator=gen))
    yield from batch.split(mini_batch_size)


def global_counts(mask: torch.Tensor, copies: int = 1) -> tuple[float, float]:
    """(valid tokens, sequences with a valid token) of ``mask (B, T)`` summed over all ranks (all-reduce SUM),
    divided by ``copies``: the number of ranks holding each row (``ulysses_sequence_parallel_size``)."""
    tokens, seqs = _all_reduce([mask.float().sum().item(), float((mask != 0).any(dim=-1).sum().item())],
                               torch.float64)
    return float(tokens) / copies, float(seqs) / copies


def all_reduce_sum(values: dict[str, float], copies: int = 1) -> dict[str, float]:
    """Sum a dict of floats over all ranks (keys must match on every rank), divided by ``copies`` (the ranks that
    hold each row and computed the same value: ``ulysses_sequence_parallel_size``)."""
    keys = sorted(values)
    if not keys:
        return {}
    return {k: float(v) / copies for k, v in zip(keys, _all_reduce([values[k] for k in keys], torch.float64))}
