"""GSM8K rows in verl's multi-turn tool schema (``examples/data_preprocess/gsm8k_multiturn_w_tool.py``).

From a single-turn row (:func:`rlhf_core.data.gsm8k.gsm8k_row`): a system prompt telling the model to check its
answer with the ``calc_gsm8k_reward`` tool, ``agent_name: tool_agent``, and in ``extra_info``
``need_tools_kwargs: True``, ``tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth`` and
``interaction_kwargs`` (``name: gsm8k``, ``query``, ``ground_truth``) for a simulated user
(``multi_turn.interaction_config_path``). :func:`add_tool_traces` adds synthetic tool-use traces for SFT.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlhf_core.atomic import atomic_write

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
                 interaction_kwargs={"name": "gsm8k", "query": row["prompt"][-1]["content"],
                                     "ground_truth": ground_truth})
    return {**row, "agent_name": "tool_agent",
            "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, *row["prompt"]], "extra_info": extra}


def tool_call_text(answer: str) -> str:
    """The hermes tool call that submits ``answer`` to ``calc_gsm8k_reward`` (what the model should emit)."""
    return "<tool_call>" + json.dumps({"name": TOOL_NAME, "arguments": {"answer": str(answer)}}) + "</tool_call>"


def tool_sft_messages(row: dict[str, Any]) -> list[dict[str, str]]:
    """A synthetic tool-use trace of one multi-turn row, for SFT (``data.multiturn.messages_key: messages``).

    ``system`` and ``user`` as in the row's prompt, then: assistant calls the tool with the reference answer →
    the tool's response (the text :class:`rlhf_core.tools.builtin.Gsm8kTool` returns for it, ``Current parsed
    answer='72' reward=1.0``) → assistant ``#### 72``. Only the format is taught: the answer is the ground truth.
    """
    answer = str(row["reward_model"]["ground_truth"])
    return [*[{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
            {"role": "assistant", "content": tool_call_text(answer)},
            {"role": "tool", "content": gsm8k_tool_response(answer, answer)},
            {"role": "assistant", "content": f"#### {answer}"}]


def gsm8k_tool_response(answer: str, ground_truth: str) -> str:
    """The tool response :class:`~rlhf_core.tools.builtin.Gsm8kTool` gives for a first submission of ``answer``."""
    from rlhf_core.tools.builtin import Gsm8kTool  # lazy: the data CLI does not need the tool stack loaded
    from rlhf_core.tools.schemas import OpenAIFunctionToolSchema

    async def submit() -> str:
        tool = Gsm8kTool({}, OpenAIFunctionToolSchema.model_validate(
            {"type": "function", "function": {"name": TOOL_NAME, "description": "GSM8K answer reward"}}))
        instance_id, _ = await tool.create(ground_truth=ground_truth)
        response, _, _ = await tool.execute(instance_id, {"answer": answer})
        await tool.release(instance_id)
        return response.text

    return asyncio.run(submit())


def add_tool_traces(src: str, dest: str) -> str:
    """Copy the multi-turn parquet ``src`` to ``dest`` with a ``messages`` column (:func:`tool_sft_messages`);
    written atomically. Returns ``dest``."""
    table = pq.read_table(src)
    rows = table.to_pylist()
    messages = [tool_sft_messages(row) for row in rows]
    table = table.append_column("messages", pa.array(messages))
    with atomic_write(dest) as fh:
        pq.write_table(table, fh)
    return dest
