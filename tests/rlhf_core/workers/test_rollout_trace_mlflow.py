"""``actor_rollout_ref.rollout.trace.backend: mlflow``: agent-loop trajectories land as MLflow traces in a real
local store (sqlite in tmp_path)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.workers.rollout.rollout_trace import MlflowRolloutTracer, rollout_tracer


def rollout_batch() -> Batch:
    """2 rows, prompts (2, 3) left-padded (row 0 has one pad), responses (2, 4) right-padded."""
    prompts = torch.tensor([[0, 11, 12], [21, 22, 23]])
    responses = torch.tensor([[31, 32, 0, 0], [41, 42, 43, 44]])
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    attention_mask = torch.cat([torch.tensor([[0, 1, 1], [1, 1, 1]]), response_mask], 1)
    raw = np.empty(2, dtype=object)
    raw[0], raw[1] = [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    return Batch({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                  "attention_mask": attention_mask, "num_turns": torch.tensor([2, 4])},
                 {"raw_prompt": raw}, meta={"global_steps": 7, "validate": False})


def test_each_trajectory_is_one_mlflow_trace(tmp_path, monkeypatch, tiny_tokenizer):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    tracer = MlflowRolloutTracer("proj", "exp1", tiny_tokenizer, token2text=True)
    ids = tracer.log(rollout_batch())
    traces = {t.info.trace_id: t for t in mlflow.search_traces(locations=[tracer.experiment_id],
                                                              return_type="list")}
    assert sorted(traces) == sorted(ids) and len(ids) == 2
    first, second = traces[ids[0]], traces[ids[1]]
    assert first.info.tags["step"] == "7" and first.info.tags["sample_index"] == "0"
    assert second.info.tags["sample_index"] == "1" and second.info.tags["validate"] == "False"
    assert first.info.tags["experiment_name"] == "exp1"
    span = first.data.spans[0]
    assert span.name == "agent_loop"
    assert span.inputs["prompt_ids"] == [11, 12]  # the pad (mask 0) is dropped
    assert span.inputs["raw_prompt"] == [{"role": "user", "content": "a"}]
    assert span.outputs["response_ids"] == [31, 32] and span.outputs["num_turns"] == 2
    assert span.outputs["response_text"] == tiny_tokenizer.decode([31, 32])  # token2text
    assert second.data.spans[0].outputs["response_ids"] == [41, 42, 43, 44]


def test_weave_backend_is_refused_by_name():
    from rlhf_core.config import load_config

    with pytest.raises(Exception, match=r"trace.backend='weave' needs the Weights & Biases Weave"):
        load_config("ppo_trainer", ["actor_rollout_ref.rollout.trace.backend=weave"])
    cfg = load_config("ppo_trainer", [])
    assert rollout_tracer(cfg.actor_rollout_ref.rollout.trace, cfg.trainer, None) is None  # null: no tracing


def test_agent_rollout_traces_its_trajectories(tmp_path, monkeypatch):
    """A real AgentRollout (tiny model, tool agent loop) with trace.backend=mlflow: one trace per row, whose
    response ids are the rollout's own."""
    import mlflow

    from rlhf_core.workers.rollout.agent_rollout import AgentRollout
    from rlhf_core.workers.rollout.hf_rollout import HFRollout
    from tests.fixtures.agent_fixtures import make_model, make_tokenizer
    from tests.rlhf_core.agent.test_agent_rollout import _batch, _rollout_cfg

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    tok = make_tokenizer()
    cfg = _rollout_cfg(tmp_path, mode="async", **{"trace.backend": "mlflow"})
    trainer = {"project_name": "proj", "experiment_name": "agent"}
    tracer = rollout_tracer(cfg.trace, type("T", (), trainer), tok)
    rollout = AgentRollout(HFRollout(make_model(tok), tok, cfg, seed=5), tok, cfg, tracer)
    batch = _batch(2)
    batch.meta["global_steps"] = 3
    out = rollout.generate_sequences(batch)
    traces = mlflow.search_traces(locations=[tracer.experiment_id], return_type="list")
    assert len(traces) == 2
    by_row = {int(t.info.tags["sample_index"]): t.data.spans[0] for t in traces}
    for row in range(2):
        assert by_row[row].outputs["response_ids"] == out["responses"][row][out["response_mask"][row].bool()].tolist()
        assert by_row[row].outputs["num_turns"] == int(out["num_turns"][row])
    assert all(t.info.tags["step"] == "3" for t in traces)


def test_trace_names_and_max_samples_per_step_per_worker(tmp_path, monkeypatch):
    """rollout.trace.project_name / experiment_name name the MLflow experiment and the tag (over trainer's);
    max_samples_per_step_per_worker=2 traces the rows of 2 of the 3 prompts (index column; rollout.n = 2 each)."""
    import mlflow

    from rlhf_core.config import load_config

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.rollout.trace.backend=mlflow",
                                      "actor_rollout_ref.rollout.trace.project_name=traces",
                                      "actor_rollout_ref.rollout.trace.experiment_name=exp9",
                                      "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=2"])
    tracer = rollout_tracer(cfg.actor_rollout_ref.rollout.trace, cfg.trainer, None)
    assert mlflow.get_experiment(tracer.experiment_id).name == "traces" != cfg.trainer.project_name
    two = rollout_batch()
    six = Batch({k: torch.cat([v, v, v]) for k, v in two.tensors.items()},
                {"index": np.array([10, 10, 11, 11, 12, 12])}, meta={"global_steps": 4, "validate": False})
    ids = tracer.log(six)
    traces = mlflow.search_traces(locations=[tracer.experiment_id], return_type="list")
    assert len(ids) == len(traces) == 4
    rows = sorted(int(t.info.tags["sample_index"]) for t in traces)
    picked = {r // 2 for r in rows}  # rows 2p, 2p+1 hold prompt index 10 + p
    assert len(picked) == 2 and rows == sorted(r for p in picked for r in (2 * p, 2 * p + 1))  # both responses
    assert {t.info.tags["experiment_name"] for t in traces} == {"exp9"}
    with pytest.raises(ValueError, match="max_samples_per_step_per_worker=0"):
        cfg.actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker = 0
        rollout_tracer(cfg.actor_rollout_ref.rollout.trace, cfg.trainer, None)
