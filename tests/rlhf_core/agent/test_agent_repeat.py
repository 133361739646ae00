"""multi_turn.num_repeat_rollouts (verl: read by the CollabLLM agent loop only): the ``collabllm_agent`` loop trains
one assistant turn and rolls out that many interaction continuations into the ``messages`` column."""
from __future__ import annotations

import asyncio

import pytest
import torch

from rlhf_core.agent.base import MultiTurnSettings
from rlhf_core.agent.interactions import Gsm8kInteraction, load_interactions
from rlhf_core.agent.manager import AgentLoopManager
from rlhf_core.agent.registry import load_agent_loop_specs, settings_from_config
from rlhf_core.agent.repeat import RepeatInteractionAgentLoop
from rlhf_core.protocol import Batch
from rlhf_core.config import shipped_config_dir
from tests.fixtures.agent_fixtures import ScriptedPolicy, make_tokenizer
from tests.rlhf_core.agent.test_agent_interaction import ROW, SHIPPED
from tests.rlhf_core.agent.test_agent_rollout import _rollout_cfg

WRONG, RIGHT = "It is 70. #### 70", "#### 72"
Q = ROW["raw_prompt"][0]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def _loop(tok, repeats, interactions=None, **limits):
    policy = ScriptedPolicy(tok, [WRONG, RIGHT])  # the k-th generation returns WRONG for even k, RIGHT for odd k
    loop = RepeatInteractionAgentLoop(policy, tok, MultiTurnSettings(response_length=300, num_repeat_rollouts=repeats,
                                                                     **limits), {})
    loop.interactions = load_interactions(SHIPPED) if interactions is None else interactions
    return policy, loop


def test_one_trained_turn_and_num_repeat_rollouts_continuations(tok):
    policy, loop = _loop(tok, 2)
    out = asyncio.run(loop.run(ROW, "r0"))
    # trained: the first assistant turn only (verl's CollabLLMAgentLoop keeps agent_data, the repeats are copies)
    assert out.response_ids == policy.turn_ids(0) and out.response_mask == [1] * len(out.response_ids)
    assert out.num_turns == 2
    a70, a72 = {"role": "assistant", "content": WRONG}, {"role": "assistant", "content": RIGHT}
    no, yes = {"role": "user", "content": Gsm8kInteraction.INCORRECT}, {"role": "user", "content": Gsm8kInteraction.CORRECT}
    # repeat 0: "#### 70" is wrong -> feedback; generation 1 is RIGHT -> "correct", the interaction ends it.
    # repeat 1 starts again after the first turn: generation 2 is WRONG, generation 3 RIGHT.
    assert out.extra["messages"] == {"messages": [[Q, a70, no, a72, yes], [Q, a70, no, a70, no, a72, yes]]}
    assert [c[2] for c in policy.calls] == ["r0/turn0", "r0/repeat0/turn1", "r0/repeat1/turn1", "r0/repeat1/turn2"]
    assert loop.interactions["gsm8k"]._instances == {}  # every continuation's interaction state was released


def test_zero_repeats_or_a_finished_first_turn_roll_out_nothing(tok):
    for repeats, limits in ((0, {}), (3, {"max_assistant_turns": 1})):
        policy, loop = _loop(tok, repeats, **limits)
        out = asyncio.run(loop.run(ROW, "r0"))
        assert out.extra["messages"] == {"messages": []} and len(policy.calls) == 1, (repeats, limits)


def test_bad_settings_fail_before_generating(tok, tmp_path):
    with pytest.raises(ValueError, match=r"needs actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts"):
        _loop(tok, None)
    policy, loop = _loop(tok, 1, interactions={})
    with pytest.raises(ValueError, match=r"needs actor_rollout_ref.rollout.multi_turn.interaction_config_path"):
        asyncio.run(loop.run(ROW, "r0"))
    assert policy.calls == []
    cfg = _rollout_cfg(tmp_path, **{"multi_turn.num_repeat_rollouts": -1})
    with pytest.raises(ValueError, match=r"num_repeat_rollouts=-1: use null or an int >= 0"):
        settings_from_config(cfg)
    cfg.multi_turn.num_repeat_rollouts = 3
    assert settings_from_config(cfg).num_repeat_rollouts == 3


def test_verl_recipe_path_and_the_messages_column(tok, tmp_path):
    spec = tmp_path / "agent.yaml"  # verl's recipe/collabllm/config/agent.yaml
    spec.write_text("- name: collabllm_agent\n  _target_: recipe.collabllm.collabllm_agent_loop.CollabLLMAgentLoop\n")
    specs = load_agent_loop_specs(spec)
    assert specs["collabllm_agent"][0] is RepeatInteractionAgentLoop
    manager = AgentLoopManager(ScriptedPolicy(tok, [WRONG, RIGHT]), tok,
                               MultiTurnSettings(response_length=300, num_repeat_rollouts=1), {}, specs,
                               "collabllm_agent", tok.pad_token_id, load_interactions(SHIPPED))
    row = {"raw_prompt": ROW["raw_prompt"], "extra_info": {"interaction_kwargs": ROW["extra_info"]["interaction_kwargs"]}}
    rows = {k: [v, v] for k, v in row.items()}
    out = manager.generate_sequences(Batch({"input_ids": torch.zeros((2, 4), dtype=torch.long)}, rows, {}))
    assert [len(m["messages"]) for m in out.non_tensors["messages"]] == [1, 1]
    # only the first turn is in the trained response: every response token is an assistant token
    assert out["response_mask"].sum(-1).tolist() == out["attention_mask"][:, -300:].sum(-1).tolist()
    assert (out["response_mask"].sum(-1) > 0).all()


def test_a_collabllm_row_without_its_keys_fails_at_dataset_build(tok, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf

    from rlhf_core.agent.registry import AgentConfigError, check_datasets
    from rlhf_core.data.rl_dataset import RLHFDataset

    rows = [{"prompt": [{"role": "user", "content": "q"}], "agent_name": name,
             "extra_info": {"interaction_kwargs": {"name": "gsm8k", "ground_truth": "1"}}}
            for name in ("tool_agent", "collabllm_agent")]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    data_cfg = OmegaConf.load(shipped_config_dir() / "ppo_trainer.yaml").data
    data_cfg.max_prompt_length = 64
    ds = RLHFDataset(str(path), tok, data_cfg)
    cfg = _rollout_cfg(tmp_path, mode="async", **{"multi_turn.interaction_config_path": str(SHIPPED)})
    with pytest.raises(AgentConfigError, match=r"train.parquet.*row 1.*'collabllm_agent' needs .*num_repeat_rollouts "
                                               r"\(got None\)"):
        check_datasets(cfg, [ds])
    cfg.multi_turn.num_repeat_rollouts = 2
    check_datasets(cfg, [ds])  # both keys set: accepted
