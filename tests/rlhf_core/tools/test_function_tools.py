"""multi_turn.function_tool_path: python functions become tools (verl 0.9.1 verl/tools/function_tool.py)."""
from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

from rlhf_core.agent.base import MultiTurnSettings
from rlhf_core.agent.loops import ToolAgentLoop
from rlhf_core.tools import ToolConfigError, ToolResponse
from rlhf_core.tools.function_tool import load_all_tools, load_function_tools, normalize_return
from tests.fixtures.agent_fixtures import ScriptedPolicy, make_tokenizer

# written as for verl: the import is verl's spelling (answered by rlhf_core while the file runs)
TOOLS_PY = '''
from verl.tools.function_tool import function_tool


@function_tool
def multiply(a: int, b: int) -> str:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return str(a * b)


@function_tool("lookup", schema={"type": "function", "function": {"name": "lookup", "description": "look up",
                "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}})
async def _lookup(key):
    return {"key": key}, 0.5


def helper(x: int) -> int:
    """Not a tool: undecorated."""
    return x
'''

TOOL_YAML = """tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config: {type: native}
    tool_schema:
      type: function
      function: {name: multiply, description: clash, parameters: {type: object, properties: {}, required: []}}
"""


@pytest.fixture
def tools_py(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text(TOOLS_PY)
    return path


def test_decorated_functions_become_tools_with_inferred_schemas(tools_py):
    tools = load_function_tools(tools_py)
    assert list(tools) == ["multiply", "lookup"]  # helper is not decorated
    schema = tools["multiply"].get_openai_tool_schema().model_dump(exclude_none=True)
    # transformers.utils.get_json_schema: the docstring's summary and Args lines, int -> "integer", both required
    assert schema["function"]["description"] == "Multiply two integers."
    assert schema["function"]["parameters"]["properties"] == {
        "a": {"type": "integer", "description": "the first factor"},
        "b": {"type": "integer", "description": "the second factor"}}
    assert schema["function"]["parameters"]["required"] == ["a", "b"]
    assert tools["lookup"].tool_schema.function.description == "look up"  # schema= given whole
    assert "verl" not in sys.modules  # the verl spelling is gone once the file has run
    out = asyncio.run(tools["multiply"].execute("i", {"a": 6, "b": 12}))
    assert out == (ToolResponse(text="72"), 0.0, {})
    # an async function is awaited; (dict, reward) -> the dict's JSON and the reward
    assert asyncio.run(tools["lookup"].execute("i", {"key": "x"})) == (ToolResponse(text='{"key": "x"}'), 0.5, {})


def test_loading_logs_the_file_and_its_sha256(tools_py, caplog):
    """The tool file is user code: loaded as rlhf_core.user_code loads reward functions, path and sha256 logged."""
    import hashlib
    import logging

    with caplog.at_level(logging.INFO, logger="rlhf_core.user_code"):
        load_function_tools(tools_py)
    digest = hashlib.sha256(open(tools_py, "rb").read()).hexdigest()
    assert f"function_tool_path: loading {tools_py.resolve()} (sha256 {digest})" in caplog.text


def test_return_values_normalised_as_verl():
    assert normalize_return(ToolResponse(text="t")) == (ToolResponse(text="t"), 0.0, {})
    assert normalize_return(7) == (ToolResponse(text="7"), 0.0, {})
    assert normalize_return(("r", None, None)) == (ToolResponse(text="r"), 0.0, {})  # None reward/metrics: defaults
    assert normalize_return(("r", 0, {"m": 1})) == (ToolResponse(text="r"), 0.0, {"m": 1})
    with pytest.raises(TypeError, match="1 to 3 items"):
        normalize_return(("a", 1, {}, 4))


def test_tool_agent_calls_a_function_tool(tools_py):
    tok = make_tokenizer()
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 12}}</tool_call>'
    loop = ToolAgentLoop(ScriptedPolicy(tok, [call, "done"]), tok, MultiTurnSettings(response_length=300),
                         load_all_tools(None, str(tools_py)))
    out = asyncio.run(loop.run({"raw_prompt": [{"role": "user", "content": "6 times 12?"}]}, "r0"))
    tool_ids = [t for t, m in zip(out.response_ids, out.response_mask) if m == 0]
    assert tok.decode(tool_ids) == "<|im_start|>tool\n72<|im_end|>\n<|im_start|>assistant\n"
    assert out.tool_stats.metrics()["tool_calls/multiply/count"] == 1.0


def test_bad_function_tool_files_are_named(tmp_path, tools_py):
    with pytest.raises(ToolConfigError, match="function_tool_path .*nope.py: no such file"):
        load_function_tools(tmp_path / "nope.py")
    plain = tmp_path / "plain.py"
    plain.write_text("def f(x: int) -> int:\n    return x\n")
    with pytest.raises(ToolConfigError, match="plain.py: no @function_tool function"):
        load_function_tools(plain)
    undocumented = tmp_path / "undocumented.py"
    undocumented.write_text(textwrap.dedent("""
        from rlhf_core.tools.function_tool import function_tool

        @function_tool
        def f(x):
            return x
    """))
    with pytest.raises(ToolConfigError, match="undocumented.py: no tool schema for 'f'"):
        load_function_tools(undocumented)
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    with pytest.raises(ToolConfigError, match="broken.py: cannot be imported: ModuleNotFoundError"):
        load_function_tools(broken)
    yaml_file = tmp_path / "tools.yaml"
    yaml_file.write_text(TOOL_YAML)
    with pytest.raises(ToolConfigError, match=r"tools \['multiply'\] are declared in tool_config_path"):
        load_all_tools(str(yaml_file), str(tools_py))
    assert load_all_tools(None, None) == {}
