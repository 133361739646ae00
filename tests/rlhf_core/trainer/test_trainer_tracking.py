"""Metric sinks: console line format, jsonl file, MLflow name sanitising and logging into MLFLOW_RUN_ID."""
from __future__ import annotations

import pytest
import torch

from rlhf_core.trainer.tracking import Tracking, read_metrics_jsonl, sanitize_mlflow_name


def test_console_line_and_file_sink(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    path = tmp_path / "m.jsonl"
    tr = Tracking("p", "e", ["console", "file"], metrics_file=str(path))
    tr.log({"actor/pg_loss": 0.12345, "perf/throughput": torch.tensor(10.0), "note": "skip", "lst": [1, 2]}, step=3)
    tr.log({"actor/pg_loss": 1.0}, step=4)
    tr.log({"actor/lr": 1e-6, "actor/kl_loss": 0.0}, step=5)
    tr.finish()
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "step:3 - actor/pg_loss:0.123 - perf/throughput:10.000"
    # verl's 3 decimals would print a 1e-6 learning rate as 0.000; small non-zero values go scientific
    assert out[-1] == "step:5 - actor/lr:1.000e-06 - actor/kl_loss:0.000"
    assert read_metrics_jsonl(str(path)) == {3: {"actor/pg_loss": 0.12345, "perf/throughput": 10.0},
                                             4: {"actor/pg_loss": 1.0},
                                             5: {"actor/lr": 1e-6, "actor/kl_loss": 0.0}}


def test_file_sink_path_from_env_or_config(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "ck")}})
    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    Tracking("p", "e", ["file"], config=cfg).log({"a": 1}, 1)
    assert read_metrics_jsonl(str(tmp_path / "ck" / "metrics.jsonl")) == {1: {"a": 1.0}}
    monkeypatch.setenv("RLHF_METRICS_FILE", str(tmp_path / "env.jsonl"))
    Tracking("p", "e", ["file"], config=cfg).log({"b": 2}, 1)
    assert read_metrics_jsonl(str(tmp_path / "env.jsonl")) == {1: {"b": 2.0}}


def test_unknown_backend_is_an_error():
    with pytest.raises(ValueError, match="unknown backend"):
        Tracking("p", "e", ["console", "neptune"])


def test_sanitize_mlflow_names():
    assert sanitize_mlflow_name("val-core/openai/gsm8k/reward/mean@4") == "val-core/openai/gsm8k/reward/mean_at_4"
    assert sanitize_mlflow_name("val-aux/x/acc/best@2/std") == "val-aux/x/acc/best_at_2/std"
    assert sanitize_mlflow_name("a(b)+c") == "a_b__c"


def test_mlflow_logs_into_given_run(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    from omegaconf import OmegaConf

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    client = mlflow.tracking.MlflowClient()
    exp = client.create_experiment("pipeline", artifact_location=str(tmp_path / "art"))
    run_id = client.create_run(exp).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    tr = Tracking("proj", "exp", ["mlflow"], config=OmegaConf.create({"trainer": {"seed": 1}}))
    tr.log({"val-core/toy/reward/mean@2": 0.5, "actor/pg_loss": 0.25}, step=2)
    tr.finish()
    run = client.get_run(run_id)
    assert run.data.metrics == {"val-core/toy/reward/mean_at_2": 0.5, "actor/pg_loss": 0.25}
    assert run.data.params["trainer.seed"] == "1"
    assert run.info.status == "RUNNING"  # the pipeline owns that run; we do not end it

    # a later PPO segment logs into the same run with a changed value: MLflow params cannot change, so it
    # becomes tag param.<key>; new keys are still params, and nothing is logged as a warning
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("rlhf_core.trainer.tracking").addHandler(handler)
    try:
        Tracking("proj", "exp", ["mlflow"],
                 config=OmegaConf.create({"trainer": {"seed": 1, "stop_after_step": 2}})).finish()
        Tracking("proj", "exp", ["mlflow"],
                 config=OmegaConf.create({"trainer": {"seed": 1, "stop_after_step": 4}})).finish()
    finally:
        logging.getLogger("rlhf_core.trainer.tracking").removeHandler(handler)
    run = client.get_run(run_id)
    assert run.data.params["trainer.stop_after_step"] == "2"  # the first segment's value
    assert run.data.tags["param.trainer.stop_after_step"] == "4"  # the latest segment's
    assert run.data.params["trainer.seed"] == "1" and "param.trainer.seed" not in run.data.tags
    assert [r for r in records if r.levelno >= logging.WARNING] == []


def test_missing_optional_sink_is_skipped_and_env_adds_file_sink(tmp_path, monkeypatch):
    pytest.importorskip("omegaconf")
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("RLHF_METRICS_FILE", str(tmp_path / "env.jsonl"))
    tr = Tracking("p", "e", ["console", "wandb"])
    assert sorted(tr.sinks) == ["console", "file"]
    tr.log({"x": 1.5}, 2)
    assert read_metrics_jsonl(str(tmp_path / "env.jsonl")) == {2: {"x": 1.5}}
