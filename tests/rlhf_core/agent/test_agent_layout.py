"""Token layout of tool-agent trajectories with a scripted policy: exact ids, response_mask, position ids,
turn limits, response_length, tool-response truncation, parallel calls, a hanging tool."""
from __future__ import annotations

import asyncio
import time

import pytest
import torch

from rlhf_core.agent.base import MultiTurnSettings
from rlhf_core.agent.layout import pack_trajectories
from rlhf_core.agent.loops import SingleTurnAgentLoop, ToolAgentLoop, render_turn
from rlhf_core.agent.registry import AgentConfigError, check_rows, load_agent_loop_specs
from rlhf_core.data.prompts import encode
from rlhf_core.protocol import Batch
from tests.fixtures.agent_fixtures import ScriptedPolicy, make_tokenizer, tool

CALL = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}</tool_call>'
ROW = {"raw_prompt": [{"role": "user", "content": "What is 6 times 12?"}],
       "extra_info": {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}}}
T_ECHO = "tests.rlhf_core.tools.test_tools.SleepEchoTool"


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def _gsm8k_tools():
    return {"calc_gsm8k_reward": tool("verl.tools.gsm8k_tool.Gsm8kTool", "calc_gsm8k_reward")}


def _run(loop, row=ROW):
    return asyncio.run(loop.run(row, "r0"))


def test_exact_token_layout(tok):
    policy = ScriptedPolicy(tok, [f"Let me check. {CALL}", "The answer is 72."])
    loop = ToolAgentLoop(policy, tok, MultiTurnSettings(response_length=200), _gsm8k_tools())
    out = _run(loop)
    # ChatML (rlhf_core.models.tiny.CHAT_TEMPLATE) renders the tool turn after the assistant's <|im_end|> as
    # "<|im_start|>tool\n{content}<|im_end|>\n" and then the next generation prompt "<|im_start|>assistant\n"
    tool_text = "<|im_start|>tool\nCurrent parsed answer='72' reward=1.0<|im_end|>\n<|im_start|>assistant\n"
    tool_ids = encode(tok, tool_text)
    assert render_turn(tok, [{"role": "tool", "content": "Current parsed answer='72' reward=1.0"}]) == tool_ids
    a1, a2 = policy.turn_ids(0), policy.turn_ids(1)
    assert out.prompt_ids == encode(tok, "<|im_start|>user\nWhat is 6 times 12?<|im_end|>\n<|im_start|>assistant\n")
    assert out.response_ids == a1 + tool_ids + a2
    assert out.response_mask == [1] * len(a1) + [0] * len(tool_ids) + [1] * len(a2)
    # log-probs of each assistant turn restart at -0.1; tool tokens get 0.0
    assert out.response_logprobs == ([-(j + 1) / 10 for j in range(len(a1))] + [0.0] * len(tool_ids)
                                     + [-(j + 1) / 10 for j in range(len(a2))])
    # the 2nd request continues the whole trajectory; its budget is what is left of response_length
    assert policy.calls[1][0] == out.prompt_ids + a1 + tool_ids and policy.calls[1][1] == 200 - len(a1 + tool_ids)
    assert out.num_turns == 4 and out.tool_rewards == [0.0]  # prompt + 2 assistant + 1 tool; improving answer
    assert out.tool_stats.metrics()["tool_calls/calc_gsm8k_reward/count"] == 1.0


def test_packed_batch_masks_and_positions(tok):
    policy = ScriptedPolicy(tok, [f"ok {CALL}", "done"])
    loop = ToolAgentLoop(policy, tok, MultiTurnSettings(response_length=120), _gsm8k_tools())
    single = SingleTurnAgentLoop(ScriptedPolicy(tok, ["done"]), tok, MultiTurnSettings(response_length=120))
    outs = [_run(loop), asyncio.run(single.run({"raw_prompt_ids": [5, 6, 7]}, "r1"))]
    prompt_batch = Batch({"input_ids": torch.zeros((2, 4), dtype=torch.long)}, {"data_source": ["a", "b"]})
    batch = pack_trajectories(outs, prompt_batch, 120, tok.pad_token_id)
    P = len(outs[0].prompt_ids)  # wider than the 4-token prompt batch, so P grows to the longest prompt
    assert batch["prompts"].shape == (2, P) and batch["responses"].shape == (2, 120)
    n0, n1 = len(outs[0].response_ids), len(outs[1].response_ids)
    # row 1: 3 prompt tokens right-aligned, then its response; everything else padding
    assert batch["attention_mask"][1].tolist() == [0] * (P - 3) + [1] * (3 + n1) + [0] * (120 - n1)
    assert batch["position_ids"][1, P - 3:P + n1].tolist() == list(range(3 + n1))
    assert batch["position_ids"][0, P:P + n0].tolist() == list(range(P, P + n0))  # one contiguous sequence
    assert batch["response_mask"][0, :n0].tolist() == outs[0].response_mask
    assert batch["response_mask"][0, n0:].sum() == 0 and batch["attention_mask"][0, P:P + n0].sum() == n0
    # tool tokens: attended (attention 1) but no loss (response_mask 0) and log-prob zeroed
    tool_pos = [i for i, m in enumerate(outs[0].response_mask) if m == 0]
    assert tool_pos and all(batch["rollout_log_probs"][0, i] == 0 for i in tool_pos)
    assert batch.non_tensors["num_turns"].tolist() == [4, 2]
    assert batch.meta["metrics"]["num_turns/mean"] == 3.0 and batch.meta["metrics"]["num_turns/min"] == 2.0


def test_turn_limits(tok):
    always_call = [f"again {CALL}"]
    out = _run(ToolAgentLoop(ScriptedPolicy(tok, always_call), tok,
                             MultiTurnSettings(response_length=400, max_assistant_turns=2), _gsm8k_tools()))
    assert out.num_turns == 1 + 2 + 1  # 2 assistant turns, the tool turn between them, none after the last
    out = _run(ToolAgentLoop(ScriptedPolicy(tok, always_call), tok,
                             MultiTurnSettings(response_length=400, max_user_turns=2), _gsm8k_tools()))
    assert out.num_turns == 1 + 3 + 2  # stops after the assistant turn that follows the 2nd tool turn
    assert sum(out.response_mask) == 3 * len(ScriptedPolicy(tok, always_call).turn_ids(0))


def test_response_length_bounds_the_trajectory(tok):
    policy = ScriptedPolicy(tok, [f"ok {CALL}", "final answer"])
    a1 = policy.turn_ids(0)
    # room for the first turn and part of the tool turn: the tool turn does not fit, so it is dropped
    out = _run(ToolAgentLoop(policy, tok, MultiTurnSettings(response_length=len(a1) + 5), _gsm8k_tools()))
    assert out.response_ids == a1 and out.num_turns == 2 and len(policy.calls) == 1
    # a first turn longer than response_length is cut to it
    cut = _run(ToolAgentLoop(ScriptedPolicy(tok, [f"ok {CALL}"]), tok, MultiTurnSettings(response_length=7),
                             _gsm8k_tools()))
    assert cut.response_ids == a1[:7] and cut.response_mask == [1] * 7


@pytest.mark.parametrize("side,expected", [("left", "slept 0 ...(truncated)"),
                                           ("right", "(truncated)...ept 0 []"),
                                           ("middle", "slep...(truncated)...0 []")])
def test_long_tool_response_truncated_each_side(tok, side, expected):
    call = '<tool_call>{"name": "echo", "arguments": {"x": "0"}}</tool_call>'
    settings = MultiTurnSettings(response_length=300, max_tool_response_length=8, tool_response_truncate_side=side)
    out = _run(ToolAgentLoop(ScriptedPolicy(tok, [call, "done"]), tok, settings, {"echo": tool(T_ECHO, "echo")}))
    tool_ids = [t for t, m in zip(out.response_ids, out.response_mask) if m == 0]
    # "slept 0 []" (10 chars) cut to 8: left keeps the first 8, right the last 8, middle 4 + 4
    assert tok.decode(tool_ids) == f"<|im_start|>tool\n{expected}<|im_end|>\n<|im_start|>assistant\n"


def test_parallel_calls_in_one_turn(tok):
    calls = "".join(f'<tool_call>{{"name": "echo", "arguments": {{"x": "0.{k}"}}}}</tool_call>' for k in (4, 5, 6))
    settings = MultiTurnSettings(response_length=400, max_parallel_calls=2)
    loop = ToolAgentLoop(ScriptedPolicy(tok, [calls, "done"]), tok, settings, {"echo": tool(T_ECHO, "echo")})
    start = time.monotonic()
    out = _run(loop)
    elapsed = time.monotonic() - start
    assert elapsed < 0.85  # 0.4 s and 0.5 s calls run together (in series: 0.9 s); the 0.6 s one is dropped
    tool_ids = [t for t, m in zip(out.response_ids, out.response_mask) if m == 0]
    assert tok.decode(tool_ids) == ("<|im_start|>tool\nslept 0.4 []<|im_end|>\n<|im_start|>tool\nslept 0.5 []"
                                    "<|im_end|>\n<|im_start|>assistant\n")  # both in one tool turn, call order
    assert out.tool_stats.metrics()["tool_calls/echo/count"] == 2.0


def test_hanging_tool_times_out_and_trajectory_continues(tok):
    call = '<tool_call>{"name": "hang", "arguments": {}}</tool_call>'
    tools = {"hang": tool("tests.rlhf_core.tools.test_tools.HangingTool", "hang", {"timeout": 0.3})}
    out = _run(ToolAgentLoop(ScriptedPolicy(tok, [call, "giving up"]), tok, MultiTurnSettings(response_length=300),
                             tools))
    tool_ids = [t for t, m in zip(out.response_ids, out.response_mask) if m == 0]
    assert "Error: tool hang timed out after 0.3s" in tok.decode(tool_ids)
    assert out.num_turns == 4 and out.tool_stats.metrics()["tool_calls/hang/failures"] == 1.0


def test_bad_tool_call_becomes_error_response(tok):
    out = _run(ToolAgentLoop(ScriptedPolicy(tok, ["<tool_call>{oops</tool_call>", "done"]), tok,
                             MultiTurnSettings(response_length=300), _gsm8k_tools()))
    tool_ids = [t for t, m in zip(out.response_ids, out.response_mask) if m == 0]
    assert "Error: tool call is not valid JSON" in tok.decode(tool_ids)
    assert out.tool_stats.metrics()["tool_calls/malformed/failures"] == 1.0


def test_rows_naming_unknown_tools_or_loops_fail(tmp_path):
    rows = [ROW, {"extra_info": {"tools_kwargs": {"web_search": {}}}}]
    with pytest.raises(AgentConfigError, match=r"train.parquet row 1: extra_info.tools_kwargs names unknown tools "
                                               r"\['web_search'\]"):
        check_rows(rows, ["train.parquet row 0", "train.parquet row 1"], ["tool_agent"], "tool_agent",
                   ["calc_gsm8k_reward"])
    with pytest.raises(AgentConfigError, match="row 0: agent_name 'mystery'"):
        check_rows([{"agent_name": "mystery"}], ["row 0"], ["tool_agent"], "tool_agent", [])


def test_user_agent_loop_by_path(tmp_path):
    path = tmp_path / "loops.yaml"
    path.write_text("- name: my_agent\n  _target_: rlhf_core.agent.loops.ToolAgentLoop\n")
    specs = load_agent_loop_specs(path)
    assert specs["my_agent"][0] is ToolAgentLoop and {"single_turn_agent", "tool_agent"} <= set(specs)
    path.write_text("- name: bad\n  _target_: collections.OrderedDict\n")
    with pytest.raises(AgentConfigError, match=r"entry #0 \('bad'\): 'collections.OrderedDict' is not an AgentLoopBase"):
        load_agent_loop_specs(path)


def test_reward_manager_decodes_the_whole_trajectory(tok):
    from rlhf_core.reward.managers import decode_batch

    policy = ScriptedPolicy(tok, [f"ok {CALL}", "The answer is #### 72"])
    out = _run(ToolAgentLoop(policy, tok, MultiTurnSettings(response_length=200), _gsm8k_tools()))
    prompt_batch = Batch({"input_ids": torch.zeros((1, 4), dtype=torch.long)},
                         {"data_source": ["openai/gsm8k"], "reward_model": [{"ground_truth": "72"}]})
    batch = pack_trajectories([out], prompt_batch, 200, tok.pad_token_id)
    (sample,) = decode_batch(batch, tok)
    # the score goes on the last assistant token, past the masked tool turn (not at sum(response_mask) - 1)
    assert sample.valid_response_length == len(out.response_ids) > sum(out.response_mask)
    assert sample.response_str.endswith("The answer is #### 72") and "Current parsed" in sample.response_str
