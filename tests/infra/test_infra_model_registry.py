"""The final policy in the MLflow model registry (real SQLite store) and the reward chart."""

from __future__ import annotations

import pytest

from conftest_services import *  # noqa: F401,F403
from infra import lineage, model_registry


def test_register_policy_creates_versions_with_lineage(rlhf_env, mlflow_client, tmp_path):
    hf = tmp_path / "hf_policy"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "qwen2"}')
    run_id = lineage.start_run("exp-reg", "ppo")
    tags = {"sft_model": "/h/sft/abc", "ppo_checkpoint": "/h/runs/f/checkpoints/global_step_2",
            "dataset.gsm8k_train.sha256": "ab" * 32}
    assert model_registry.register_policy(run_id, hf, "exp-reg", tags) == "1"
    assert model_registry.register_policy(run_id, hf, "exp-reg", tags) == "2"  # a new version per run
    mv = mlflow_client.get_model_version("exp-reg", "2")
    assert mv.run_id == run_id and mv.tags["sft_model"] == "/h/sft/abc"
    assert mv.tags["ppo_checkpoint"].endswith("global_step_2") and mv.source.endswith("/hf_model")
    assert [a.path for a in mlflow_client.list_artifacts(run_id, "hf_model")] == ["hf_model/config.json"]
    # the experiment opens in MLflow's model-training view
    exp = mlflow_client.get_experiment_by_name("exp-reg")
    assert exp.tags[lineage.EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_reward_chart_draws_a_png(tmp_path):
    rows = [(1, "critic/score/mean", 0.1), (2, "critic/score/mean", 0.3),
            (2, "val-core/openai/gsm8k/reward/mean@2", 0.2), (2, "actor/entropy", 3.0)]
    path = model_registry.reward_chart(rows, tmp_path / "r.png")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="critic/score/mean"):
        model_registry.reward_chart([(1, "actor/entropy", 1.0)], tmp_path / "x.png")
