"""What MLflow shows of a flow run (real SQLite store): links that open the model-training view, stage runs named
with their flow run, and a cached stage recorded as a child that points at the run it came from."""

from __future__ import annotations

import pandas as pd

from conftest_services import *  # noqa: F401,F403
from flows import artifacts
from infra import lineage
from tasks.common import make_context, stage

VIEW = "?workflowType=machine_learning"


def test_links_open_the_model_training_view(rlhf_env, mlflow_client, monkeypatch):
    run_id = lineage.start_run("exp-links", "rlhf")
    exp = mlflow_client.get_run(run_id).info.experiment_id
    # a SQLite store: the address `mlflow server` serves by default; the query follows the hash route
    assert lineage.run_url(run_id) == f"http://127.0.0.1:5000/#/experiments/{exp}/runs/{run_id}{VIEW}"
    assert artifacts.mlflow_run_url(run_id) == lineage.run_url(run_id)
    assert lineage.experiment_url(exp) == f"http://127.0.0.1:5000/#/experiments/{exp}/runs{VIEW}"
    assert lineage.model_version_url("a b/c", "3") == f"http://127.0.0.1:5000/#/models/a%20b%2Fc/versions/3{VIEW}"
    # an unknown run still gets a link (experiment 0), never an error
    assert lineage.run_url("nope") == f"http://127.0.0.1:5000/#/experiments/0/runs/nope{VIEW}"
    # a tracking server: its own address
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999/")
    assert lineage.run_url("r1", "7") == f"http://127.0.0.1:5999/#/experiments/7/runs/r1{VIEW}"


def test_the_end_summary_says_how_to_open_the_ui(rlhf_env, mlflow_client):
    from flows.rlhf import mlflow_ui_lines

    run_id = lineage.start_run("exp-ui", "rlhf")
    ui, link = mlflow_ui_lines(run_id)
    store = f"sqlite:///{rlhf_env / 'mlflow.db'}"
    assert ui.startswith("UI:   ") and " -m mlflow server --host 127.0.0.1 --port 5000 --backend-store-uri " in ui
    assert ui.endswith(f"{store} --workers 1")
    assert link == f"open: {lineage.run_url(run_id)}" and link.endswith(VIEW)


def test_stage_runs_are_named_with_the_flow_run(rlhf_env, mlflow_client):
    with lineage.pipeline_run("exp-names", "fr-1", {}, run_name="practical-fox") as parent:
        ctx = make_context(str(rlhf_env), "exp-names", parent, "fr-1", str(rlhf_env / "run"),
                           flow_run_name="practical-fox")
        with stage("sft", {"a": 1}, ctx) as sft_run:
            pass
    assert mlflow_client.get_run(sft_run).info.run_name == "sft · practical-fox"
    assert mlflow_client.get_run(sft_run).data.tags[lineage.STAGE_TAG] == "sft"
    assert mlflow_client.get_run(parent).info.run_name == "practical-fox"
    # without a flow run (a test, a hand-made context): the stage's name alone
    assert lineage.stage_run_name("ppo", None) == "ppo"


def test_a_cached_stage_is_a_child_that_points_at_its_source(rlhf_env, mlflow_client, tmp_path):
    data = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": ["a", "b"]}).to_parquet(data)
    model = tmp_path / "sft_model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    # night 1 runs sft for real
    with lineage.pipeline_run("exp-cache", "fr-1", {}, run_name="night-one") as parent1:
        with lineage.stage_run("sft", {}, parent1, flow_run_id="fr-1", flow_run_name="night-one") as source:
            digest = lineage.log_dataset(source, data, "sft_train", "training")
            lineage.log_dir_artifact(source, model, "hf_model")
    # night 2 is served sft from Prefect's cache
    with lineage.pipeline_run("exp-cache", "fr-2", {}, run_name="night-two") as parent2:
        child = lineage.cached_stage_run("sft", source, parent2, "fr-2", "night-two")
    run = mlflow_client.get_run(child)
    assert run.info.run_name == "sft · night-two" and run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags[lineage.PARENT_TAG] == parent2 and tags[lineage.CACHED_FROM_TAG] == source
    assert tags[lineage.FLOW_RUN_TAG] == "fr-2" and tags[lineage.STAGE_TAG] == "sft"
    assert tags[lineage.NOTE_TAG] == (f"Served from Prefect's cache: this stage did not run again; its output is the "
                                      f"output of MLflow run 'sft · night-one' ({source}) of flow run fr-1.")
    # the source's lineage is repeated on the child: dataset input, sha256 and model folder tags
    assert tags["dataset.sft_train.sha256"] == digest and tags["artifact.hf_model.path"] == str(model.resolve())
    [inp] = run.inputs.dataset_inputs
    assert inp.dataset.name == "sft_train" and inp.dataset.digest == digest[:36]
    assert mlflow_client.get_run(child).info.experiment_id == mlflow_client.get_run(parent2).info.experiment_id
    # a source that is not in the store is said so
    gone = mlflow_client.get_run(lineage.cached_stage_run("sft", "0" * 32, parent2, "fr-2", "night-two"))
    assert gone.data.tags[lineage.NOTE_TAG].endswith(f"MLflow run {'0' * 32} (not in this store).")


def test_parent_run_text_artifact_is_redacted(rlhf_env, mlflow_client, tmp_path, monkeypatch):
    run_id = lineage.start_run("exp-summary", "rlhf")
    lineage.log_text_artifact(run_id, "# summary\nurl s3://user:hunter2@host/x", "summary.md")
    path = mlflow_client.download_artifacts(run_id, "summary.md", str(tmp_path))
    text = open(path).read()
    assert text.startswith("# summary") and "hunter2" not in text and "s3://user:***@host/x" in text
