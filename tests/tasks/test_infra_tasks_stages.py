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
from tasks.stages import build_model, evaluate, filter_prompts, prepare_data

pytestmark = pytest.mark.ray  # starts Ray: uses the fixture ray_local


def _gsm8k_data(gsm8k_dir, n_train: int, n_val: int) -> dict:
    """``PipelineSettings.data_spec()`` of the gsm8k generator on ``gsm8k_dir``."""
    return {"generator": "gsm8k", "generator_args": {"source_dir": str(gsm8k_dir)}, "train_files": [],
            "val_files": [], "train_prompts": n_train, "val_prompts": n_val, "sft_train_files": [],
            "sft_val_files": [], "suites": [], "prompt_key": "prompt"}


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
    out = prepare_data.fn(_gsm8k_data(gsm8k_dir, 16, 4), ctx)
    train, val = pd.read_parquet(out["train"]), pd.read_parquet(out["val"])
    assert (len(train), len(val)) == (16, 4)
    assert set(train["data_source"]) == {"openai/gsm8k"}
    assert out["train_sha256"] == hashlib.sha256(open(out["train"], "rb").read()).hexdigest()
    run = _children(mlflow_client, ctx)["prepare_data"]
    assert run.info.status == "FINISHED"
    assert {i.dataset.name for i in run.inputs.dataset_inputs} == {"gsm8k_train", "gsm8k_val"}
    assert ResultsStore(ctx["home"]).sql("SELECT stage, status FROM runs")[1] == [("prepare_data", "FINISHED")]


def test_evaluate_generates_with_the_model_and_scores_the_default_suite(ctx, ray_local, tmp_path, mlflow_client,
                                                                        tiny_model_dir, gsm8k_dir):
    """Issue 33: evaluate generates anew with the model (no checkpoint: ``model_path``) on the default suite (the
    val file, sampled as ``val_kwargs`` says: 2 responses per prompt) and scores it; the default suite keeps the
    names of runs before suites (``test_score/<data_source>``). Named suites: tests/reliability/test_faults.py."""
    from rlhf_core.data.gsm8k import preprocess_gsm8k

    val = tmp_path / "val.parquet"
    pd.read_parquet(preprocess_gsm8k(str(gsm8k_dir), str(tmp_path / "full"))["test"]).head(2).to_parquet(val)
    ppo = ["data.max_prompt_length=1024", "data.max_response_length=4", "actor_rollout_ref.rollout.val_kwargs.n=2",
           "actor_rollout_ref.rollout.val_kwargs.do_sample=True", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
           "actor_rollout_ref.rollout.dtype=float32", "trainer.device=cpu"]
    metrics = evaluate.fn(["ray_init.num_cpus=1"], ctx, val_file=str(val), global_step=3, ppo_overrides=ppo,
                          model_path=str(tiny_model_dir))
    assert metrics["pass@2/num_prompts/openai/gsm8k"] == 2.0 and 0.0 <= metrics["test_score/openai/gsm8k"] <= 1.0
    store = ResultsStore(ctx["home"])
    # the samples are stored under the step of the model evaluated (3), as its metrics
    assert store.sql("SELECT count(*), count(DISTINCT prompt_id), count(question), max(length(response)) > 0, "
                     "min(step), max(step) FROM samples WHERE stage = 'evaluate'")[1] == [(4, 2, 4, True, 3, 3)]
    assert ("test_score/openai/gsm8k", 3, metrics["test_score/openai/gsm8k"]) in store.sql(
        "SELECT key, step, value FROM metrics WHERE stage = 'evaluate'")[1]
    run = _children(mlflow_client, ctx)["evaluate"]
    assert run.data.metrics["test_score/openai/gsm8k"] == metrics["test_score/openai/gsm8k"]
    _, [(params,)] = store.sql("SELECT params_json FROM runs WHERE stage = 'evaluate'")
    assert "custom_reward_function.name" in params and "suites" in params
    assert {a.path for a in mlflow_client.list_artifacts(run.info.run_id)} >= {"config", "samples"}


def test_build_model_waits_for_a_concurrent_build_and_reuses_its_folder(ctx, gsm8k_dir):
    """Two flow runs starting at once both miss Prefect's cache: the second build waits on the folder's
    lock and takes the finished folder as it is (no Ray job, no folder swapped under the first run)."""
    data = prepare_data.fn(_gsm8k_data(gsm8k_dir, 16, 4), ctx)
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


def _verl_rows(n: int, start: int = 0) -> list[dict]:
    """n verl-schema RL rows; row i's question is 'q<i> ' followed by i words, so prompts grow with i."""
    return [{"prompt": [{"role": "user", "content": f"q{i} " + "word " * i}], "data_source": "toy",
             "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {"index": i}}
            for i in range(start, start + n)]


def _file_data(train: list[str], val: list[str], n_train: int = -1, n_val: int = -1, suites=()) -> dict:
    return {"generator": None, "generator_args": {}, "train_files": train, "val_files": val,
            "train_prompts": n_train, "val_prompts": n_val, "sft_train_files": [], "sft_val_files": [],
            "suites": list(suites), "prompt_key": "prompt"}


def test_prepare_data_copies_a_memory_url_checks_cuts_and_digests(ctx, tmp_path, mlflow_client):
    """verl-schema parquet from a local file and a memory:// URL: the URL is copied once into the cache, both
    are cut to the first N rows, and every digest is the sha256 of the bytes (hashlib on the files here)."""
    import fsspec

    local = tmp_path / "train.parquet"
    pd.DataFrame(_verl_rows(10)).to_parquet(local)
    val_bytes = pd.DataFrame(_verl_rows(6, start=100)).to_parquet()
    with fsspec.open("memory://bucket/val.parquet", "wb") as fh:
        fh.write(val_bytes)
    out = prepare_data.fn(_file_data([str(local)], ["memory://bucket/val.parquet"], 7, 4,
                                     suites=[{"name": "hard", "files": ["memory://bucket/val.parquet"]}]), ctx)
    train, val = pd.read_parquet(out["train"]), pd.read_parquet(out["val"])
    assert list(train["extra_info"].map(lambda e: e["index"])) == list(range(7))  # first 7 of 10, in order
    assert list(val["reward_model"].map(lambda r: r["ground_truth"])) == ["100", "101", "102", "103"]
    assert out["rows"] == {"train": 7, "val": 4, "suite:hard": 6}
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    assert out["train_sha256"] == sha(Path(out["train"]).read_bytes())
    assert out["val_sha256"] == sha(Path(out["val"]).read_bytes())
    inputs = {(i["split"], i["file"]): (i["sha256"], i["rows"]) for i in out["inputs"]}
    assert inputs[("train", str(local))] == (sha(local.read_bytes()), 10)
    assert inputs[("val", "memory://bucket/val.parquet")] == (sha(val_bytes), 6)
    assert out["sft_train"] == out["train"] and len(pd.read_parquet(out["suites"]["hard"])) == 6
    assert any(Path(ctx["home"], "cache").rglob("val.parquet"))  # the URL's copy, under $RLHF_HOME/cache
    run = _children(mlflow_client, ctx)["prepare_data"]
    assert {i.dataset.name for i in run.inputs.dataset_inputs} == {"data_train", "data_val", "suite_hard"}
    assert run.data.params["prepared.train.rows"] == "7"


@pytest.mark.parametrize("change, message", [
    (lambda rows: [{k: v for k, v in r.items() if k != "prompt"} for r in rows], "missing column 'prompt'"),
    (lambda rows: [{**r, "prompt": r["prompt"][0]["content"]} for r in rows],
     "row 0: column 'prompt' is a string where verl has a list of chat messages"),
    (lambda rows: [{**r, "reward_model": {"style": "rule"}} for r in rows],
     "column 'reward_model' has no field 'ground_truth'"),
    (lambda rows: rows[:0], "the file has no rows"),
])
def test_prepare_data_refuses_a_file_outside_verls_schema_naming_file_row_column(ctx, tmp_path, change, message):
    bad = tmp_path / "bad.parquet"
    rows = change(_verl_rows(3))
    (pd.DataFrame(rows) if rows else pd.DataFrame(_verl_rows(1)).iloc[:0]).to_parquet(bad)
    good = tmp_path / "good.parquet"
    pd.DataFrame(_verl_rows(3)).to_parquet(good)
    from rlhf_core.data import DataError

    with pytest.raises(DataError) as err:
        prepare_data.fn(_file_data([str(good)], [str(bad)]), ctx)
    assert str(err.value).startswith(f"{bad}") and message in str(err.value) and "\n" not in str(err.value)


def test_filter_prompts_drops_overlong_rows_with_the_models_tokenizer(ctx, tmp_path, mlflow_client):
    """A tiny model built from the data, then the filter in 2 worker processes: the kept rows are exactly those
    whose chat-templated prompt has <= L tokens, counted here with the same tokenizer, one by one."""
    from rlhf_core.data.prompts import encode, render_prompt
    from rlhf_core.models.loading import load_tokenizer
    from rlhf_core.models.tiny import build_tiny_model

    rows = _verl_rows(12)
    pd.DataFrame(rows).to_parquet(tmp_path / "t.parquet")
    pd.DataFrame(rows[:5]).to_parquet(tmp_path / "v.parquet")
    model = build_tiny_model([r["prompt"][0]["content"] for r in rows], tmp_path / "model", vocab_size=300,
                             hidden_size=16, intermediate_size=32, num_layers=1)
    tok = load_tokenizer(model)
    lengths = [len(encode(tok, render_prompt(tok, r["prompt"]))) for r in rows]
    limit = sorted(lengths)[7]  # 8 of 12 train prompts fit (lengths grow with i: the first 8)
    prepared = prepare_data.fn(_file_data([str(tmp_path / "t.parquet")], [str(tmp_path / "v.parquet")]), ctx)
    cfg = {"max_prompt_length": limit, "workers": 2, "prompt_key": "prompt", "template_kwargs": {}}
    out = filter_prompts.fn(prepared, model, cfg, ctx)
    want = [i for i, n in enumerate(lengths) if n <= limit]
    assert out["filtered"] == {"train": {"kept": len(want), "dropped": 12 - len(want)},
                               "val": {"kept": len([i for i in want if i < 5]), "dropped": 5 - len([i for i in want if i < 5])}}
    got = pd.read_parquet(out["train"])["extra_info"].map(lambda e: e["index"]).tolist()
    assert got == want and len(want) == 8
    assert out["train_sha256"] == hashlib.sha256(Path(out["train"]).read_bytes()).hexdigest()
    assert out["sft_train"] == prepared["train"]  # SFT keeps the unfiltered rows
    run = _children(mlflow_client, ctx)["filter_prompts"]
    assert run.data.params["train.dropped"] == str(12 - len(want))
