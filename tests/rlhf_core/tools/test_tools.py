"""Tools: config loading (verl's format, bad input named), built-in tools, hermes parsing, the safe runner."""
from __future__ import annotations

import asyncio
import textwrap

import pytest

from rlhf_core.tools import ToolCallStats, ToolConfigError, load_tools, parse_hermes, run_tool_calls, truncate_tool_response
from rlhf_core.tools.base import BaseTool
from rlhf_core.tools.builtin import evaluate_arithmetic
from rlhf_core.tools.schemas import FunctionCall, ToolResponse

GSM8K_ENTRY = textwrap.dedent("""
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config: {type: native}
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "reward of a gsm8k answer"
        parameters:
          type: "object"
          properties: {answer: {type: "string", description: "the answer"}}
          required: ["answer"]
""")


def _entry(class_name: str, name: str, config: str = "{type: native}", extra: str = "") -> str:
    return textwrap.dedent(f"""
      - class_name: {class_name}
        config: {config}
        tool_schema:
          type: function
          function:
            name: {name}
            description: test tool
            parameters: {{type: object, properties: {{x: {{type: string}}}}, required: [x{extra}]}}
    """)


def _write(tmp_path, body: str):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n" + body)  # every entry is a column-0 list item
    return path


# tools used by the runner tests, loaded by class path from this module
class RaisingTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("boom\nsecond line")


class HangingTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(3600)


class NonStringTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=42), 0.0, {}


class SleepEchoTool(BaseTool):
    """Sleeps ``x`` seconds then echoes it and the execute_kwargs it got."""

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(float(parameters["x"]))
        return ToolResponse(text=f"slept {parameters['x']} {sorted(kwargs.items())}"), 0.5, {}


def test_verl_gsm8k_config_loads_and_scores(tmp_path):
    tools = load_tools(_write(tmp_path, GSM8K_ENTRY))
    tool = tools["calc_gsm8k_reward"]
    assert tool.get_openai_tool_schema().model_dump()["function"]["parameters"]["required"] == ["answer"]

    async def flow():
        iid, _ = await tool.create(create_kwargs={"ground_truth": "72"})
        wrong = await tool.execute(iid, {"answer": "70"})
        right = await tool.execute(iid, {"answer": "72"})
        again = await tool.execute(iid, {"answer": "#### 72"})
        return wrong, right, again, await tool.calc_reward(iid)

    wrong, right, again, final = asyncio.run(flow())
    # verl: 0.0 score for a wrong answer, which does not beat the initial 0.0 → step reward -0.05
    assert (wrong[0].text, wrong[1]) == ("Current parsed answer='70' reward=0.0", -0.05)
    assert (right[0].text, right[1]) == ("Current parsed answer='72' reward=1.0", 0.0)  # improved → no penalty
    assert again[1] == -0.05 and final == 1.0  # re-submitting the same score is penalised


def test_missing_class_names_file_and_tool(tmp_path):
    path = _write(tmp_path, GSM8K_ENTRY + _entry("no_such_pkg.Tool", "ghost"))
    with pytest.raises(ToolConfigError, match=rf"{path}.*tool #1 \('ghost'\).*no_such_pkg.Tool"):
        load_tools(path)


def test_invalid_schema_names_file_and_tool(tmp_path):
    path = _write(tmp_path, _entry("rlhf_core.tools.builtin.CalculatorTool", "calc", extra=", y"))
    with pytest.raises(ToolConfigError, match=rf"{path}.*'calc'.*undeclared properties \['y'\]"):
        load_tools(path)
    bad_type = tmp_path / "t2.yaml"
    bad_type.write_text("tools:\n- class_name: rlhf_core.tools.builtin.CalculatorTool\n  config: {type: native}\n"
                        "  tool_schema: {type: func, function: {name: calc, description: d}}\n")
    with pytest.raises(ToolConfigError, match=r"t2.yaml, tool #0 \('calc'\): tool_schema is not a valid"):
        load_tools(bad_type)


def test_not_a_tool_class_and_mcp_are_refused(tmp_path):
    with pytest.raises(ToolConfigError, match="'collections.OrderedDict' is not a tool class"):
        load_tools(_write(tmp_path, _entry("collections.OrderedDict", "od")))
    with pytest.raises(ToolConfigError, match="config.type 'mcp' is not supported"):
        load_tools(_write(tmp_path, _entry("rlhf_core.tools.builtin.CalculatorTool", "c", config="{type: mcp}")))
    with pytest.raises(ToolConfigError, match="a second tool named 'c'"):
        load_tools(_write(tmp_path, _entry("rlhf_core.tools.builtin.CalculatorTool", "c")
                          + _entry("rlhf_core.tools.builtin.CalculatorTool", "c")))


@pytest.mark.parametrize("expr,value", [("3 * (4 + 2)", 18), ("7 / 2", 3.5), ("-2 ** 2", -4), ("17 // 5 % 2", 1),
                                        ("1.5e2 + 1", 151.0)])
def test_calculator_values(expr, value):
    assert evaluate_arithmetic(expr) == value


@pytest.mark.parametrize("expr,why", [("__import__('os')", "Call is not allowed"), ("x + 1", "Name is not allowed"),
                                      ("'a' * 3", "Constant is not allowed"), ("9 ** 9 ** 9", "exponent"),
                                      ("1 / 0", "division by zero"), ("1e300 * 1e300", "out of range"),
                                      ("1 +", "not an arithmetic expression")])
def test_calculator_refuses(expr, why):
    with pytest.raises(ValueError, match=why):
        evaluate_arithmetic(expr)


def test_hermes_parsing():
    text = ('I will check.<tool_call>{"name": "calc", "arguments": {"x": "1"}}</tool_call>'
            '<tool_call>{"name": "calc", "arguments": "{\\"x\\": \\"2\\"}"}</tool_call>'
            '<tool_call>{bad json}</tool_call><tool_call>{"arguments": {}}</tool_call>'
            '<tool_call>{"name": "calc", "arguments": [1]}</tool_call> done <tool_call>{"name": "x"}')
    content, calls = parse_hermes(text)
    assert content == 'I will check. done <tool_call>{"name": "x"}'  # unclosed block stays text
    assert calls[0] == FunctionCall("calc", {"x": "1"}) and calls[1] == FunctionCall("calc", {"x": "2"})
    assert calls[2].error.startswith("tool call is not valid JSON")
    assert calls[3].error.startswith("tool call needs")
    assert calls[4].error == "tool call arguments must be a JSON object"


def test_truncation_each_side():
    text = "abcdefghij"
    assert truncate_tool_response(text, 10, "left") == text  # at the limit: unchanged
    assert truncate_tool_response(text, 4, "left") == "abcd...(truncated)"
    assert truncate_tool_response(text, 4, "right") == "(truncated)...ghij"
    assert truncate_tool_response(text, 4, "middle") == "ab...(truncated)...ij"
    with pytest.raises(ValueError, match="truncate_side must be one of"):
        truncate_tool_response(text, 4, "top")


@pytest.fixture
def runner_tools(tmp_path):
    here = "tests.rlhf_core.tools.test_tools"
    body = (_entry(f"{here}.RaisingTool", "raiser") + _entry(f"{here}.HangingTool", "hanger", "{type: native, timeout: 0.2}")
            + _entry(f"{here}.NonStringTool", "nonstring") + _entry(f"{here}.SleepEchoTool", "sleeper"))
    return load_tools(_write(tmp_path, body))


def test_failures_become_error_responses_and_are_counted(runner_tools):
    stats = ToolCallStats()
    calls = [FunctionCall("raiser", {}), FunctionCall("hanger", {}), FunctionCall("nonstring", {}),
             FunctionCall("nope", {}), FunctionCall("", {}, error="tool call is not valid JSON (x)"),
             FunctionCall("sleeper", {"x": "0"})]
    results = asyncio.run(run_tool_calls(calls, runner_tools, {}, 10, 256, "middle", stats))
    assert [r.text for r in results] == [
        "Error: tool raiser failed: RuntimeError: boom",
        "Error: tool hanger timed out after 0.2s",
        "Error: tool nonstring returned a non-string response",
        "Error: unknown tool 'nope'; available: ['hanger', 'nonstring', 'raiser', 'sleeper']",
        "Error: tool call is not valid JSON (x)",
        "slept 0 []"]
    assert [r.reward for r in results] == [0.0] * 5 + [0.5]
    assert stats.metrics() == {
        "tool_calls/hanger/count": 1.0, "tool_calls/hanger/failures": 1.0,
        "tool_calls/malformed/count": 2.0, "tool_calls/malformed/failures": 2.0,
        "tool_calls/nonstring/count": 1.0, "tool_calls/nonstring/failures": 1.0,
        "tool_calls/raiser/count": 1.0, "tool_calls/raiser/failures": 1.0,
        "tool_calls/sleeper/count": 1.0, "tool_calls/sleeper/failures": 0.0,
        "tool_calls/total": 6.0, "tool_calls/failures": 5.0}


def test_parallel_calls_run_concurrently_and_are_capped(runner_tools):
    loop_time = {}

    async def timed():
        start = asyncio.get_running_loop().time()
        results = await run_tool_calls([FunctionCall("sleeper", {"x": "0.4"})] * 4, runner_tools,
                                       {"sleeper": {"execute_kwargs": {"k": 1}}}, 3, 256, "left", ToolCallStats())
        loop_time["elapsed"] = asyncio.get_running_loop().time() - start
        return results

    results = asyncio.run(timed())
    assert len(results) == 3  # max_parallel_calls=3: the 4th call is dropped, as verl does
    assert all(r.text == "slept 0.4 [('k', 1)]" for r in results)  # execute_kwargs reach execute()
    assert loop_time["elapsed"] < 0.8  # three 0.4 s calls in series would take 1.2 s


def _write_multiturn_gsm8k(tmp_path) -> None:
    """One GSM8K question ("6 times 12", answer 72) in both raw splits, through `rlhf data gsm8k --multiturn` into
    ``tmp_path/out/{train,test}.parquet``."""
    import json

    from rlhf_core.data.cli import main

    src = tmp_path / "raw"
    src.mkdir()
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text(json.dumps({"question": "What is 6 times 12?",
                                                        "answer": "6*12=72\n#### 72"}) + "\n")
    assert main(["gsm8k", "--local-dir", str(src), "--out", str(tmp_path / "out"), "--multiturn"]) == 0


def test_gsm8k_multiturn_data(tmp_path):
    """`rlhf data gsm8k --multiturn` writes verl's multi-turn schema, and its rows pass the tool-name check."""
    import pyarrow.parquet as pq

    from rlhf_core.agent.registry import check_rows

    _write_multiturn_gsm8k(tmp_path)
    row = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()[0]
    assert row["agent_name"] == "tool_agent"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and "calc_gsm8k_reward" in row["prompt"][0]["content"]
    assert row["extra_info"]["tools_kwargs"]["calc_gsm8k_reward"]["create_kwargs"]["ground_truth"] == "72"
    assert row["extra_info"]["need_tools_kwargs"] is True and row["reward_model"]["ground_truth"] == "72"
    check_rows([row], ["train.parquet row 0"], ["tool_agent"], "tool_agent", ["calc_gsm8k_reward"])


def test_tool_sft_traces_teach_the_call_format(tmp_path):
    """The gsm8k_tools pipeline task's SFT traces: question → tool call (reference answer) → the tool's own
    response → final answer; the SFT dataset trains on exactly the two assistant turns; the call parses."""
    import pyarrow.parquet as pq

    from rlhf_core.data.gsm8k_multiturn import add_tool_traces
    from rlhf_core.data.sft_dataset import SFTDataset
    from tests.fixtures.agent_fixtures import make_tokenizer
    from tests.fixtures.data_fixtures import sft_data_cfg

    _write_multiturn_gsm8k(tmp_path)
    path = add_tool_traces(str(tmp_path / "out" / "train.parquet"), str(tmp_path / "sft.parquet"))
    row = pq.read_table(path).to_pylist()[0]
    call = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}</tool_call>'
    assert row["messages"][2:] == [{"role": "assistant", "content": call},
                                   {"role": "tool", "content": "Current parsed answer='72' reward=1.0"},
                                   {"role": "assistant", "content": "#### 72"}]
    assert row["messages"][:2] == row["prompt"] and row["agent_name"] == "tool_agent"  # the RL columns are kept
    assert parse_hermes(call)[1][0].arguments == {"answer": "72"}
    tok = make_tokenizer()
    item = SFTDataset(path, tok, sft_data_cfg(multiturn={"enable": True, "messages_key": "messages"},
                                              max_length=512))[0]
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
    trained = [ids[i + 1] for i in range(len(ids) - 1) if mask[i]]  # the tokens the loss is taken on
    assert tok.decode(trained) == f"{call}<|im_end|>\n#### 72<|im_end|>\n"
