"""The fully async rollouter over continuous batching (rlhf_core/trainer/fully_async_rollouter.py) against a
scripted rollout group (no Ray, no model): a group is queued the moment its last response ends, not when its
sub-batch ends; the next sub-batch is submitted while the first decodes (its rows wait for slots); a later loader
batch's groups wait until the earlier batch's are queued; a step's groups come back in loader order; each
response's versions are the ones of the loads before its first and last token."""
from __future__ import annotations

import threading
import types

import torch
from omegaconf import OmegaConf

from rlhf_core.protocol import Batch
from rlhf_core.trainer.fully_async_queue import RolloutQueue
from rlhf_core.trainer.fully_async_rollouter import stream_rollout_loop
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
    t._sync_wanted, t._sync_done, t._sync_idle, t._stream_idle = (threading.Event() for _ in range(4))
    t._sync_idle.set()
    t.rollout_version, t._stream_versions, t._stream_active = 0, None, False
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
