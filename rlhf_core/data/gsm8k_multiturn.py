"""GSM8K rows in verl's multi-turn tool schema (``examples/data_preprocess/gsm8k_multiturn_w_tool.py``).

From a single-turn row (:func:`rlhf_core.data.gsm8k.gsm8k_row`): a system prompt telling the model to check its
answer with the ``calc_gsm8k_reward`` tool, ``agent_name: tool_agent``, and in ``extra_info``
``need_tools_kwargs: True``, ``tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth`` and
``interaction_kwargs`` (``query``, ``ground_truth``) for a simulated user.
"""
from __future__ import annotations

from typing import Any

TOOL_NAME = "calc_gsm8k_reward"
SYSTEM_PROMPT = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reasoning step by step before any tool call. "
    f"You should use the `{TOOL_NAME}` tool after step by step solving the question, "
    "before generate final answer at least once and refine your answer if necessary. "
    "Put your final answer in the format of `#### <answer>`."
)


def to_multiturn(row: dict[str, Any]) -> dict[str, Any]:
    """The multi-turn form of one single-turn GSM8K row (a new dict; ``row`` is not changed)."""
    ground_truth = row["reward_model"]["ground_truth"]
    extra = dict(row["extra_info"])
    extra.update(need_tools_kwargs=True,
                 tools_kwargs={TOOL_NAME: {"create_kwargs": {"ground_truth": ground_truth}}},
                 interaction_kwargs={"query": row["prompt"][-1]["content"], "ground_truth": ground_truth})
    return {**row, "agent_name": "tool_agent",
            "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, *row["prompt"]], "extra_info": extra}
