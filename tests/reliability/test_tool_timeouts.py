"""Tool time limits hold (issue 32): a tool whose ``async def execute`` blocks far past its timeout (a plain
``time.sleep``, a blocking socket read) or awaits forever gives its trajectory the timeout response at the timeout,
and the other trajectories of the batch finish in their own time. Before the fix a blocking ``execute`` ran on the
rollout's event loop and held every trajectory (and the engine) for its whole duration.

Four trajectories run through the real ``AgentLoopManager`` + ``ToolAgentLoop``: trajectory 0 calls the blocking
tool, 1-3 call a fast one; each generation takes ``GEN_S`` (the policy awaits, as the engine does).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import torch

from rlhf_core.agent.base import MultiTurnSettings, TokenOutput
from rlhf_core.agent.manager import AgentLoopManager
from rlhf_core.agent.registry import load_agent_loop_specs
from rlhf_core.data.prompts import encode
from rlhf_core.protocol import Batch
from rlhf_core.tools.base import BaseTool
from rlhf_core.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from tests.fixtures.agent_fixtures import make_tokenizer

TIMEOUT_S = 2.0   # the blocking tool's config.timeout
BLOCK_S = 60.0    # how long it blocks: 30x the timeout
GEN_S = 0.1       # each generation; a fast trajectory's own time is 2 generations + a fast tool call
ROWS = 4


class BlockingTool(BaseTool):
    """``kind`` (config): ``sleep`` = ``time.sleep(BLOCK_S)``; ``socket`` = a blocking ``recv`` on ``self.sock``
    (nothing is sent until the test ends); ``await`` = ``await asyncio.sleep(BLOCK_S)`` (cooperative).
    Records when execute was cancelled and when the instance was released."""

    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.sock: socket.socket | None = None
        self.cancelled_at: float | None = None
        self.released = threading.Event()

    async def execute(self, instance_id, parameters, **kwargs):
        kind = self.config["kind"]
        if kind == "sleep":
            time.sleep(BLOCK_S)
        elif kind == "socket":
            self.sock.recv(1)
        else:
            try:
                await asyncio.sleep(BLOCK_S)
            except asyncio.CancelledError:
                self.cancelled_at = time.monotonic()
                raise
        return ToolResponse(text="unblocked"), 0.0, {}

    async def release(self, instance_id, **kwargs):
        self.released.set()


class FastTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="fast result"), 0.0, {}


def _tool(cls, name, config):
    schema = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
        "name": name, "description": "test tool", "parameters": {"type": "object", "properties": {}, "required": []}}})
    return cls({"type": "native", **config}, schema)


class RowPolicy:
    """Trajectory ``i`` (request id ``<call>/<i>/turn<k>``): turn 0 calls ``tool_names[i]``, turn 1 answers without
    a call (the trajectory ends). Each generation awaits ``GEN_S``; start and end times are recorded per turn."""

    def __init__(self, tokenizer, tool_names):
        self.tokenizer, self.tool_names = tokenizer, tool_names
        self.times: dict[tuple[int, int], tuple[float, float]] = {}

    async def generate(self, prompt_ids, max_new_tokens, request_id):
        _, row, turn = request_id.split("/")
        i, k = int(row), int(turn.removeprefix("turn"))
        start = time.monotonic()
        await asyncio.sleep(GEN_S)
        call = {"name": self.tool_names[i], "arguments": {}}
        text = f"<tool_call>{json.dumps(call)}</tool_call>" if k == 0 else "The answer is 72."
        ids = (encode(self.tokenizer, text) + [self.tokenizer.eos_token_id])[:max_new_tokens]
        self.times[i, k] = (start, time.monotonic())
        return TokenOutput(ids, [-0.1] * len(ids))


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.mark.parametrize("kind", ["sleep", "socket", "await"])
def test_a_blocking_tool_times_out_alone(tok, kind):
    blocker = _tool(BlockingTool, "blocker", {"timeout": TIMEOUT_S, "kind": kind})
    held, blocker.sock = socket.socketpair()
    tools = {"blocker": blocker, "fast": _tool(FastTool, "fast", {"timeout": TIMEOUT_S})}
    policy = RowPolicy(tok, ["blocker"] + ["fast"] * (ROWS - 1))
    manager = AgentLoopManager(policy, tok, MultiTurnSettings(response_length=300), tools,
                               load_agent_loop_specs(None), "tool_agent", tok.pad_token_id)
    rows = {"raw_prompt": [[{"role": "user", "content": f"What is {i} times 12?"}] for i in range(ROWS)]}
    try:
        start = time.monotonic()
        out = manager.generate_sequences(Batch({"input_ids": torch.zeros((ROWS, 4), dtype=torch.long)}, rows))
        elapsed = time.monotonic() - start
    finally:
        held.close()  # unblocks the socket read of the abandoned call
        blocker.sock.close()

    # the fast trajectories: 2 generations (0.2 s) and a fast tool call each; they finish in their own time,
    # well before the blocked call's timeout fires (before the fix: after BLOCK_S = 60 s)
    own_s = 2 * GEN_S
    for i in range(1, ROWS):
        assert policy.times[i, 1][1] - start < own_s + 1.0 < TIMEOUT_S, (i, policy.times[i, 1][1] - start)
    # the blocked trajectory gets its tool response at the timeout: its next turn starts TIMEOUT_S after its
    # tool call was generated (+ scheduling slack), and the whole batch is done then, not after BLOCK_S
    waited = policy.times[0, 1][0] - policy.times[0, 0][1]
    assert TIMEOUT_S - 0.05 <= waited < TIMEOUT_S + 1.0, waited
    assert elapsed < TIMEOUT_S + own_s + 1.5, elapsed

    response = tok.decode(out["responses"][0][out["response_mask"][0] == 0].tolist(), skip_special_tokens=True)
    assert f"Error: tool blocker timed out after {TIMEOUT_S:g}s" in response
    assert "fast result" in tok.decode(out["responses"][1].tolist(), skip_special_tokens=True)
    assert out.non_tensors["tool_calls"][0] == {"blocker": [1, 1]}  # one call, one failure
    assert [out.non_tensors["tool_calls"][i] for i in range(1, ROWS)] == [{"fast": [1, 0]}] * (ROWS - 1)

    if kind == "await":  # a cooperative tool is stopped at the timeout (cancelled), then released
        assert blocker.released.wait(1.0) and blocker.cancelled_at - policy.times[0, 0][1] < TIMEOUT_S + 1.0
    elif kind == "socket":  # a blocked one is abandoned; once its read returns, its instance is still released
        assert blocker.released.wait(5.0)
    else:  # time.sleep cannot be interrupted: the thread sleeps on, the instance is not released under it
        assert not blocker.released.is_set()


def test_the_sandbox_child_is_killed_at_the_tool_timeout(tmp_path):
    """``code_interpreter`` with a wall limit (30 s) longer than the tool timeout (1 s): at the timeout the call is
    cancelled, which kills the child's process group and removes its work directories; the program never
    writes the file it would write after its sleep."""
    from rlhf_core.tools.runner import call_tool
    from rlhf_core.tools.sandbox import PythonTool

    marker = tmp_path / "still_running"
    tool = _tool(PythonTool, "code_interpreter", {"timeout": 1.0, "wall_seconds": 30, "tmp_root": str(tmp_path)})
    code = f"import time; time.sleep(2); open({str(marker)!r}, 'w').write('x')"
    start = time.monotonic()
    result = asyncio.run(call_tool(tool, {"code": code}, {}))
    assert (result.error, result.text) == ("timeout", "Error: tool code_interpreter timed out after 1s")
    assert 1.0 - 0.05 <= time.monotonic() - start < 1.0 + 1.0
    deadline = time.monotonic() + 5.0  # the killed child's directories are removed by the call's own thread
    while any(p.name.startswith("rlhf_py_") for p in tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(p.name.startswith("rlhf_py_") for p in tmp_path.iterdir())
    time.sleep(max(0.0, start + 2.5 - time.monotonic()))  # past the program's 2 s: a surviving child would
    # have written the marker by now
    assert not marker.exists()


@pytest.mark.parametrize("value", [0, -1, float("nan"), "30s", True])
def test_a_bad_tool_timeout_is_refused_naming_the_file_and_tool(tmp_path, value):
    from rlhf_core.tools.config import ToolConfigError, load_tools

    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n- class_name: rlhf_core.tools.builtin.CalculatorTool\n"
                    f"  config: {{type: native, timeout: {json.dumps(value) if value == value else '.nan'}}}\n"
                    "  tool_schema: {type: function, function: {name: calculator, description: d}}\n")
    with pytest.raises(ToolConfigError, match=rf"{path}, tool #0 \('calculator'\): config.timeout must be a positive "
                                              r"number of seconds, got"):
        load_tools(path)
