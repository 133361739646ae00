"""MLflow lineage against a real SQLite tracking store in a temporary home."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest
from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH

from conftest_services import *  # noqa: F401,F403
from infra import lineage
from infra.home import configure_environment, rlhf_home
from rlhf_core.trainer.tracking import MLFLOW_KEY_LIMIT, MLFLOW_PARAM_VALUE_LIMIT, mlflow_param_name, mlflow_params


def test_configure_environment_sets_defaults_but_keeps_user_values(rlhf_env, monkeypatch):
    env = configure_environment()
    assert rlhf_home() == rlhf_env
    assert env["MLFLOW_TRACKING_URI"] == f"sqlite:///{rlhf_env / 'mlflow.db'}"
    assert env["PREFECT_HOME"] == str(rlhf_env / "prefect")
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    monkeypatch.setenv("PREFECT_HOME", "/tmp/user-prefect-home")
    env = configure_environment()
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5999"
    assert env["PREFECT_HOME"] == "/tmp/user-prefect-home"


def test_mlflow_params_nest_and_truncate():
    flat = mlflow_params({"a": {"b": {"c": 1}}, "l": [1, 2], "long": "x" * 7000, "k" * 300: 1, "e": {}})
    assert flat["a.b.c"] == "1" and flat["l"] == "[1, 2]" and "e" not in flat  # an empty section has no param
    assert flat["long"] == "x" * 5997 + "..."  # MLflow's 6000-character limit, the cut marked
    assert flat["k" * 250] == "1"  # MLflow's 250-character key limit: the last 250 characters
    assert lineage.config_hash({"a": {"b": 1}}) == hashlib.sha256(b'{"a.b": "1"}').hexdigest()
    # the limits are MLflow's own (not imported by the core: MLflow is heavy)
    assert (MLFLOW_KEY_LIMIT, MLFLOW_PARAM_VALUE_LIMIT) == (MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH) == (250, 6000)


def test_a_long_key_has_one_mlflow_name_from_both_writers(rlhf_env, mlflow_client, monkeypatch):
    """The stage (infra.lineage) and the core's ``mlflow`` sink log the same config into the same run: every key gets
    one name. Before, lineage kept a long key's last 250 characters and the sink its first 250, so this key
    became two params (and the sink's ``@`` was sanitised, lineage's not)."""
    from rlhf_core.trainer.tracking import MlflowSink

    config = {"a" * 200: {"b" * 100: 1, "mean@4": 2}, "trainer": {"total_epochs": 3}}
    # "a"*200 + "." + "b"*100 is 301 characters: its last 250 are 149 a's, the dot and the 100 b's
    expected = {"a" * 149 + "." + "b" * 100: "1", "a" * 200 + ".mean_at_4": "2", "trainer.total_epochs": "3"}
    assert mlflow_param_name("a" * 200 + "." + "b" * 100) == "a" * 149 + "." + "b" * 100
    with lineage.stage_run("ppo", config, experiment="names") as run_id:
        assert mlflow_client.get_run(run_id).data.params == expected
        monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
        sink = MlflowSink("names", "ppo", config)  # logs the same config into the stage's run
        sink.finish()
    run = mlflow_client.get_run(run_id)
    assert run.data.params == expected
    assert [k for k in run.data.tags if k.startswith("param.")] == []  # no key was seen as changed
    # a value that changes (a later segment's stop_after_step) becomes a tag named the same way, within 250
    MlflowSink("names", "ppo", {**config, "a" * 200: {"b" * 100: 5, "mean@4": 2}})
    tags = {k: v for k, v in mlflow_client.get_run(run_id).data.tags.items() if k.startswith("param.")}
    assert tags == {"param." + "a" * 143 + "." + "b" * 100: "5"}  # 6 + 143 + 1 + 100 = 250 characters


def test_parent_and_nested_runs_with_params_inputs_and_artifacts(rlhf_env, mlflow_client, tmp_path):
    data = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": ["a", "b", "c"], "answer": ["1", "2", "3"]}).to_parquet(data)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"hidden_size": 64}')
    params = {"trainer": {"total_epochs": 2, "logger": ["console", "mlflow"]}}

    with lineage.pipeline_run("exp-test", "flow-123", {"ppo_steps": 4}) as parent:
        with lineage.stage_run("sft", params, parent_run_id=parent, flow_run_id="flow-123") as child:
            digest = lineage.log_dataset(child, data, "gsm8k_train", "training")
            assert lineage.log_dir_artifact(child, model_dir, "hf_model")
            lineage.log_metrics(child, {"val/loss": 1.5, "skipped": "text"}, step=3)
        with pytest.raises(RuntimeError):
            with lineage.stage_run("ppo", {}, parent_run_id=parent) as failed:
                raise RuntimeError("boom")

    assert digest == hashlib.sha256(data.read_bytes()).hexdigest()
    p = mlflow_client.get_run(parent)
    assert p.info.status == "FINISHED"
    assert p.data.tags[lineage.FLOW_RUN_TAG] == "flow-123"
    assert p.data.params["ppo_steps"] == "4"
    assert mlflow_client.get_experiment(p.info.experiment_id).name == "exp-test"
    assert mlflow_client.get_experiment(p.info.experiment_id).artifact_location.startswith(
        (rlhf_env / "mlartifacts").as_uri())

    c = mlflow_client.get_run(child)
    assert c.info.status == "FINISHED" and c.info.run_name == "sft"
    assert c.data.tags[lineage.PARENT_TAG] == parent
    assert c.data.params["trainer.total_epochs"] == "2"
    assert c.data.params["trainer.logger"] == "['console', 'mlflow']"
    assert c.data.tags["dataset.gsm8k_train.sha256"] == digest
    assert c.data.metrics == {"val/loss": 1.5}
    [inp] = c.inputs.dataset_inputs
    assert inp.dataset.name == "gsm8k_train" and inp.dataset.digest == digest[:36]
    assert data.resolve().as_uri() in inp.dataset.source
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "training"
    assert [a.path for a in mlflow_client.list_artifacts(child, "hf_model")] == ["hf_model/config.json"]

    assert mlflow_client.get_run(failed).info.status == "FAILED"
    children = mlflow_client.search_runs([p.info.experiment_id],
                                         filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted(r.info.run_name for r in children) == ["ppo", "sft"]


def test_big_folder_is_not_copied(rlhf_env, mlflow_client, tmp_path):
    big = tmp_path / "ckpt"
    big.mkdir()
    (big / "weights.bin").write_bytes(b"\0" * 2048)
    run_id = lineage.start_run("exp-test", "ppo")
    assert not lineage.log_dir_artifact(run_id, big, "checkpoint", max_bytes=1024)
    run = mlflow_client.get_run(run_id)
    assert run.data.tags["artifact.checkpoint.path"] == str(big.resolve())
    assert mlflow_client.list_artifacts(run_id) == []


def _first_use(uri: str, out) -> None:
    import os

    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        lineage.client().search_experiments(max_results=1)
        out.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put(repr(exc))


def test_fresh_sqlite_store_is_created_once_by_concurrent_processes(tmp_path):
    # two flow runs starting at once on a fresh RLHF_HOME both create MLflow's tables: without the
    # file lock one of them failed with "table ... already exists"
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    procs = [ctx.Process(target=_first_use, args=(uri, q)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == ["ok", "ok", "ok"]
