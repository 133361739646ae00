"""AgentRollout (the worker's engine for rollout.mode=async / multi_turn.enable) built from
rlhf_core/configs/ppo_trainer.yaml: async and sync-multi-turn give the same trajectories for the same seeds; tool config errors fail at start."""
from __future__ import annotations


import pytest
import torch
from omegaconf import OmegaConf

from rlhf_core.agent.layout import multiturn_metrics
from rlhf_core.config import shipped_config_dir
from rlhf_core.protocol import Batch
from rlhf_core.tools.config import ToolConfigError
from rlhf_core.workers.rollout.agent_rollout import AgentRollout, uses_agent_loop
from rlhf_core.workers.rollout.hf_rollout import HFRollout
from tests.fixtures.agent_fixtures import make_model, make_tokenizer

CONFIGS = shipped_config_dir()
TOOL_YAML = """tools:
- class_name: verl.tools.gsm8k_tool.Gsm8kTool
  config: {type: native}
  tool_schema:
    type: function
    function:
      name: calc_gsm8k_reward
      description: reward of a gsm8k answer
      parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}
"""


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return make_model(tok)


def _rollout_cfg(tmp_path, **overrides):
    cfg = OmegaConf.load(CONFIGS / "ppo_trainer.yaml").actor_rollout_ref.rollout
    tools = tmp_path / "tools.yaml"
    tools.write_text(TOOL_YAML)
    cfg.response_length = 24
    cfg.multi_turn.tool_config_path = str(tools)
    cfg.agent.default_agent_loop = "tool_agent"
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def _batch(n=6):
    rows = {"raw_prompt": [[{"role": "user", "content": f"What is {k} times 12?"}] for k in range(n)],
            "raw_prompt_ids": [[5, 6, 7 + k] for k in range(n)],
            "extra_info": [{"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": str(12 * k)}}}}
                           for k in range(n)]}
    return Batch({"input_ids": torch.zeros((n, 3), dtype=torch.long)}, rows, {"validate": False})


def test_async_equals_sync_multiturn(tmp_path, tok, model):
    outs = {}
    for mode, enable in (("async", False), ("sync", True)):
        cfg = _rollout_cfg(tmp_path, mode=mode, **{"multi_turn.enable": enable, "max_num_seqs": 4})
        assert uses_agent_loop(cfg)
        rollout = AgentRollout(HFRollout(model, tok, cfg, seed=5), tok, cfg)
        assert rollout.schedule == ("continuous" if mode == "async" else "static")
        outs[mode] = rollout.generate_sequences(_batch())
    a, s = outs["async"], outs["sync"]
    for key in ("prompts", "responses", "response_mask", "attention_mask", "position_ids"):
        assert torch.equal(a[key], s[key]), key
    assert torch.allclose(a["rollout_log_probs"], s["rollout_log_probs"], atol=1e-5)
    assert a["responses"].shape[1] == 24 and a["prompts"].shape[0] == 6
    metrics = multiturn_metrics(a)
    assert metrics["num_turns/min"] >= 2 and "tool_calls/total" in metrics


def test_sync_single_turn_is_not_an_agent_rollout(tmp_path):
    assert not uses_agent_loop(_rollout_cfg(tmp_path, mode="sync"))


def test_bad_tool_config_fails_at_start(tmp_path, tok, model):
    cfg = _rollout_cfg(tmp_path, mode="async")
    bad = tmp_path / "bad.yaml"
    bad.write_text(TOOL_YAML.replace("verl.tools.gsm8k_tool.Gsm8kTool", "missing.module.Tool"))
    cfg.multi_turn.tool_config_path = str(bad)
    with pytest.raises(ToolConfigError, match=r"bad.yaml, tool #0 \('calc_gsm8k_reward'\): class_name"):
        AgentRollout(HFRollout(model, tok, cfg), tok, cfg)


def test_unknown_tool_in_dataset_fails_at_build_naming_the_row(tmp_path, tok):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlhf_core.agent.registry import AgentConfigError, check_datasets
    from rlhf_core.data.rl_dataset import RLHFDataset

    rows = [{"prompt": [{"role": "user", "content": "q"}],
             "extra_info": {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "1"}}}}},
            {"prompt": [{"role": "user", "content": "q"}], "extra_info": {"tools_kwargs": {"web_search": {"create_kwargs": {"query": "x"}}}}}]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    data_cfg = OmegaConf.load(CONFIGS / "ppo_trainer.yaml").data
    data_cfg.max_prompt_length = 64
    ds = RLHFDataset(str(path), tok, data_cfg)
    assert ds.rows[0]["extra_info"]["tools_kwargs"]["web_search"] is None  # parquet's struct union: null, not absent
    check_datasets(_rollout_cfg(tmp_path, mode="sync"), [ds])  # single-turn sync: nothing to check
    with pytest.raises(AgentConfigError, match=r"train.parquet.*row 1.*unknown tools \['web_search'\]"):
        check_datasets(_rollout_cfg(tmp_path, mode="async"), [ds, None])


def test_unknown_format_fails_at_start(tmp_path, tok, model):
    cfg = _rollout_cfg(tmp_path, mode="async", **{"multi_turn.format": "gpt-oss"})
    with pytest.raises(ValueError, match=r"multi_turn.format='gpt-oss': supported \['hermes'\]"):
        AgentRollout(HFRollout(model, tok, cfg), tok, cfg)


def test_function_tool_path_adds_tools_at_start_and_at_dataset_build(tmp_path, tok, model):
    from rlhf_core.agent.registry import check_datasets

    py = tmp_path / "fn_tools.py"
    py.write_text('from rlhf_core.tools import function_tool\n\n\n@function_tool\ndef double(x: int) -> int:\n'
                  '    """Double a number.\n\n    Args:\n        x: the number\n    """\n    return 2 * x\n')
    cfg = _rollout_cfg(tmp_path, mode="async", **{"multi_turn.function_tool_path": str(py)})
    assert sorted(AgentRollout(HFRollout(model, tok, cfg), tok, cfg).tools) == ["calc_gsm8k_reward", "double"]
    cfg.multi_turn.function_tool_path = str(tmp_path / "gone.py")
    with pytest.raises(ToolConfigError, match=r"function_tool_path .*gone.py: no such file"):
        check_datasets(cfg, [])  # the driver fails before any worker starts
