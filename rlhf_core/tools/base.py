"""The tool interface (verl ``verl/tools/base_tool.py``): a tool keeps per-trajectory state keyed by an
instance id, created before its first call and released after the trajectory.

Call order per trajectory and tool: ``create(create_kwargs=...)`` → ``execute(instance_id, arguments,
**execute_kwargs)`` (once per call) → ``calc_reward(instance_id, **calc_reward_kwargs)`` →
``release(instance_id, **release_kwargs)``; the ``*_kwargs`` come from the row's ``extra_info.tools_kwargs[name]``.
Tool classes written for verl's agent loop (same method names and arguments) load unchanged by ``class_name``.

Each call's create → execute → release runs in a thread of its own with an event loop of its own (see
:mod:`rlhf_core.tools.runner`), so a blocking ``execute`` never holds other trajectories. State a tool keeps across
calls (``self``) is therefore touched from several threads: keep it in plain containers keyed by instance id (as
:class:`~rlhf_core.tools.builtin.Gsm8kTool` does) or behind a ``threading`` lock, never in an object bound to one
event loop (an ``asyncio.Lock``/``Semaphore`` or an HTTP client session created once and shared by calls).
"""
from __future__ import annotations

import uuid
from typing import Any

from rlhf_core.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class BaseTool:
    """Base class of every tool.

    Args:
        config: the tool's ``config`` mapping from the tool config file (``type: native`` plus tool settings).
        tool_schema: its validated OpenAI function schema; ``name`` is ``tool_schema.function.name``.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema) -> None:
        self.config = dict(config)
        self.tool_schema = tool_schema
        self.name = tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The schema given to the chat template."""
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start the state of one trajectory; returns its instance id and an (empty) creation response."""
        return instance_id or str(uuid.uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        """Run one call; returns ``(response, step reward, metrics)``. Subclasses must override it."""
        raise TypeError(f"tool {self.name!r} ({type(self).__name__}) does not define execute()")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The trajectory-level reward the tool's state implies (0.0 unless overridden)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the state of one trajectory."""
        return None
