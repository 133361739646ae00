"""Load the tools of ``actor_rollout_ref.rollout.multi_turn.tool_config_path`` (verl's tool config format).

The file::

    tools:
      - class_name: rlhf_core.tools.builtin.Gsm8kTool     # dotted path to a BaseTool subclass
        config: {type: native, ...}                        # passed to the class as ``config``
        tool_schema: {type: function, function: {...}}     # OpenAI function form

verl's ``verl.tools.gsm8k_tool.Gsm8kTool`` resolves to ours (:data:`VERL_CLASS_ALIASES`), so verl's GSM8K tool
config loads unchanged. verl's ``SandboxFusionTool`` is deliberately not mapped to the local process sandbox: a
config that asks for a remote isolated executor must not silently run code on this machine.
Only ``type: native`` tools exist here (verl's ``mcp`` type is refused by name).
"""
from __future__ import annotations

import importlib
import inspect
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rlhf_core.tools.base import BaseTool
from rlhf_core.tools.schemas import OpenAIFunctionToolSchema

VERL_CLASS_ALIASES = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "rlhf_core.tools.builtin.Gsm8kTool",
}


class ToolConfigError(ValueError):
    """A tool config file that cannot be used; the message names the file and the tool."""


def _import_class(class_name: str) -> type:
    module_name, _, attr = VERL_CLASS_ALIASES.get(class_name, class_name).rpartition(".")
    if not module_name:
        raise ImportError(f"class_name {class_name!r} is not a dotted path 'package.module.Class'")
    return getattr(importlib.import_module(module_name), attr)


def _tool_label(index: int, entry: Any) -> str:
    name = None
    if isinstance(entry, dict):
        schema = entry.get("tool_schema")
        if isinstance(schema, dict) and isinstance(schema.get("function"), dict):
            name = schema["function"].get("name")
        name = name or entry.get("class_name")
    return f"tool #{index}" + (f" ({name!r})" if name else "")


def _is_positive_seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def build_tool(entry: dict, where: str) -> BaseTool:
    """One tool from one ``tools:`` entry.

    Raises:
        ToolConfigError: naming ``where`` for a missing/unimportable class, a class that is not a tool, a
            non-``native`` type, a ``config.timeout`` that is not a positive number of seconds or an invalid schema.
    """
    if not isinstance(entry, dict) or "class_name" not in entry:
        raise ToolConfigError(f"{where}: an entry needs class_name, config and tool_schema; got {entry!r}")
    config = entry.get("config") or {}
    tool_type = config["type"] if "type" in config else "native"  # verl's tool YAML: a missing type is native
    if tool_type != "native":
        raise ToolConfigError(f"{where}: config.type {tool_type!r} is not supported; only 'native' tools")
    if "timeout" in config and not _is_positive_seconds(config["timeout"]):
        raise ToolConfigError(f"{where}: config.timeout must be a positive number of seconds, "
                              f"got {config['timeout']!r}")
    try:
        cls = _import_class(str(entry["class_name"]))
    except (ImportError, AttributeError, ValueError) as exc:
        raise ToolConfigError(f"{where}: class_name {entry['class_name']!r} cannot be imported: {exc}") from exc
    if not inspect.isclass(cls) or not inspect.iscoroutinefunction(getattr(cls, "execute", None)):
        raise ToolConfigError(f"{where}: {entry['class_name']!r} is not a tool class (needs async execute())")
    try:
        schema = OpenAIFunctionToolSchema.model_validate(entry.get("tool_schema"))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'tool_schema'}: {err['msg']}" for err in exc.errors())
        raise ToolConfigError(f"{where}: tool_schema is not a valid OpenAI function schema: {problems}") from exc
    return cls(config=config, tool_schema=schema)


def read_entry_list(path: Path, key: str, what: str, error: type[Exception]) -> list:
    """The list under top-level ``key`` of the YAML file ``path`` (verl's tool and interaction config files).

    Raises:
        error: naming ``what`` and ``path`` when the file cannot be read or parsed, or has no ``key:`` list.
    """
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise error(f"{what} {path}: cannot be read: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get(key), list):
        raise error(f"{what} {path}: needs a top-level '{key}:' list")
    return raw[key]


def load_tools(path: str | Path) -> dict[str, BaseTool]:
    """Name → tool for every entry of a tool config file.

    Raises:
        ToolConfigError: for a missing or unreadable file, no ``tools:`` list, a bad entry (see
            :func:`build_tool`) or two tools with the same name; the message names the file and the tool.
    """
    path = Path(path)
    tools: dict[str, BaseTool] = {}
    for index, entry in enumerate(read_entry_list(path, "tools", "tool config", ToolConfigError)):
        where = f"tool config {path}, {_tool_label(index, entry)}"
        tool = build_tool(entry, where)
        if tool.name in tools:
            raise ToolConfigError(f"{where}: a second tool named {tool.name!r}")
        tools[tool.name] = tool
    return tools
