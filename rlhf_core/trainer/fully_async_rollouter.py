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
  until no row is open, and no sub-batch is submitted while it waits.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Iterator

import torch

from rlhf_core.protocol import Batch
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
            subs.popleft()
            batch = prompts.index(slice(lo, hi)).repeat_interleave(n)
            batch.meta.update({"global_steps": p.index, "validate": False})
            with trainer.gen_lock:
                if trainer._stream_versions is None:
                    trainer._stream_versions = [trainer.rollout_version]
                trainer.rollout_wg.execute_dp("stream_submit", batch, slots=slots)
            for j, uid in enumerate(batch.non_tensors["uid"][::n]):
                keep = prompts.index(slice(lo + j, lo + j + 1)) if getattr(trainer, "_keep_prompts", False) else None
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
