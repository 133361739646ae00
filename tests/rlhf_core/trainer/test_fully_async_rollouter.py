"""The fully async rollouter over continuous batching (rlhf_core/trainer/fully_async_rollouter.py) against a
scripted rollout group (no Ray, no model): a group is queued the moment its last response ends, not when its
sub-batch ends; the next sub-batch is submitted while the first decodes (its rows wait for slots); a later loader
batch's groups wait until the earlier batch's are queued; a step's groups come back in loader order; each
response's versions are the ones of the loads before its first and last token; without partial rollouts a sync
raised between the rollouter's check and its submit still loads with no row open."""
from __future__ import annotations

import threading
import types

import torch
from omegaconf import OmegaConf

from rlhf_core.protocol import Batch
from rlhf_core.trainer.fully_async_queue import RolloutQueue
from rlhf_core.trainer.fully_async_rollouter import hold_for_sync, init_stream_state, stream_rollout_loop, sync_ended
from rlhf_core.trainer.fully_async_stream import assemble_step
from rlhf_core.trainer.overlap_clock import OverlapClock


class _ScriptedGroup:
    """Rollout ranks (one here) whose session ends rows in a scripted order: ``script`` lists, per
    ``stream_advance`` call, the (submission, row) pairs that end in it; ``loads[(submission, row)]`` = the
    (first, last) load counts of that row."""

    def __init__(self, script, loads=None):
        self.script, self.loads = list(script), loads or {}
        self.submitted: list[Batch] = []
        self.log: list[tuple] = []  # ("submit", submission) / ("advance", ended pairs)
        self.on_advance: dict = {}  # advance number (1-based) -> called before it returns

    def execute_dp(self, method, batch, slots):
        assert method == "stream_submit"
        self.submitted.append(batch)
        self.log.append(("submit", len(self.submitted) - 1))

    def execute_all(self, method):
        assert method == "stream_advance"
        ended = self.script.pop(0)
        calls = sum(e[0] == "advance" for e in self.log) + 1
        self.on_advance.get(calls, lambda: None)()
        self.log.append(("advance", ended))
        open_rows = sum(len(b) for b in self.submitted) - sum(len(e[1]) for e in self.log if e[0] == "advance")
        if not ended:
            return [(None, open_rows, 0)]
        parts = []
        for s, r in ended:
            src = self.submitted[s].index([r])
            first, last = self.loads.get((s, r), (0, 0))
            parts.append(Batch({"responses": torch.tensor([[7, 8]]), "response_mask": torch.ones(1, 2, dtype=torch.long),
                                "attention_mask": torch.ones(1, 4, dtype=torch.long),
                                "rollout_first_load": torch.tensor([first]), "rollout_last_load": torch.tensor([last]),
                                "stream_row": torch.tensor([r])}, dict(src.non_tensors), dict(src.meta)))
        return [(Batch.concat(parts), open_rows, 0)]


def _trainer(group, required=2, k=1, n=2, threshold=2.0):
    t = types.SimpleNamespace()
    t.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": n}}, "rollout": {"nnodes": 1,
                                                                                        "n_gpus_per_node": 1}})
    t.sub_batch, t.queue, t.rollout_wg = k, RolloutQueue(required, threshold, 1), group
    t.gen_lock, t.gen_clock = threading.Lock(), OverlapClock()
    init_stream_state(t)
    t._sync_idle = threading.Event()
    t._sync_idle.set()
    t.rollout_version, t._keep_prompts = 0, False
    t.train_dataloader = types.SimpleNamespace(state_dict=lambda: {"at": "pos"})
    return t


def _loader(batches, prompts=2):
    for b in range(batches):
        ids = torch.arange(prompts)[:, None] + 10 * b
        yield 0, Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, {}, {})


def test_groups_are_queued_as_their_last_response_ends_in_loader_batch_order():
    # k = 1 prompt per sub-batch, n = 2, loader batches of 2 prompts: submissions 0..3 = prompts A0, A1 | B0, B1.
    # The fake reports no row waiting for a slot, so each sub-batch is submitted right after the previous one's
    # first advance (budget 6 samples: all fit). Advances: 1 nothing ends; 2 A1's first row; 3 A1's second (A1
    # complete); 4 both of B0 (complete, but loader batch 0 is not); 5 both of A0; 6 both of B1. A weight load
    # happens during advance 4 (version 1): A0's second row ends after it, its first token before it.
    script = [[], [(1, 0)], [(1, 1)], [(2, 0), (2, 1)], [(0, 0), (0, 1)], [(3, 0), (3, 1)]]
    group = _ScriptedGroup(script, loads={(0, 1): (0, 1)})
    t = _trainer(group)
    group.on_advance = {4: lambda: t._stream_versions.append(1)}
    queued = []
    put = t.queue.put
    t.queue.put = lambda samples, version, g: (queued.append((g.loader_batch, g.index, len(group.log))),
                                               put(samples, version, g))
    stream_rollout_loop(t, _loader(2), first_step=0)
    assert group.log == [("submit", 0), ("advance", []), ("submit", 1), ("advance", [(1, 0)]), ("submit", 2),
                         ("advance", [(1, 1)]), ("submit", 3), ("advance", [(2, 0), (2, 1)]),
                         ("advance", [(0, 0), (0, 1)]), ("advance", [(3, 0), (3, 1)])]
    # (loader batch, prompt index, log length at the put): A1 right after advance 3 (log entry 6), before its
    # sub-batch-mate A0 and before sub-batch 0 ended; B0 waited for loader batch 0 and went out with A0 (entry 9)
    assert queued == [(0, 1, 6), (0, 0, 9), (1, 0, 9), (1, 1, 10)]
    # a step: loader batch 0's groups back in loader order (A0 then A1) though A1 was queued first
    groups = [t.queue.get()[1] for _ in range(2)]
    assert [g.index for g in groups] == [1, 0]
    batch, _, position, _ = assemble_step(groups, 2)
    assert batch["input_ids"][:, 0].tolist() == [0, 0, 1, 1] and position == {"at": "pos"}
    # versions per response: A0's second response's last token came after the load (version 1)
    assert batch["min_global_steps"].tolist() == [0, 0, 0, 0]
    assert batch["max_global_steps"].tolist() == [0, 1, 0, 0]


class _RecordingLock:
    """A lock that counts its releases by the thread that built it (the rollouter's, in these tests)."""

    def __init__(self):
        self._lock, self._owner = threading.Lock(), threading.get_ident()
        self.cond, self.owner_releases = threading.Condition(), 0

    def __enter__(self):
        self._lock.acquire()

    def __exit__(self, *exc):
        self._lock.release()
        if threading.get_ident() == self._owner:
            with self.cond:
                self.owner_releases += 1
                self.cond.notify_all()


def test_a_sync_raised_between_the_check_and_the_submit_loads_with_no_row_open():
    # One loader batch of 2 prompts, k = 1, n = 2: sub-batches 0 and 1. Advance 1 ends both rows of sub-batch 0, so
    # no row is open (idle set) when the loop checks _sync_wanted for sub-batch 1. The sync (no partial rollouts)
    # starts right after that check, inside the acquire of sub-batch 1, and raises its flag before the rollouter
    # takes the generation lock to submit; its load waits until the rollouter has taken and released that lock
    # once more (its submit, or its back-off). The guarantee: the load finds no row open, and sub-batch 1 is
    # submitted after the load. (Before the fix the idle wait passed at once and the load found sub-batch 1's 2
    # rows open.)
    group = _ScriptedGroup([[(0, 0), (0, 1)], [(1, 0), (1, 1)]], loads={(1, 0): (1, 1), (1, 1): (1, 1)})
    t = _trainer(group)
    t.gen_lock = lock = _RecordingLock()
    acquire, acquires, loads, errors = t.queue.acquire, [], [], []

    def sync():
        try:
            hold_for_sync(t)
            with lock.cond:  # the rollouter's attempt at the submit is over
                assert lock.cond.wait_for(lambda: lock.owner_releases > at_hook, timeout=10), "no submit attempt"
            with t.gen_lock:  # the load
                open_rows = sum(len(b) for b in group.submitted) - sum(len(e[1]) for e in group.log
                                                                       if e[0] == "advance")
                loads.append(open_rows)
                group.log.append(("load",))
                t._stream_versions.append(1)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
        finally:
            sync_ended(t)

    def hooked(samples, timeout=None):
        nonlocal at_hook
        ok = acquire(samples, timeout)
        acquires.append(samples)
        if len(acquires) == 2:  # sub-batch 1, after the loop's check of _sync_wanted
            at_hook = lock.owner_releases
            thread.start()
            assert t._sync_wanted.wait(10), "the sync did not raise its flag"
        return ok

    at_hook = 0
    thread = threading.Thread(target=sync)
    t.queue.acquire = hooked
    stream_rollout_loop(t, _loader(1), first_step=0)
    thread.join(10)
    assert not errors, errors
    assert loads == [0]  # the load found no row open
    assert group.log == [("submit", 0), ("advance", [(0, 0), (0, 1)]), ("load",), ("submit", 1),
                         ("advance", [(1, 0), (1, 1)])]
    assert acquires == [1, 1, 1]  # sub-batch 1's budget given back at the back-off and acquired again after the load
    assert t.queue.stats()["fully_async/count/staleness_samples"] == 2  # counted once each: 2 prompts
    # both groups queued; sub-batch 1's rows decoded after the load (the rank's load count 1 = version 1)
    groups = [t.queue.get()[1] for _ in range(2)]
    assert [g.batch["min_global_steps"].tolist() for g in groups] == [[0, 0], [1, 1]]
