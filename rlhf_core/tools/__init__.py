"""Tools for multi-turn rollouts (verl's ``verl/tools`` interface and tool config format)."""
from rlhf_core.tools.base import BaseTool
from rlhf_core.tools.config import ToolConfigError, load_tools
from rlhf_core.tools.function_tool import FunctionTool, function_tool, load_all_tools
from rlhf_core.tools.parser import TOOL_PARSERS, parse_hermes
from rlhf_core.tools.runner import ToolCallResult, ToolCallStats, run_tool_calls, truncate_tool_response
from rlhf_core.tools.schemas import FunctionCall, OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "FunctionCall", "FunctionTool", "OpenAIFunctionToolSchema", "TOOL_PARSERS", "ToolCallResult",
           "ToolCallStats", "ToolConfigError", "ToolResponse", "function_tool", "load_all_tools", "load_tools",
           "parse_hermes", "run_tool_calls", "truncate_tool_response"]
