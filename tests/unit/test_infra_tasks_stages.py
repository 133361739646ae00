"""Task bodies (``task.fn``) against real GSM8K files, MLflow SQLite, DuckDB and embedded Ray."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import filelock
import pandas as pd
import pytest

from conftest_services import *  # noqa: F401,F403
from infra import lineage
from infra.results import ResultsStore
from tasks import plan
from tasks.common import make_context
from tasks.stages import build_model, evaluate, prepare_data


@pytest.fixture
def ctx(rlhf_env):
    with lineage.pipeline_run("rlhf-test", "flow-1", {}) as parent:
        yield make_context(str(rlhf_env), "rlhf-test", parent, "flow-1", str(rlhf_env / "runs" / "flow-1"))


def _children(client, ctx):
    run = client.get_run(ctx["parent_run_id"])
    found = client.search_runs([run.info.experiment_id],
                               filter_string=f"tags.mlflow.parentRunId = '{ctx['parent_run_id']}'")
    return {r.info.run_name: r for r in found}


def test_prepare_data_cuts_subsets_and_logs_lineage(ctx, gsm8k_dir, mlflow_client):
    out = prepare_data.fn(str(gsm8k_dir), 16, 4, ctx)
    train, val = pd.read_parquet(out["train"]), pd.read_parquet(out["val"])
    assert (len(train), len(val)) == (16, 4)
    assert set(train["data_source"]) == {"openai/gsm8k"}
    assert out["train_sha256"] == hashlib.sha256(open(out["train"], "rb").read()).hexdigest()
    run = _children(mlflow_client, ctx)["prepare_data"]
    assert run.info.status == "FINISHED"
    assert {i.dataset.name for i in run.inputs.dataset_inputs} == {"gsm8k_train", "gsm8k_val"}
    assert ResultsStore(ctx["home"]).sql("SELECT stage, status FROM runs")[1] == [("prepare_data", "FINISHED")]


def test_evaluate_scores_the_last_validation_step(ctx, ray_local, tmp_path, mlflow_client):
    val_dir = tmp_path / "val_samples"
    val_dir.mkdir()
    rows = []
    for step, answers in ((1, ["7", "8"]), (2, ["#### 7", "#### 3"])):
        for j, ans in enumerate(answers):
            rows.append({"step": step, "data_source": "openai/gsm8k", "uid": "q1", "sample_idx": j,
                         "prompt": "What is 3+4?", "response": ans, "ground_truth": "7", "score": 0.0})
    pd.DataFrame(rows).to_parquet(val_dir / "val.parquet")
    metrics = evaluate.fn(str(val_dir), [], ctx, checkpoint="/ckpt/global_step_2", global_step=2)
    # step 2 only: responses "#### 7" (correct) and "#### 3" (wrong) -> mean score 0.5
    assert metrics["test_score/openai/gsm8k"] == pytest.approx(0.5)
    run = _children(mlflow_client, ctx)["evaluate"]
    assert run.data.metrics["test_score/openai/gsm8k"] == pytest.approx(0.5)
    _, got = ResultsStore(ctx["home"]).sql(
        "SELECT sample_idx, response, score FROM samples WHERE stage = 'evaluate' ORDER BY sample_idx")
    assert got == [(0, "#### 7", 1.0), (1, "#### 3", 0.0)]
    store = ResultsStore(ctx["home"])
    # the evaluation metrics are queryable too, at the PPO step of the responses
    assert ("test_score/openai/gsm8k", 2, 0.5) in store.sql(
        "SELECT key, step, value FROM metrics WHERE stage = 'evaluate'")[1]
    assert store.sql("SELECT DISTINCT checkpoint FROM samples WHERE stage = 'evaluate'")[1] == [
        ("/ckpt/global_step_2",)]
    # the whole resolved evaluation config, in DuckDB and as an MLflow artifact; the samples as an artifact
    _, [(params,)] = store.sql("SELECT params_json FROM runs WHERE stage = 'evaluate'")
    assert "custom_reward_function.name" in params
    assert {a.path for a in mlflow_client.list_artifacts(run.info.run_id)} >= {"config", "samples"}


def test_build_model_waits_for_a_concurrent_build_and_reuses_its_folder(ctx, gsm8k_dir):
    """Two flow runs starting at once both miss Prefect's cache: the second build waits on the folder's
    lock and takes the finished folder as it is (no Ray job, no folder swapped under the first run)."""
    data = prepare_data.fn(str(gsm8k_dir), 16, 4, ctx)
    sizes = {"vocab_size": 300, "hidden_size": 16}
    out_dir = Path(ctx["home"]) / "models" / f"tiny-{plan.inputs_key('build_model', [data['train']], sizes=sizes)[:16]}"
    result: dict = {}
    with filelock.FileLock(f"{out_dir}.lock"):  # "the other flow run" is building
        worker = threading.Thread(target=lambda: result.update(build_model.fn(data["train"], sizes, ctx)))
        worker.start()
        worker.join(timeout=3)
        assert worker.is_alive() and not result  # waits for the lock
        out_dir.mkdir(parents=True)  # the other run's folder appears (atomically, complete)
        (out_dir / "config.json").write_text("{}")
        (out_dir / "marker").write_text("built by the other run")
        inode = out_dir.stat().st_ino
    worker.join(timeout=120)
    assert result["model_path"] == str(out_dir)
    # not rebuilt: a build would have swapped in a new folder (another inode, no marker)
    assert out_dir.stat().st_ino == inode and (out_dir / "marker").read_text() == "built by the other run"
