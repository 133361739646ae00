"""multi_turn.interaction_config_path: a simulated user (verl's interactions) answers between turns. Scripted policy:
exact layout of user turns, turn scores, termination, turn limits, config and row errors; the key's effect."""
from __future__ import annotations

import asyncio

import pytest
import torch
from omegaconf import OmegaConf

from rlhf_core.agent.base import MultiTurnSettings
from rlhf_core.agent.interactions import Gsm8kInteraction, InteractionConfigError, load_interactions
from rlhf_core.agent.loops import ToolAgentLoop, render_turn
from rlhf_core.agent.manager import AgentLoopManager
from rlhf_core.agent.registry import AgentConfigError, check_datasets, load_agent_loop_specs
from rlhf_core.config import shipped_config_dir
from rlhf_core.metrics.samples import samples_table, trajectory_columns
from rlhf_core.protocol import Batch
from tests.fixtures.agent_fixtures import ScriptedPolicy, make_tokenizer, tool

CONFIGS = shipped_config_dir()
SHIPPED = CONFIGS / "tools" / "gsm8k_interaction_config.yaml"
CALL = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}</tool_call>'
ROW = {"raw_prompt": [{"role": "user", "content": "What is 6 times 12?"}],
       "extra_info": {"interaction_kwargs": {"name": "gsm8k", "query": "What is 6 times 12?", "ground_truth": "72"},
                      "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}}}


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def _loop(tok, turns, interactions, response_length=300, tools=None, **limits):
    policy = ScriptedPolicy(tok, turns)
    loop = ToolAgentLoop(policy, tok, MultiTurnSettings(response_length=response_length, **limits), tools or {})
    loop.interactions = interactions
    return policy, loop


def _user(tok, text):
    return render_turn(tok, [{"role": "user", "content": text}])


def test_wrong_answer_gets_feedback_then_the_right_one_ends_the_sequence(tok):
    interactions = load_interactions(SHIPPED)
    policy, loop = _loop(tok, ["It is 70. #### 70", "#### 72"], interactions)
    out = asyncio.run(loop.run(ROW, "r0"))
    a1, a2 = policy.turn_ids(0), policy.turn_ids(1)
    u1, u2 = _user(tok, Gsm8kInteraction.INCORRECT), _user(tok, Gsm8kInteraction.CORRECT)
    # strict GSM8K scoring of the last assistant message: "#### 70" is wrong (0.0), "#### 72" right (1.0, ends)
    assert out.response_ids == a1 + u1 + a2 + u2
    assert out.response_mask == [1] * len(a1) + [0] * len(u1) + [1] * len(a2) + [0] * len(u2)
    assert out.response_logprobs[len(a1):len(a1) + len(u1)] == [0.0] * len(u1)
    assert out.turn_scores == [0.0, 1.0] and out.num_turns == 5  # prompt + 2 assistant + 2 user turns
    assert policy.calls[1][0] == out.prompt_ids + a1 + u1  # the policy sees the feedback
    assert interactions["gsm8k"]._instances == {}  # finalize_interaction released the trajectory's state


def test_without_interaction_config_the_loop_stops_after_the_answer(tok):
    policy, loop = _loop(tok, ["It is 70. #### 70", "#### 72"], {})
    out = asyncio.run(loop.run(ROW, "r0"))
    assert out.response_ids == policy.turn_ids(0) and out.turn_scores == [] and out.num_turns == 2


def test_turn_limits_and_response_length_bound_the_interaction(tok):
    policy, loop = _loop(tok, ["#### 70"], load_interactions(SHIPPED), max_user_turns=1)
    out = asyncio.run(loop.run(ROW, "r0"))
    a, u = policy.turn_ids(0), _user(tok, Gsm8kInteraction.INCORRECT)
    assert out.response_ids == a + u + a and out.turn_scores == [0.0] and out.num_turns == 4
    # a user turn that does not fit is dropped (like a tool turn); its score is still recorded
    policy, loop = _loop(tok, ["#### 70"], load_interactions(SHIPPED), response_length=len(a) + len(u))
    out = asyncio.run(loop.run(ROW, "r0"))
    assert out.response_ids == a and out.turn_scores == [0.0] and out.num_turns == 2


def test_tool_turns_and_interaction_turns_in_one_trajectory(tok):
    tools = {"calc_gsm8k_reward": tool("verl.tools.gsm8k_tool.Gsm8kTool", "calc_gsm8k_reward")}
    policy, loop = _loop(tok, [CALL, "#### 72"], load_interactions(SHIPPED), tools=tools)
    out = asyncio.run(loop.run(ROW, "r0"))
    t = render_turn(tok, [{"role": "tool", "content": "Current parsed answer='72' reward=1.0"}])
    u = _user(tok, Gsm8kInteraction.CORRECT)
    # a turn with a tool call goes to the tool; the turn without one goes to the interaction
    assert out.response_ids == policy.turn_ids(0) + t + policy.turn_ids(1) + u
    assert out.turn_scores == [1.0] and out.tool_stats.calls["calc_gsm8k_reward"] == 1 and out.num_turns == 5


def test_manager_packs_turn_scores_and_samples_count_the_tool_call(tok):
    tools = {"calc_gsm8k_reward": tool("verl.tools.gsm8k_tool.Gsm8kTool", "calc_gsm8k_reward")}
    policy = ScriptedPolicy(tok, [CALL, "#### 72"])
    manager = AgentLoopManager(policy, tok, MultiTurnSettings(response_length=300), tools,
                               load_agent_loop_specs(None), "tool_agent", tok.pad_token_id,
                               load_interactions(SHIPPED))
    batch = Batch({"input_ids": torch.zeros((1, 4), dtype=torch.long)}, {k: [v] for k, v in ROW.items()})
    out = manager.generate_sequences(batch)
    assert list(out.non_tensors["turn_scores"]) == [[1.0]] and out.non_tensors["num_turns"].tolist() == [5]
    # the samples writer's columns: 5 turns, one tool call, no failure (int64 in the parquet schema)
    columns = trajectory_columns(out.non_tensors)
    assert columns == {"num_turns": [5], "tool_calls": [1], "tool_failures": [0]}
    table = samples_table([{"step": 1, "data_source": "d", "uid": "u", "sample_idx": 0, "prompt": "p",
                            "response": "r", "ground_truth": "72", "score": 1.0,
                            **{k: v[0] for k, v in columns.items()}}])
    assert str(table.schema.field("tool_calls").type) == "int64" and table.column("tool_calls").to_pylist() == [1]


def test_interaction_config_errors_name_the_file_and_entry(tmp_path):
    loaded = load_interactions(SHIPPED)
    assert list(loaded) == ["gsm8k"] and loaded["gsm8k"].config == {"name": "gsm8k"}
    # verl's class path loads as ours; without a name the class name gives it ("Gsm8kInteraction" -> "gsm8k")
    verl = tmp_path / "verl.yaml"
    verl.write_text("interaction:\n- class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n  config: {}\n")
    assert isinstance(load_interactions(verl)["gsm8k"], Gsm8kInteraction)
    cases = {"interaction:\n- class_name: no.such.Interaction\n": "cannot be imported",
             "interaction:\n- class_name: rlhf_core.tools.builtin.Gsm8kTool\n": "not an interaction class",
             "interaction:\n- {name: a, class_name: rlhf_core.agent.interactions.Gsm8kInteraction}\n"
             "- {name: a, class_name: rlhf_core.agent.interactions.Gsm8kInteraction}\n": "a second interaction",
             "tools: []\n": "needs a top-level 'interaction:' list"}
    for i, (text, why) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(text)
        with pytest.raises(InteractionConfigError, match=why) as err:
            load_interactions(path)
        assert str(path) in str(err.value)


def _rollout_cfg(**overrides):
    cfg = OmegaConf.load(CONFIGS / "ppo_trainer.yaml").actor_rollout_ref.rollout
    cfg.multi_turn.tool_config_path = str(CONFIGS / "tools" / "gsm8k_tool_config.yaml")  # the shipped one
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


class _Rows:
    def __init__(self, rows):
        self.rows, self.sources = rows, [f"train.parquet row {i}" for i in range(len(rows))]


def test_rows_without_a_configured_interaction_name_fail_at_dataset_build():
    cfg = _rollout_cfg(**{"multi_turn.enable": True, "multi_turn.interaction_config_path": str(SHIPPED)})
    check_datasets(cfg, [_Rows([ROW])])
    bad = {**ROW, "extra_info": {"interaction_kwargs": {"query": "q", "ground_truth": "1"}}}
    with pytest.raises(AgentConfigError, match=r"train.parquet row 1: extra_info.interaction_kwargs.name is None"):
        check_datasets(cfg, [_Rows([ROW, bad])])
    off = _rollout_cfg(**{"multi_turn.interaction_config_path": str(SHIPPED)})  # sync, multi_turn off
    with pytest.raises(ValueError, match="interaction_config_path.*needs agent-loop rollouts"):
        check_datasets(off, [_Rows([ROW])])


def test_agent_rollout_loads_the_interaction_config_key(tok):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlhf_core.workers.rollout.agent_rollout import AgentRollout
    from rlhf_core.workers.rollout.hf_rollout import HFRollout

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=256)).eval()
    cfg = _rollout_cfg(mode="async", response_length=8, **{"multi_turn.interaction_config_path": str(SHIPPED),
                                                           "agent.default_agent_loop": "tool_agent"})
    rollout = AgentRollout(HFRollout(model, tok, cfg, seed=1), tok, cfg)
    assert list(rollout.interactions) == ["gsm8k"]
    out = rollout.generate_sequences(Batch({"input_ids": torch.zeros((2, 4), dtype=torch.long)},
                                           {k: [v, v] for k, v in ROW.items()}, {"validate": False}))
    assert len(out.non_tensors["turn_scores"]) == 2
    with pytest.raises(InteractionConfigError, match="missing.yaml"):
        AgentRollout(HFRollout(model, tok, cfg, seed=1), tok,
                     _rollout_cfg(mode="async", **{"multi_turn.interaction_config_path": "missing.yaml"}))
