"""Run the tool calls of one assistant turn safely: a tool that raises, hangs past its timeout or returns a
non-string gives the model a short error message as its response, is counted, and never stops the batch.

Follows verl's ``ToolAgentLoop._call_tool`` (create → execute → release per call, truncation marks), with the
failures made explicit in :class:`ToolCallStats`.

Each call runs in a daemon thread of its own, on an event loop of its own (:class:`_OffLoopCall`), never on the
rollout's event loop: a tool whose ``async def execute`` blocks (``time.sleep``, a blocking socket read, a
synchronous HTTP client) cannot hold the engine and the other trajectories, and its caller gets the timeout
response at the timeout. At the timeout the call's task is cancelled: a tool that awaits stops there (the
``code_interpreter`` sandbox then kills its process group); one blocked in a synchronous call cannot be
interrupted from outside and is abandoned: its thread runs on until the call returns, then releases the instance.
"""
from __future__ import annotations

import asyncio
import threading
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


class _OffLoopCall:
    """create → execute → release of one tool call in a daemon thread running its own event loop.

    ``result`` (a future of the caller's loop) gets ``execute``'s return value or exception; ``released`` is set
    once ``release`` has run (or was not needed). :meth:`cancel` cancels the call's task from the caller's thread.
    """

    def __init__(self, tool: BaseTool, arguments: dict[str, Any], tool_kwargs: dict[str, Any]) -> None:
        self._caller = asyncio.get_running_loop()
        self.result: asyncio.Future = self._caller.create_future()
        self.released: asyncio.Future = self._caller.create_future()
        self._tool, self._arguments, self._kwargs = tool, arguments, tool_kwargs
        self._lock = threading.Lock()
        self._handle: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None
        self._cancelled = False
        threading.Thread(target=asyncio.run, args=(self._body(),), daemon=True,
                         name=f"rlhf-tool-{tool.name}").start()

    def cancel(self) -> None:
        """Cancel the call's task (at its next ``await``); a no-op once it has finished."""
        with self._lock:
            self._cancelled = True
            if self._handle is not None:
                loop, task = self._handle
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # its loop is already closed: the call has finished
                    pass

    def _deliver(self, future: asyncio.Future, value: Any = None, error: BaseException | None = None) -> None:
        def settle() -> None:
            if future.done():  # the caller gave up (timeout or cancellation)
                return
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error if isinstance(error, Exception) else RuntimeError(repr(error)))
        try:
            self._caller.call_soon_threadsafe(settle)
        except RuntimeError:  # the caller's loop has closed: nobody waits for this call any more
            pass

    async def _body(self) -> None:
        with self._lock:
            if self._cancelled:
                self._deliver(self.released)
                return
            self._handle = (asyncio.get_running_loop(), asyncio.current_task())
        instance_id = None
        try:
            instance_id, _ = await self._tool.create(create_kwargs=(self._kwargs.get("create_kwargs") or {}))
            execute_kwargs = self._kwargs.get("execute_kwargs") or {}
            returned = await self._tool.execute(instance_id, self._arguments, **execute_kwargs)
            self._deliver(self.result, returned)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, which turns it into the response
            self._deliver(self.result, error=exc)
        finally:
            try:
                if instance_id is not None:
                    await self._tool.release(instance_id, **(self._kwargs.get("release_kwargs") or {}))
            except BaseException:  # noqa: BLE001 - a failing release must not stop the batch either
                pass
            self._deliver(self.released)


async def call_tool(tool: BaseTool, arguments: dict[str, Any], tool_kwargs: dict[str, Any]) -> ToolCallResult:
    """create → execute → release one call of ``tool`` off the caller's event loop, within the tool's timeout.

    The timeout (``tool.config["timeout"]`` seconds, else :data:`DEFAULT_TOOL_TIMEOUT_S`) covers create and
    execute; past it the call is cancelled or abandoned (see the module docstring) and the result is the error
    ``"Error: tool <name> timed out after <t>s"``. When execute finished in time, ``release`` is waited for up to
    the same timeout more. The caller's event loop is never blocked by the tool.

    Args:
        tool_kwargs: the row's ``extra_info.tools_kwargs[tool.name]``: ``create_kwargs``, ``execute_kwargs``,
            ``release_kwargs`` mappings (each optional).
    """
    timeout = float(tool.config.get("timeout", DEFAULT_TOOL_TIMEOUT_S))
    try:
        call = _OffLoopCall(tool, arguments, tool_kwargs)
    except RuntimeError as exc:  # no thread could be started (the process is out of threads)
        return _failure(tool, exc)
    try:
        returned = await asyncio.wait_for(call.result, timeout)
    except asyncio.TimeoutError:
        call.cancel()
        return ToolCallResult(tool.name, f"Error: tool {tool.name} timed out after {timeout:g}s", error="timeout")
    except asyncio.CancelledError:
        call.cancel()
        raise
    except Exception as exc:  # noqa: BLE001 - any tool failure becomes the model's tool response
        await _wait_released(call, timeout)
        return _failure(tool, exc)
    await _wait_released(call, timeout)
    try:
        text = _response_text(returned)
        if text is None:
            return ToolCallResult(tool.name, f"Error: tool {tool.name} returned a non-string response",
                                  error="bad_return")
        reward = returned[1] if isinstance(returned, tuple) and len(returned) > 1 else 0.0
        return ToolCallResult(tool.name, text, float(reward or 0.0))
    except Exception as exc:  # noqa: BLE001 - e.g. a step reward that is not a number
        return _failure(tool, exc)


def _failure(tool: BaseTool, exc: Exception) -> ToolCallResult:
    message = str(exc).splitlines()[0][:200] if str(exc) else ""
    return ToolCallResult(tool.name, f"Error: tool {tool.name} failed: {type(exc).__name__}: {message}",
                          error="exception")


async def _wait_released(call: _OffLoopCall, timeout: float) -> None:
    try:
        await asyncio.wait_for(call.released, timeout)
    except asyncio.TimeoutError:  # a release that hangs is abandoned with its thread
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
