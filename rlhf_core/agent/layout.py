"""Pack agent-loop trajectories into the rollout batch (the same fields and shapes as the single-turn rollout).

Per row, with ``P`` the prompt width and ``T = response_length``::

    input_ids      = [pad … pad | prompt] [assistant₁ tool₁ assistant₂ … | pad … pad]     (B, P+T)
    attention_mask = [0 … 0 | 1 … 1]      [1 …                        1 | 0 … 0]         (B, P+T)
    response_mask  =                      [1 … 1  0 … 0  1 … 1          | 0 … 0]         (B, T)

Tool and user tokens are attended to (the policy saw them) but carry no loss and no KL (``response_mask`` 0);
``position_ids = clamp(cumsum(attention_mask) - 1, 0)`` as in single-turn, so the whole trajectory is one
contiguous sequence. verl ``agent_loop.py::_postprocess``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from rlhf_core.agent.base import AgentLoopOutput
from rlhf_core.protocol import Batch
from rlhf_core.tools.runner import ToolCallStats


def pack_trajectories(outputs: Sequence[AgentLoopOutput], prompt_batch: Batch, response_length: int,
                      pad_token_id: int) -> Batch:
    """The rollout batch of ``outputs`` (one per row of ``prompt_batch``, same order).

    Returns:
        ``prompts (B, P)`` left-padded, ``P`` = the wider of ``prompt_batch["input_ids"]`` and the longest
        prompt (tool schemas lengthen it); ``responses``/``response_mask (B, T)`` right-padded;
        ``input_ids``/``attention_mask``/``position_ids (B, P+T)``; ``rollout_log_probs (B, T)`` float32 when
        every trajectory has log-probs. Non-tensor columns of ``prompt_batch`` plus ``num_turns`` (int),
        ``tool_rewards`` and ``turn_scores`` (lists per row) and ``tool_calls`` (per row ``{tool: [calls, failures]}``),
        and ``messages`` (per row ``{"messages": [conversation, ...]}`` or ``None``) when a loop returns them
        (``collabllm_agent``); ``meta["metrics"]``: :func:`trajectory_metrics`.

    Raises:
        ValueError: when the counts differ or a trajectory is longer than ``response_length`` or its mask and
            ids differ in length.
    """
    if len(outputs) != len(prompt_batch):
        raise ValueError(f"{len(outputs)} trajectories for {len(prompt_batch)} prompts")
    T = int(response_length)
    P = max([int(prompt_batch["input_ids"].shape[-1])] + [len(o.prompt_ids) for o in outputs])
    B = len(outputs)
    prompts = torch.full((B, P), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    responses = torch.full((B, T), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((B, T), dtype=torch.long)
    response_mask = torch.zeros((B, T), dtype=torch.long)
    with_logprobs = all(o.response_logprobs is not None for o in outputs)
    log_probs = torch.zeros((B, T), dtype=torch.float32)
    for i, o in enumerate(outputs):
        n = len(o.response_ids)
        if n > T or len(o.response_mask) != n or (with_logprobs and len(o.response_logprobs) != n):
            raise ValueError(f"trajectory {i}: {n} response ids, {len(o.response_mask)} mask entries, "
                             f"response_length {T}")
        if o.prompt_ids:
            prompts[i, P - len(o.prompt_ids):] = torch.tensor(o.prompt_ids, dtype=torch.long)
            prompt_mask[i, P - len(o.prompt_ids):] = 1
        if n:
            responses[i, :n] = torch.tensor(o.response_ids, dtype=torch.long)
            response_attention[i, :n] = 1
            response_mask[i, :n] = torch.tensor(o.response_mask, dtype=torch.long)
            if with_logprobs:
                log_probs[i, :n] = torch.tensor(o.response_logprobs, dtype=torch.float32) * response_mask[i, :n]
    attention_mask = torch.cat([prompt_mask, response_attention], dim=-1)
    tensors = {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=-1),
               "attention_mask": attention_mask,
               "position_ids": torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
               "response_mask": response_mask}
    if with_logprobs:
        tensors["rollout_log_probs"] = log_probs
    non_tensors = dict(prompt_batch.non_tensors)
    non_tensors["num_turns"] = np.array([o.num_turns for o in outputs], dtype=np.int64)
    non_tensors["tool_rewards"] = [list(o.tool_rewards) for o in outputs]
    non_tensors["turn_scores"] = [list(o.turn_scores) for o in outputs]
    non_tensors["tool_calls"] = [{name: [o.tool_stats.calls[name], o.tool_stats.failures.get(name, 0)]
                                  for name in o.tool_stats.calls} for o in outputs]
    if any("messages" in o.extra for o in outputs):  # the collabllm_agent loop's repeated rollouts (verl's column)
        non_tensors["messages"] = [o.extra.get("messages") for o in outputs]
    meta = dict(prompt_batch.meta)
    meta["metrics"] = trajectory_metrics(outputs)
    return Batch(tensors, non_tensors, meta)


def trajectory_metrics(outputs: Sequence[AgentLoopOutput]) -> dict[str, float]:
    """``num_turns/{min,max,mean}`` over the trajectories plus the summed tool-call metrics
    (``tool_calls/<name>/{count,failures}``, ``tool_calls/{total,failures}``; see ``ToolCallStats``)."""
    turns = np.array([o.num_turns for o in outputs], dtype=np.float64)
    stats = ToolCallStats()
    for o in outputs:
        stats.merge(o.tool_stats)
    metrics = {"num_turns/min": float(turns.min()), "num_turns/max": float(turns.max()),
               "num_turns/mean": float(turns.mean())} if len(turns) else {}
    metrics.update(stats.metrics())
    return metrics


def multiturn_metrics(batch: Batch) -> dict[str, float]:
    """The driver-side :func:`trajectory_metrics` of a packed batch from its ``num_turns`` and ``tool_calls``
    columns (every rank's rows, unlike ``meta`` which keeps rank 0's); ``{}`` for a single-turn batch."""
    if "num_turns" not in batch.non_tensors:
        return {}
    outputs = []
    for turns, calls in zip(batch.non_tensors["num_turns"], batch.non_tensors["tool_calls"]):
        stats = ToolCallStats()
        for name, (count, failures) in calls.items():
            stats.calls[name] += int(count)
            stats.failures[name] += int(failures)
        outputs.append(AgentLoopOutput([], [], [], num_turns=int(turns), tool_stats=stats))
    return trajectory_metrics(outputs)
