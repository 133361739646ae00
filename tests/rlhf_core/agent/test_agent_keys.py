"""Effects of rollout.agent.num_workers, multi_turn.use_inference_chat_template and
multi_turn.tokenization_sanity_check_mode on agent-loop rollouts (scripted policy / tiny model, a few seconds)."""
from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from rlhf_core.agent.base import AgentLoopBase, AgentLoopOutput, MultiTurnSettings
from rlhf_core.agent.loops import ToolAgentLoop, render_turn
from rlhf_core.agent.manager import AgentLoopManager
from rlhf_core.agent.registry import load_agent_loop_specs, settings_from_config
from rlhf_core.agent.sanity import tokenization_mismatch
from rlhf_core.data.prompts import encode
from rlhf_core.models.tiny import CHAT_TEMPLATE
from rlhf_core.protocol import Batch
from rlhf_core.workers.rollout.agent_rollout import AgentRollout
from rlhf_core.workers.rollout.hf_rollout import HFRollout
from tests.fixtures.agent_fixtures import ScriptedPolicy, make_model, make_tokenizer
from tests.rlhf_core.agent.test_agent_layout import (  # noqa: F401 - tok: the tokenizer fixture
    CALL, ROW, _gsm8k_tools, tok)
from tests.rlhf_core.agent.test_agent_rollout import _batch, _rollout_cfg

PROMPT_TEXT = "<|im_start|>user\nWhat is 6 times 12?<|im_end|>\n<|im_start|>assistant\n"
TOOL_TEXT = "<|im_start|>tool\nCurrent parsed answer='72' reward=1.0<|im_end|>\n<|im_start|>assistant\n"


def _tool_loop(tok, turns, **settings):
    policy = ScriptedPolicy(tok, turns)
    return policy, ToolAgentLoop(policy, tok, MultiTurnSettings(**{"response_length": 200, **settings}), _gsm8k_tools())


# --- rollout.agent.num_workers ---------------------------------------------------------------------------------

def test_num_workers_gives_the_same_packed_batch(tmp_path, tok):
    model = make_model(tok)
    outs = {}
    for n in (1, 2, 3):
        cfg = _rollout_cfg(tmp_path, mode="async", **{"agent.num_workers": n, "max_num_seqs": 4})
        rollout = AgentRollout(HFRollout(model, tok, cfg, seed=5), tok, cfg)
        assert rollout.num_workers == n
        outs[n] = rollout.generate_sequences(_batch(6))
    for n in (2, 3):
        for key in ("prompts", "responses", "response_mask", "attention_mask", "position_ids", "rollout_log_probs"):
            assert torch.equal(outs[1][key], outs[n][key]), (n, key)
        assert outs[1].non_tensors["num_turns"].tolist() == outs[n].non_tensors["num_turns"].tolist()
    assert outs[1]["response_mask"].sum() > 0


class RecordingLoop(AgentLoopBase):
    """Records (loop instance, request id) so the test sees which worker's loop ran which row."""

    seen: list[tuple[int, str]] = []

    async def run(self, row, request_id):
        RecordingLoop.seen.append((id(self), request_id))
        out = await self.policy.generate([1, 2], self.settings.response_length, request_id)
        return AgentLoopOutput([1, 2], out.token_ids, [1] * len(out.token_ids))


def test_num_workers_cuts_contiguous_chunks_each_with_its_own_loops(tmp_path, tok):
    spec = tmp_path / "loops.yaml"
    spec.write_text(f"- name: recording\n  _target_: {__name__}.RecordingLoop\n")
    specs = load_agent_loop_specs(spec)
    manager = AgentLoopManager(ScriptedPolicy(tok, ["done"]), tok, MultiTurnSettings(response_length=8), {}, specs,
                               "recording", tok.pad_token_id, num_workers=3)
    # np.array_split sizes: 10 rows over 3 workers = 4 + 3 + 3; 2 rows over 3 workers = 1 + 1 (no empty worker)
    assert manager.worker_chunks(10) == [range(0, 4), range(4, 7), range(7, 10)]
    assert manager.worker_chunks(2) == [range(0, 1), range(1, 2)]
    RecordingLoop.seen = []
    rows = {"raw_prompt_ids": [[1, 2]] * 7}
    out = manager.generate_sequences(Batch({"input_ids": torch.zeros((7, 2), dtype=torch.long)}, rows, {}))
    assert out["responses"].shape[0] == 7
    instance_of = {rid: inst for inst, rid in RecordingLoop.seen}
    # 7 rows over 3 workers: rows 0-2, 3-4, 5-6; one loop instance per worker, distinct across workers
    groups = [{instance_of[f"0/{i}"] for i in chunk} for chunk in (range(0, 3), range(3, 5), range(5, 7))]
    assert all(len(g) == 1 for g in groups) and len(set.union(*groups)) == 3
    with pytest.raises(ValueError, match=r"agent.num_workers must be >= 1, got 0"):
        AgentLoopManager(None, tok, MultiTurnSettings(response_length=8), {}, specs, "recording", 0, num_workers=0)


# --- multi_turn.use_inference_chat_template --------------------------------------------------------------------

def test_inference_chat_template_changes_the_engine_context_not_the_layout(tok):
    outs, contexts = {}, {}
    for flag in (False, True):
        policy, loop = _tool_loop(tok, [f"Let me check. {CALL}", "The answer is 72."], use_inference_chat_template=flag)
        outs[flag] = asyncio.run(loop.run(ROW, "r0"))
        contexts[flag] = policy.calls[1][0]  # what the engine continued at the 2nd assistant turn
        a1, tool_ids = policy.turn_ids(0), encode(tok, TOOL_TEXT)
        assert policy.calls[0][0] == encode(tok, PROMPT_TEXT)  # the first turn's context is the prompt either way
    for field in ("prompt_ids", "response_ids", "response_mask", "response_logprobs"):
        assert getattr(outs[False], field) == getattr(outs[True], field), field
    # False: the trajectory's own ids; the assistant turn ends at its sampled EOS (<|im_end|>), the tool turn follows
    assert contexts[False] == encode(tok, PROMPT_TEXT) + a1 + tool_ids
    # True: ChatML re-rendered from the messages, so the "\n" the template puts after <|im_end|> is there
    assert contexts[True] == encode(tok, PROMPT_TEXT + f"Let me check. {CALL}<|im_end|>\n" + TOOL_TEXT)
    assert contexts[True] != contexts[False]


def test_inference_template_that_drops_reasoning_gives_the_engine_no_past_reasoning(tok):
    # a QwQ-like template: earlier assistant turns lose their <think>...</think> part when rendered
    stripping = CHAT_TEMPLATE.replace("message['content'] + '<|im_end|>' }}{% endgeneration %}",
                                      "message['content'].split('</think>')[-1] + '<|im_end|>' }}{% endgeneration %}")
    assert stripping != CHAT_TEMPLATE
    tok2 = make_tokenizer()
    tok2.chat_template = stripping
    first = f"<think>six twelves</think>{CALL}"
    policy, loop = _tool_loop(tok2, [first, "The answer is 72."], use_inference_chat_template=True)
    out = asyncio.run(loop.run(ROW, "r0"))
    assert out.response_ids[: len(policy.turn_ids(0))] == policy.turn_ids(0)  # training keeps the reasoning
    assert "six twelves" in tok2.decode(out.response_ids)
    assert policy.calls[1][0] == encode(tok2, PROMPT_TEXT + f"{CALL}<|im_end|>\n" + TOOL_TEXT)  # the engine does not
    assert "six twelves" not in tok2.decode(policy.calls[1][0])


# --- multi_turn.tokenization_sanity_check_mode -----------------------------------------------------------------

def test_sanity_check_modes_on_hand_made_ids(tok):
    full = encode(tok, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n")
    assert all(tokenization_mismatch(tok, full, full, m, "row 0") is None for m in ("strict", "ignore_strippable"))
    # whitespace only: the "\n" after the first <|im_end|> is missing from the incremental ids
    no_newline = encode(tok, "<|im_start|>user\nq<|im_end|><|im_start|>assistant\nok<|im_end|>\n")
    k = len(encode(tok, "<|im_start|>user\nq<|im_end|>"))  # the first token after that <|im_end|> differs
    assert full[:k] == no_newline[:k] and full[k] != no_newline[k]
    msg = tokenization_mismatch(tok, no_newline, full, "strict", "row 3", prompt_length=2)
    assert msg.startswith("row 3: the incrementally built token ids differ") and "mode=strict" in msg
    assert f"first differing token at position {k} (response position {k - 2})" in msg
    assert tokenization_mismatch(tok, no_newline, full, "ignore_strippable", "row 3") is None
    assert tokenization_mismatch(tok, no_newline, full, "disable", "row 3") is None
    # a text difference ("ok" vs "no"): reported by strict and ignore_strippable, not by disable
    other = encode(tok, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nno<|im_end|>\n")
    msg = tokenization_mismatch(tok, other, full, "ignore_strippable", "row 5")
    start = len("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")  # character where "no" starts
    assert msg.startswith("row 5:") and f"first non-whitespace text difference at character {start}" in msg
    # difflib keeps the common "o": the first opcode inserts "n" at character 51 (full: empty span at 51);
    # ten characters of context each side of the span
    assert "incremental 'assistant\\nno<|im_end|' vs full 'assistant\\nok<|im_end'" in msg
    assert "first differing token" in tokenization_mismatch(tok, other, full, "strict", "row 5")
    assert tokenization_mismatch(tok, other, full, "disable", "row 5") is None
    with pytest.raises(ValueError, match=r"tokenization_sanity_check_mode='loose': use one of"):
        tokenization_mismatch(tok, other, full, "loose", "row 5")


def test_sanity_check_in_the_tool_loop_and_the_manager_warning(tok, caplog):
    turns = [f"Let me check. {CALL}", "The answer is 72."]
    a1 = ScriptedPolicy(tok, turns).turn_ids(0)
    prompt = encode(tok, PROMPT_TEXT)
    # strict: the layout lacks ChatML's "\n" after each <|im_end|>: first difference right after turn 1's EOS
    out = asyncio.run(_tool_loop(tok, turns, tokenization_sanity_check_mode="strict")[1].run(ROW, "0/4"))
    msg = out.extra["tokenization_mismatch"]
    assert msg.startswith("trajectory 0/4 (<call>/<row>)")
    assert f"position {len(prompt) + len(a1)} (response position {len(a1)})" in msg
    # ignore_strippable: only those newlines differ
    out = asyncio.run(_tool_loop(tok, turns, tokenization_sanity_check_mode="ignore_strippable")[1].run(ROW, "0/4"))
    assert out.extra["tokenization_mismatch"] is None
    # a last turn cut by response_length (no EOS) is checked up to its start: still only newlines differ
    tool_len = len(render_turn(tok, [{"role": "tool", "content": "Current parsed answer='72' reward=1.0"}]))
    cut = len(a1) + tool_len + 2
    out = asyncio.run(_tool_loop(tok, turns, response_length=cut,
                                 tokenization_sanity_check_mode="ignore_strippable")[1].run(ROW, "0/4"))
    assert len(out.response_ids) == cut and out.extra["tokenization_mismatch"] is None
    out = asyncio.run(_tool_loop(tok, turns, tokenization_sanity_check_mode="disable")[1].run(ROW, "0/4"))
    assert "tokenization_mismatch" not in out.extra
    # the manager logs one warning per batch naming how many trajectories and the first one
    manager = AgentLoopManager(ScriptedPolicy(tok, turns), tok, MultiTurnSettings(response_length=200), _gsm8k_tools(),
                               load_agent_loop_specs(None), "tool_agent", tok.pad_token_id)
    rows = {k: [v, v] for k, v in ROW.items()}
    with caplog.at_level(logging.WARNING, logger="rlhf_core.agent.manager"):
        manager.generate_sequences(Batch({"input_ids": torch.zeros((2, 4), dtype=torch.long)}, rows, {}))
    assert [r.getMessage()[:45] for r in caplog.records] == ["2 of 2 trajectories: trajectory 0/0 (<call>/<"]


def test_settings_read_the_keys_and_refuse_an_unknown_mode(tmp_path):
    cfg = _rollout_cfg(tmp_path, **{"multi_turn.use_inference_chat_template": True,
                                    "multi_turn.tokenization_sanity_check_mode": "ignore_strippable"})
    s = settings_from_config(cfg)
    assert s.use_inference_chat_template is True and s.tokenization_sanity_check_mode == "ignore_strippable"
    assert settings_from_config(_rollout_cfg(tmp_path)).tokenization_sanity_check_mode == "strict"  # verl's default
    cfg.multi_turn.tokenization_sanity_check_mode = "loose"
    with pytest.raises(ValueError, match=r"multi_turn.tokenization_sanity_check_mode='loose'"):
        settings_from_config(cfg)
