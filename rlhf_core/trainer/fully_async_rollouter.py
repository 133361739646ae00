"""The fully async rollouter over continuous batching (the hf engine without agent loops): sub-batches are submitted
to the rollout ranks' sessions (``rlhf_core/workers/rollout/hf_stream.py``) as the staleness budget allows, each
rank decodes its rows in ``concurrent_samples_per_replica × rollout.n`` slots refilled as rows end, and each
prompt's group is queued as soon as its last response ends (verl's rollouter over its async engine).

* Submission: the unit stays the sub-batch of ``k`` prompts (:func:`~rlhf_core.trainer.fully_async_stream.
  sub_batch_size`; the staleness budget is acquired per sub-batch, so :func:`~rlhf_core.trainer.fully_async_queue.
  max_staleness` holds as before). The next sub-batch is submitted as soon as the ranks hold no row waiting for a
  slot, so a slot freed by a short response is refilled at the next decoding step by the next sub-batch's row.
  Each rank's share of a sub-batch is one sampling call of its engine (the call index and uniforms
  ``generate_sequences`` would use), so the responses are the sub-batch path's row for row.
* Order: the groups of one loader batch are queued as they end; a later loader batch's groups wait (here) until the
  earlier batch's are all queued, so a step stays one loader batch (resume exact), and
  :func:`~rlhf_core.trainer.fully_async_stream.assemble_step` puts a step's groups back in loader order.
* Versions: each response's first and last token's parameter version (the rank counts weight loads; the driver maps
  the count to versions). ``partial_rollout=True``: a sync interrupts the decode at a token and loads; open rows go
  on under the new weights from ``prompt + tokens`` (caches recomputed). ``partial_rollout=False``: a sync waits
  until no row is open, and no sub-batch is submitted while it waits (:func:`hold_for_sync`: the sync raises its
  flag and the rollouter checks it before a submit under the same lock, the generation lock).
* State on the trainer (:func:`init_stream_state`): ``_stream_versions`` (entry g = the version of the ranks'
  g-th load since their sessions opened), ``_stream_active``, ``_stream_idle`` (set while no row is open),
  ``_sync_wanted`` / ``_sync_done`` (a sync without ``partial_rollout`` waits / has loaded).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Iterator

import torch

from rlhf_core.protocol import Batch
from rlhf_core.agent.registry import uses_agent_loop
from rlhf_core.trainer.driver_utils import add_uids, ensure_response_mask
from rlhf_core.trainer.fully_async_stream import Group, sub_batch_bounds
from rlhf_core.trainer.response_versions import MIN_KEY, tag_versions


class _Pending:
    """One loader batch in flight: its groups by prompt index, queued in loader order once all are done."""

    def __init__(self, index: int, epoch: int, position: Any, prompts: int) -> None:
        self.index, self.epoch, self.position, self.prompts = index, epoch, position, prompts
        self.done: dict[int, Group] = {}
        self.queued: set[int] = set()
        self.batch_index = 0


def init_stream_state(trainer) -> None:
    """Set the continuous rollouter's state on ``trainer`` (module docstring): no session yet, no row open."""
    trainer._stream_versions = None
    trainer._stream_active = False  # the rollouter runs on continuous batching (set by its loop)
    trainer._stream_idle = threading.Event()
    trainer._stream_idle.set()
    trainer._sync_wanted = threading.Event()
    trainer._sync_done = threading.Event()


def can_stream(trainer) -> bool:
    """The rollouter of ``trainer`` batches continuously: the hf engine without agent loops on every rollout rank
    (``stream_supported``), no ``rollout.over_sample_rate`` (it cuts a whole batch's slowest responses) and no
    ``skip.rollout`` / ``skip.async_rollout`` dump or replay (they go through its ``_generate_sub_batch``)."""
    rollout = trainer.config.actor_rollout_ref.rollout
    if (str(rollout.name) != "hf" or uses_agent_loop(rollout) or float(rollout.over_sample_rate) > 0
            or trainer.rollout_dump or trainer.async_dump is not None):
        return False
    return all(trainer.rollout_wg.execute_all("stream_supported"))


def hold_for_sync(trainer) -> None:
    """The sync's side without ``partial_rollout``: raise ``_sync_wanted`` under the generation lock, then wait until
    no row is open. The rollouter checks the flag under that lock before each submit and clears ``_stream_idle``
    there, so either its submit came first (the wait covers those rows) or it sees the flag and submits nothing
    until :func:`sync_ended`. Blocks for at most one ``stream_advance`` to take the lock."""
    trainer._sync_done.clear()
    with trainer.gen_lock:
        trainer._sync_wanted.set()
    trainer._stream_idle.wait()


def sync_ended(trainer) -> None:
    """The sync loaded (or failed): the rollouter may submit again."""
    trainer._sync_wanted.clear()
    trainer._sync_done.set()


def stream_rollout_loop(trainer, stream: Iterator[tuple[int, Batch]], first_step: int) -> None:
    """Run the rollouter of ``trainer`` (a ``FullyAsyncTrainer`` whose rollout ranks answer ``stream_supported``)
    over continuous batching (module docstring) until ``stream`` ends or the queue is closed. On return (or an
    error) ``trainer._stream_idle`` is set, so a sync waiting for the open rows never waits for a dead rollouter."""
    trainer._stream_active = True
    try:
        _loop(trainer, stream, first_step)
    finally:
        trainer._stream_idle.set()


def _loop(trainer, stream: Iterator[tuple[int, Batch]], first_step: int) -> None:
    cfg = trainer.config
    n = int(cfg.actor_rollout_ref.rollout.n)
    ranks = int(cfg.rollout.nnodes) * int(cfg.rollout.n_gpus_per_node)
    slots = max(1, -(-trainer.sub_batch * n // ranks))
    subs: deque = deque()  # (pending loader batch, lo, hi, prompts)
    pending: deque[_Pending] = deque()
    rows: dict[str, list[tuple[int, int, Batch]]] = {}  # uid -> (rank, row, output row)
    prompt_of: dict[str, tuple] = {}  # uid -> (loader batch, prompt index, its n rows, its prompt row or None)
    open_rows = waiting = 0
    seconds = 0.0
    exhausted = False
    draws = 0
    loader = iter(stream)
    trainer._stream_versions = None
    while True:
        # submit sub-batches while no row waits for a slot and the staleness budget allows
        while waiting == 0 and not trainer._sync_wanted.is_set():
            if not subs:
                if exhausted:
                    break
                item = next(loader, None)
                if item is None:
                    exhausted = True
                    break
                epoch, prompts = item
                position = trainer.train_dataloader.state_dict()
                prompts = add_uids(prompts)
                p = _Pending(first_step + draws + 1, epoch, position, len(prompts))  # the step it is for
                p.batch_index = draws
                draws += 1
                pending.append(p)
                subs.extend((p, lo, hi, prompts) for lo, hi in sub_batch_bounds(len(prompts), trainer.sub_batch))
            p, lo, hi, prompts = subs[0]
            if not trainer.queue.acquire(hi - lo, timeout=0 if open_rows else None):
                if trainer.queue.closed:
                    return
                break
            batch = prompts.index(slice(lo, hi)).repeat_interleave(n)
            batch.meta.update({"global_steps": p.index, "validate": False})
            with trainer.gen_lock:  # hold_for_sync raises _sync_wanted under this lock
                if trainer._sync_wanted.is_set():  # raised since the check above: the sync loads first
                    trainer.queue.release(hi - lo)
                    break
                trainer._stream_idle.clear()  # before the rows exist: a sync from now on waits for them
                if trainer._stream_versions is None:
                    trainer._stream_versions = [trainer.rollout_version]
                trainer.rollout_wg.execute_dp("stream_submit", batch, slots=slots)
            subs.popleft()
            for j, uid in enumerate(batch.non_tensors["uid"][::n]):
                keep = prompts.index(slice(lo + j, lo + j + 1)) if trainer._keep_prompts else None
                prompt_of[str(uid)] = (p, lo + j, batch.index(slice(j * n, (j + 1) * n)), keep)  # keep: a v1 drop
            open_rows += len(batch)
            waiting += len(batch)
        if open_rows == 0:
            trainer._stream_idle.set()
            if exhausted and not subs:
                return
            if trainer._sync_wanted.is_set():
                trainer._sync_done.wait(0.05)
            continue
        trainer._stream_idle.clear()
        trainer._sync_idle.wait()  # partial_rollout: a sync interrupting the decode loads first
        start, span = time.perf_counter(), trainer.gen_clock.start()
        with trainer.gen_lock:
            versions = torch.tensor(trainer._stream_versions)
            results = trainer.rollout_wg.execute_all("stream_advance")
        trainer.gen_clock.stop(span)
        seconds += time.perf_counter() - start
        open_rows, waiting = sum(r[1] for r in results), sum(r[2] for r in results)
        for rank, (out, _, _) in enumerate(results):
            if out is None:
                continue
            for j in range(len(out)):
                row = out.index([j])
                uid = str(row.non_tensors["uid"][0])
                rows.setdefault(uid, []).append((rank, int(row["stream_row"][0]), row))
        for uid in [u for u, r in rows.items() if len(r) == n]:
            seconds = _group_done(trainer, uid, rows.pop(uid), prompt_of.pop(uid), versions, pending, seconds)
        if open_rows == 0:
            trainer._stream_idle.set()


def _group_done(trainer, uid, parts, prompt, versions, pending, seconds) -> float:
    """Tag the group's responses with their versions, merge them into its prompt rows, and queue what may go: the
    oldest pending loader batch's finished groups (as they end), then, once it is complete, the next batch's.
    Returns the generation seconds not yet attributed to a queued group."""
    p, index, prompt_rows, keep = prompt
    out = Batch.concat([r for _, _, r in sorted(parts, key=lambda x: (x[0], x[1]))])
    first, last = out.tensors.pop("rollout_first_load"), out.tensors.pop("rollout_last_load")
    out.tensors.pop("stream_row")
    group = ensure_response_mask(prompt_rows.merge(out, "rollout stream_advance"))
    group.meta["global_token_num"] = group["attention_mask"].sum(-1).tolist()
    tag_versions(group, versions[first], versions[last])
    p.done[index] = Group(group, p.epoch, p.batch_index, 0.0, p.position, keep, index)
    while pending:
        head = pending[0]
        for i in [i for i in head.done if i not in head.queued]:
            g = head.done[i]
            g.seconds, seconds = seconds, 0.0
            trainer.queue.put(1, int(g.batch[MIN_KEY].min()), g)
            head.queued.add(i)
        if len(head.queued) < head.prompts:
            break
        pending.popleft()
    return seconds
