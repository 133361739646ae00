"""Run the tool calls of one assistant turn safely: a tool that raises, hangs past its timeout or returns a
non-string gives the model a short error message as its response, is counted, and never stops the batch.

Follows verl's ``ToolAgentLoop._call_tool`` (create → execute → release per call, truncation marks), with the
failures made explicit in :class:`ToolCallStats`.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from rlhf_core.tools.base import BaseTool
from rlhf_core.tools.schemas import FunctionCall, ToolResponse

DEFAULT_TOOL_TIMEOUT_S = 30.0  # a tool's own ``config.timeout`` overrides it
TRUNCATE_SIDES = ("left", "middle", "right")
MALFORMED = "malformed"  # the stats key of calls that name no known tool or cannot be parsed


def truncate_tool_response(text: str, max_length: int, side: str) -> str:
    """Cut ``text`` to ``max_length`` characters (``multi_turn.max_tool_response_length``), verl's marks:

    * ``left``: keep the first ``max_length`` characters + ``"...(truncated)"``;
    * ``right``: ``"(truncated)..."`` + the last ``max_length``;
    * ``middle``: the first and last ``max_length // 2`` around ``"...(truncated)..."``.

    Raises:
        ValueError: for a side not in ``left | middle | right``.
    """
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"multi_turn.tool_response_truncate_side must be one of {TRUNCATE_SIDES}, got {side!r}")
    if len(text) <= max_length:
        return text
    if side == "left":
        return text[:max_length] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_length:]
    half = max_length // 2
    return text[:half] + "...(truncated)..." + (text[-half:] if half else "")


@dataclass
class ToolCallResult:
    """One call's outcome: ``text`` (the tool response the model sees), ``reward`` (the tool's step reward,
    0.0 on failure), ``error`` (``None``, or ``exception`` / ``timeout`` / ``bad_return`` / ``malformed``)."""

    name: str
    text: str
    reward: float = 0.0
    error: str | None = None


@dataclass
class ToolCallStats:
    """Per-tool call and failure counts over a batch; :meth:`metrics` gives ``tool_calls/<name>/count`` and
    ``tool_calls/<name>/failures`` (``<name>`` is ``malformed`` for unparseable calls or unknown tools)."""

    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    failures: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, result: ToolCallResult) -> None:
        self.calls[result.name] += 1
        if result.error is not None:
            self.failures[result.name] += 1

    def merge(self, other: "ToolCallStats") -> None:
        for name, count in other.calls.items():
            self.calls[name] += count
        for name, count in other.failures.items():
            self.failures[name] += count

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in sorted(self.calls):
            out[f"tool_calls/{name}/count"] = float(self.calls[name])
            out[f"tool_calls/{name}/failures"] = float(self.failures.get(name, 0))
        out["tool_calls/total"] = float(sum(self.calls.values()))
        out["tool_calls/failures"] = float(sum(self.failures.values()))
        return out


def _response_text(returned: Any) -> str | None:
    response = returned[0] if isinstance(returned, tuple) and returned else returned
    if isinstance(response, ToolResponse):
        response = response.text
    return response if isinstance(response, str) else None


async def call_tool(tool: BaseTool, arguments: dict[str, Any], tool_kwargs: dict[str, Any]) -> ToolCallResult:
    """create → execute → release one call of ``tool``, within the tool's timeout.

    Args:
        tool_kwargs: the row's ``extra_info.tools_kwargs[tool.name]``: ``create_kwargs``, ``execute_kwargs``,
            ``release_kwargs`` mappings (each optional).
    """
    timeout = float(tool.config.get("timeout", DEFAULT_TOOL_TIMEOUT_S))
    instance_id = None

    async def create_and_execute() -> Any:
        nonlocal instance_id
        instance_id, _ = await tool.create(create_kwargs=(tool_kwargs.get("create_kwargs") or {}))
        return await tool.execute(instance_id, arguments, **(tool_kwargs.get("execute_kwargs") or {}))

    try:
        returned = await asyncio.wait_for(create_and_execute(), timeout)
        text = _response_text(returned)
        if text is None:
            return ToolCallResult(tool.name, f"Error: tool {tool.name} returned a non-string response", error="bad_return")
        reward = returned[1] if isinstance(returned, tuple) and len(returned) > 1 else 0.0
        return ToolCallResult(tool.name, text, float(reward or 0.0))
    except asyncio.TimeoutError:
        return ToolCallResult(tool.name, f"Error: tool {tool.name} timed out after {timeout:g}s", error="timeout")
    except Exception as exc:  # noqa: BLE001 - any tool failure becomes the model's tool response
        message = str(exc).splitlines()[0][:200] if str(exc) else ""
        return ToolCallResult(tool.name, f"Error: tool {tool.name} failed: {type(exc).__name__}: {message}",
                              error="exception")
    finally:
        if instance_id is not None:
            try:
                await asyncio.wait_for(tool.release(instance_id, **(tool_kwargs.get("release_kwargs") or {})), timeout)
            except Exception:  # noqa: BLE001 - a failing release must not stop the batch either
                pass


async def run_tool_calls(calls: list[FunctionCall], tools: dict[str, BaseTool], tools_kwargs: dict[str, Any],
                         max_parallel_calls: int, max_tool_response_length: int, truncate_side: str,
                         stats: ToolCallStats) -> list[ToolCallResult]:
    """Run the first ``max_parallel_calls`` calls of one turn concurrently (verl drops the rest), in call order.

    Malformed calls and unknown tool names give an error response without running anything. Every response
    is truncated with :func:`truncate_tool_response`; every call is added to ``stats``.
    """
    async def one(call: FunctionCall) -> ToolCallResult:
        if call.error is not None:
            return ToolCallResult(MALFORMED, f"Error: {call.error}", error=MALFORMED)
        if call.name not in tools:
            return ToolCallResult(MALFORMED, f"Error: unknown tool {call.name!r}; available: {sorted(tools)}",
                                  error=MALFORMED)
        return await call_tool(tools[call.name], call.arguments, tools_kwargs.get(call.name, {}))

    results = await asyncio.gather(*(one(call) for call in calls[:max_parallel_calls]))
    for result in results:
        result.text = truncate_tool_response(result.text, max_tool_response_length, truncate_side)
        stats.add(result)
    return list(results)
