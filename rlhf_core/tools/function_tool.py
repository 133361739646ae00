"""Python functions as tools: ``actor_rollout_ref.rollout.multi_turn.function_tool_path`` (verl 0.9.1
``verl/tools/function_tool.py`` and ``verl/tools/tool_registry.py``).

The file named by the key is run as a module; every function in it decorated with :func:`function_tool` becomes a
stateless tool next to those of ``tool_config_path`` (a name used by both is an error). The OpenAI schema is built
from the function's type hints and Google-style docstring by ``transformers.utils.get_json_schema`` (as verl does),
or given whole with ``schema=``. A tool file written for verl (``from verl.tools.function_tool import
function_tool``) loads unchanged when verl is not installed: that import, and ``verl.tools.schemas``, are answered
by this module and :mod:`rlhf_core.tools.schemas` while the file runs.

The function's return value becomes the tool response as in verl's ``normalize_function_tool_return``: a
:class:`ToolResponse` as is; a ``str`` as its text; a ``dict`` as its JSON; a tuple ``(response,)``,
``(response, reward)`` or ``(response, reward, metrics)`` (``None`` reward = 0.0, ``None`` metrics = {});
anything else as ``str(value)``.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import json
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import ValidationError

from rlhf_core.tools.base import BaseTool
from rlhf_core.tools.config import ToolConfigError
from rlhf_core.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from rlhf_core.user_code import exec_user_file

_MARK = "__function_tool__"  # attribute set by the decorator: (tool name or None, schema or None)


def function_tool(name: str | Callable | None = None, *, schema: OpenAIFunctionToolSchema | dict | None = None):
    """Mark a function as a tool (verl's decorator; bare ``@function_tool`` or ``@function_tool("name")``).

    Args:
        name: the tool name the model calls; default the function's name. A bare ``@function_tool`` passes the
            function here.
        schema: the whole OpenAI function schema (an :class:`OpenAIFunctionToolSchema` or a dict of that shape)
            instead of one built from the signature and docstring.

    Returns the function unchanged (marked); the schema is built when the file is loaded
    (:func:`load_function_tools`), whose error names the file and the function.
    """
    def mark(fn: Callable, tool_name: str | None) -> Callable:
        setattr(fn, _MARK, (tool_name, schema))
        return fn

    if callable(name) and schema is None:
        return mark(name, None)
    return lambda fn: mark(fn, name)


def normalize_return(value: Any) -> tuple[ToolResponse, float, dict]:
    """``(response, reward, metrics)`` of a function tool's return value (rules in the module docstring).

    Raises:
        TypeError: a tuple of length 0 or more than 3 (verl refuses it too: almost always an authoring bug).
    """
    if isinstance(value, tuple):
        if not 1 <= len(value) <= 3:
            raise TypeError(f"a function tool's tuple return has 1 to 3 items (response, reward, metrics), got "
                            f"{len(value)}: {value!r}")
        reward = 0.0 if len(value) < 2 or value[1] is None else float(value[1])
        metrics = {} if len(value) < 3 or value[2] is None else dict(value[2])
        return _response(value[0]), reward, metrics
    return _response(value), 0.0, {}


def _response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return ToolResponse(text=value if isinstance(value, str) else str(value))


class FunctionTool(BaseTool):
    """A stateless tool calling ``fn(**arguments)`` (an ``async def`` is awaited; a plain function runs in a
    thread, as in verl). ``config`` is ``{"type": "native"}``: the runner's default timeout applies."""

    def __init__(self, fn: Callable, tool_schema: OpenAIFunctionToolSchema) -> None:
        super().__init__(config={"type": "native"}, tool_schema=tool_schema)
        self.fn = fn

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        """``normalize_return(fn(**parameters))``."""
        if inspect.iscoroutinefunction(self.fn):
            return normalize_return(await self.fn(**parameters))
        return normalize_return(await asyncio.to_thread(self.fn, **parameters))


def _schema_of(fn: Callable, name: str, given: Any, where: str) -> OpenAIFunctionToolSchema:
    if isinstance(given, OpenAIFunctionToolSchema):
        return given
    # imported here: the agent registry and the dataset import this module; transformers is needed only now
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    try:
        if given is not None:
            return OpenAIFunctionToolSchema.model_validate(given)
        variadic = [p.name for p in inspect.signature(fn).parameters.values()
                    if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        if variadic:
            raise ValueError(f"variadic parameters {variadic} cannot be expressed in an OpenAI tool schema")
        raw = get_json_schema(fn)
        raw["function"]["name"] = name
        return OpenAIFunctionToolSchema.model_validate(raw)
    except (ValidationError, ValueError, TypeError, DocstringParsingException, TypeHintParsingException) as exc:
        raise ToolConfigError(f"{where}: no tool schema for {fn.__qualname__!r}: {exc} (a function tool needs a "
                              f"type hint on every parameter and a Google-style docstring with an Args: block, or "
                              f"schema=)") from exc


@contextlib.contextmanager
def _verl_spelling() -> Iterator[None]:
    """While a tool file runs: ``verl.tools.function_tool`` / ``verl.tools.schemas`` resolve to ours when verl is not
    installed (removed again afterwards; an installed verl is left alone)."""
    if "verl" in sys.modules or importlib.util.find_spec("verl") is not None:
        yield
        return
    from rlhf_core.tools import schemas

    names = {"verl": types.ModuleType("verl"), "verl.tools": types.ModuleType("verl.tools"),
             "verl.tools.function_tool": sys.modules[__name__], "verl.tools.schemas": schemas}
    names["verl"].__path__, names["verl.tools"].__path__ = [], []
    names["verl"].tools = names["verl.tools"]
    names["verl.tools"].function_tool, names["verl.tools"].schemas = names["verl.tools.function_tool"], schemas
    sys.modules.update(names)
    try:
        yield
    finally:
        for key in names:
            sys.modules.pop(key, None)


def load_function_tools(path: str | Path) -> dict[str, FunctionTool]:
    """Name → tool for every :func:`function_tool` function of the python file ``path``, in definition order.

    Raises:
        ToolConfigError: naming the file: it is missing, fails to import (the exception is given), declares no
            ``@function_tool`` function (it would offer no tool), a function has no schema (see
            :func:`function_tool`), or two functions have one tool name.
    """
    path = Path(path)
    where = f"function_tool_path {path}"
    if not path.is_file():
        raise ToolConfigError(f"{where}: no such file")
    module_name = "_rlhf_function_tools_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))
    try:
        with _verl_spelling():  # the file may import its siblings through sys.modules, as in verl
            module = exec_user_file(str(path), "function_tool_path", module_name)  # logs its path and sha256
    except Exception as exc:  # noqa: BLE001 - a user's file fails in any way; the message names it
        raise ToolConfigError(f"{where}: cannot be imported: {type(exc).__name__}: {exc}") from exc
    tools: dict[str, FunctionTool] = {}
    for fn in vars(module).values():
        if not callable(fn) or not hasattr(fn, _MARK) or getattr(fn, "__module__", None) != module_name:
            continue
        given_name, given_schema = getattr(fn, _MARK)
        name = given_name or fn.__name__
        if name in tools:
            raise ToolConfigError(f"{where}: two functions are the tool {name!r}")
        tools[name] = FunctionTool(fn, _schema_of(fn, name, given_schema, where))
    if not tools:
        raise ToolConfigError(f"{where}: no @function_tool function in the file (decorate the functions to offer)")
    return tools


def load_all_tools(tool_config_path: str | None, function_tool_path: str | None) -> dict[str, BaseTool]:
    """The tools of both keys (verl's ``load_all_tools``): ``tool_config_path``'s classes, then the function tools;
    ``{}`` when both are null.

    Raises:
        ToolConfigError: from :func:`~rlhf_core.tools.config.load_tools` / :func:`load_function_tools`, or for a
            name both files declare (naming it and both files).
    """
    from rlhf_core.tools.config import load_tools

    tools = load_tools(tool_config_path) if tool_config_path else {}
    functions = load_function_tools(function_tool_path) if function_tool_path else {}
    both = sorted(set(tools) & set(functions))
    if both:
        raise ToolConfigError(f"tools {both} are declared in tool_config_path {tool_config_path} and in "
                              f"function_tool_path {function_tool_path}: each tool name must be unique; rename one")
    return {**tools, **functions}
