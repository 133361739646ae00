"""Multi-turn response lengths count the whole trajectory (issue 32): ``response_length/*`` and
``timing_per_token_ms/gen`` read the response part of ``attention_mask``, as verl's ``_compute_response_info`` does,
so a trajectory that a tool response pushed to ``response_length`` is counted in ``response_length/clip_ratio``.
Before the fix they read ``response_mask`` (assistant tokens only) and such a trajectory was never clipped."""
from __future__ import annotations

import pytest
import torch

from rlhf_core.agent.base import AgentLoopOutput
from rlhf_core.agent.layout import pack_trajectories
from rlhf_core.metrics.training import compute_data_metrics, compute_timing_metrics
from rlhf_core.protocol import Batch

T = 8  # actor_rollout_ref.rollout.response_length


def _multiturn_batch() -> Batch:
    """Three trajectories packed exactly as the agent loop packs them (P = 3, T = 8).

    Row 0: assistant 3 tokens, tool response 4 tokens, assistant 1 token → 8 = T (cut at response_length);
    response_mask 1,1,1,0,0,0,0,1 → 4 assistant tokens.
    Row 1: one assistant turn of 3 tokens → 3, mask 3.
    Row 2: assistant 2, tool 2, assistant 2 → 6, mask 4.
    """
    outputs = [
        AgentLoopOutput([11, 12], [20, 21, 22, 30, 31, 32, 33, 23], [1, 1, 1, 0, 0, 0, 0, 1], num_turns=4),
        AgentLoopOutput([11, 12, 13], [24, 25, 26], [1, 1, 1]),
        AgentLoopOutput([11], [27, 28, 34, 35, 29, 2], [1, 1, 0, 0, 1, 1], num_turns=4),
    ]
    batch = pack_trajectories(outputs, Batch({"input_ids": torch.zeros((3, 3), dtype=torch.long)}, {}), T, 0)
    zeros = torch.zeros((3, T))
    for key in ("token_level_scores", "token_level_rewards", "advantages", "returns"):
        batch.tensors[key] = zeros.clone()
    return batch


def test_response_length_counts_tool_turns_and_clips_at_response_length():
    batch = _multiturn_batch()
    assert batch["response_mask"].sum(-1).tolist() == [4, 3, 4]  # the assistant tokens alone: nothing reaches T
    m = compute_data_metrics(batch, use_critic=False)
    # whole trajectories: 8, 3, 6 tokens → mean 17/3, max 8, min 3; row 0 reaches T = 8 → clip ratio 1/3
    # (with response_mask the lengths were 4, 3, 4: mean 11/3, max 4, clip ratio 0)
    assert m["response_length/mean"] == pytest.approx(17 / 3)
    assert (m["response_length/max"], m["response_length/min"]) == (8.0, 3.0)
    assert m["response_length/clip_ratio"] == pytest.approx(1 / 3)
    # prompts 2, 3, 1 tokens (P = 3 → row 1 clipped)
    assert m["prompt_length/mean"] == pytest.approx(2.0) and m["prompt_length/clip_ratio"] == pytest.approx(1 / 3)


def test_gen_time_per_token_counts_the_whole_trajectory():
    m = compute_timing_metrics(_multiturn_batch(), {"gen": 1.7, "update_actor": 2.3})
    # 8 + 3 + 6 = 17 response tokens → 1700 ms / 17 = 100 ms per token (assistant tokens alone: 1700 / 11 = 154.5)
    assert m["timing_per_token_ms/gen"] == pytest.approx(100.0)
    # prompt 2 + 3 + 1 = 6 tokens, + 17 → 2300 ms / 23 = 100 ms per token
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(100.0)
