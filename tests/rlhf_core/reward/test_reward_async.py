"""``reward_model.launch_reward_fn_async``: the reward manager runs in the background from [reward] to [adv]."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.trainer.reward_stage import finish_reward, start_reward


class GatedReward:
    """A reward manager that finishes only after ``gate`` is set: score = 1 on the last token of each row."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.thread = None

    def __call__(self, batch: Batch, return_dict: bool = False) -> dict:
        self.thread = threading.current_thread()
        if not self.gate.wait(timeout=10):
            raise TimeoutError("the gate was never opened")
        scores = torch.zeros(batch["responses"].shape)
        scores[:, -1] = torch.arange(len(batch), dtype=torch.float32)
        return {"reward_tensor": scores, "reward_extra_info": {"acc": [1.0, 0.0]}}


def batch() -> Batch:
    return Batch({"responses": torch.ones(2, 3, dtype=torch.long)})


def test_async_reward_runs_while_the_driver_goes_on():
    fn = GatedReward()
    b, pending = start_reward(batch(), fn, None, launch_async=True)
    # back before the manager finished (it waits for the gate): the driver computes log-probs meanwhile
    assert not pending.done()
    b = b.merge(Batch({"old_log_probs": torch.zeros(2, 3)}))  # a later stage's columns
    fn.gate.set()
    out = finish_reward(b, pending)
    assert fn.thread is not threading.current_thread()
    assert out["token_level_scores"][:, -1].tolist() == [0.0, 1.0] and "old_log_probs" in out
    assert np.asarray(out["acc"]).tolist() == [1.0, 0.0]


def test_sync_reward_is_the_same_and_errors_surface_at_the_join():
    fn = GatedReward()
    fn.gate.set()
    b, result = start_reward(batch(), fn, None, launch_async=False)
    assert fn.thread is threading.current_thread()
    assert torch.equal(finish_reward(b, result)["token_level_scores"][:, -1], torch.tensor([0.0, 1.0]))

    def broken(batch, return_dict=False):
        raise ValueError("bad reward")

    b, pending = start_reward(batch(), broken, None, launch_async=True)
    with pytest.raises(ValueError, match="bad reward"):
        finish_reward(b, pending)
