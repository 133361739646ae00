"""Tool-call parsing of an assistant turn, by ``multi_turn.format`` (verl ``experimental/agent_loop/tool_parser.py``).

``hermes`` (Qwen2.5/Hermes chat templates): each call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
Unlike verl, which logs and drops a malformed call, a malformed call here is kept with ``error`` set, so the
model gets an error tool response for it and the failure is counted.
"""
from __future__ import annotations

import json
import re
from typing import Callable

from rlhf_core.registry import Registry
from rlhf_core.tools.schemas import FunctionCall

TOOL_PARSERS: Registry[Callable[[str], tuple[str, list[FunctionCall]]]] = Registry("multi_turn.format")


def registered_tool_parsers() -> list[str]:
    """The names ``multi_turn.format`` accepts now: the built-in tool-call parsers and any registered since."""
    return TOOL_PARSERS.names()

_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _hermes_call(body: str) -> FunctionCall:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        return FunctionCall(name="", arguments={}, error=f"tool call is not valid JSON ({exc.msg})")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return FunctionCall(name="", arguments={}, error='tool call needs {"name": <str>, "arguments": {...}}')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return FunctionCall(name=payload["name"], arguments={}, error="tool call arguments must be a JSON object")
    return FunctionCall(name=payload["name"], arguments=arguments)


@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> tuple[str, list[FunctionCall]]:
    """Split a decoded assistant turn into its text content and its tool calls, in order.

    Returns:
        ``(content, calls)``: the text with the ``<tool_call>`` blocks removed, and one :class:`FunctionCall`
        per block (``error`` set for bad JSON, a missing name or non-object arguments). An unclosed
        ``<tool_call>`` is plain text (no call).
    """
    bodies = _HERMES_CALL.findall(text)
    return _HERMES_CALL.sub("", text), [_hermes_call(body.strip()) for body in bodies]
