"""The whole `rlhf` flow on real GSM8K prompts, embedded services, then SQL and MLflow checks.

Runs ``python -m flows.rlhf`` in a subprocess exactly as ``make demo`` does (embedded Ray,
Prefect ephemeral mode, MLflow SQLite and DuckDB under a temporary ``RLHF_HOME``), with two
PPO segments so the second one resumes from the first one's checkpoint; then a second, shorter
run of the same inputs that takes its first three stages from Prefect's cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
STAGES = {"prepare_data", "build_model", "filter_prompts", "sft", "ppo", "evaluate"}
PPO_METRICS = {"critic/score/mean", "actor/pg_loss", "actor/entropy", "timing_s/gen", "perf/throughput"}


def _run_flow(home: Path, gsm8k_dir: Path, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "PREFECT_", "RLHF_", "RAY_ADDRESS"))}
    env.update(RLHF_HOME=str(home), GSM8K_DIR=str(gsm8k_dir), RAY_AUTH_MODE="disabled")
    cmd = [sys.executable, "-m", "flows.rlhf", "--train-prompts", "64", "--val-prompts", "8",
           "--ppo-steps", "2", "--segment-steps", "1", "--sft-epochs", "1", *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert "rlhf results sql" in proc.stdout  # the run tells the user how to query it
    return proc.stdout


@pytest.fixture(scope="module")
def flow_home(tmp_path_factory, gsm8k_dir):
    home = tmp_path_factory.mktemp("e2e") / "home"
    _run_flow(home, gsm8k_dir)
    return home


def _parents(client):
    exp = client.get_experiment_by_name("rlhf")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    return runs, [r for r in runs if "mlflow.parentRunId" not in r.data.tags]


@pytest.mark.slow
def test_duckdb_holds_scored_samples_metrics_and_runs(flow_home):
    from infra.results import ResultsStore

    store = ResultsStore(flow_home)
    _, rows = store.sql("SELECT stage, count(*), count(score), min(score), max(score) "
                        "FROM samples GROUP BY stage ORDER BY stage")
    by_stage = {r[0]: r for r in rows}
    assert set(by_stage) == {"evaluate", "ppo"}
    for stage, n, n_scored, lo, hi in rows:
        assert n > 0 and n_scored == n, stage  # every sample carries a score
        assert 0.0 <= lo <= hi <= 1.0
    # 8 validation prompts x val_kwargs.n=2 per validation step; evaluation scores the last step
    assert by_stage["evaluate"][1] == 16
    _, steps = store.sql("SELECT DISTINCT step FROM samples WHERE stage = 'ppo' ORDER BY step")
    assert steps == [(1,), (2,)]
    _, keys = store.sql("SELECT DISTINCT key FROM metrics WHERE stage = 'ppo'")
    assert PPO_METRICS <= {k for (k,) in keys}
    _, runs = store.sql("SELECT stage, status FROM runs ORDER BY stage")
    assert all(status == "FINISHED" for _, status in runs)
    assert sorted(s for s, _ in runs) == ["build_model", "evaluate", "filter_prompts", "flow", "ppo", "prepare_data",
                                          "sft"]
    # one row per run id; the flow run's row has its name and parameters
    assert store.sql("SELECT count(*) = count(DISTINCT run_id) FROM runs")[1] == [(True,)]
    _, [(kind, name, params)] = store.sql("SELECT kind, name, params_json FROM runs WHERE stage = 'flow'")
    assert kind == "flow" and name and json.loads(params)["ppo_steps"] == 2
    # the ppo row holds the whole resolved config, not a handful of keys
    _, [(ppo_params,)] = store.sql("SELECT params_json FROM runs WHERE stage = 'ppo'")
    assert len(json.loads(ppo_params)) > 200 and json.loads(ppo_params)["trainer.stop_after_step"] == "2"
    # evaluation metrics are queryable, at the last PPO step
    _, ev = store.sql("SELECT step, key FROM metrics WHERE stage = 'evaluate' ORDER BY key")
    assert ("test_score/openai/gsm8k" in {k for _, k in ev}) and {s for s, _ in ev} == {2}
    # every sample has a prompt id, a question and its checkpoint; evaluate generated anew with the final model
    # (issue 33): its prompts are the dataset's chat messages, not the trainer's rendered template, so its ids are
    # its own (the same in every run's evaluate, which is what comparisons pair)
    _, ids = store.sql("SELECT stage, count(DISTINCT prompt_id), count(question), count(checkpoint), count(*) "
                       "FROM samples WHERE stage = 'evaluate' OR step = 2 GROUP BY stage ORDER BY stage")
    assert [r[1] for r in ids] == [8, 8] and all(r[2] == r[4] and r[3] == r[4] for r in ids)
    _, ckpt = store.sql("SELECT DISTINCT checkpoint FROM samples WHERE stage = 'evaluate'")
    assert len(ckpt) == 1 and ckpt[0][0].endswith("checkpoints/global_step_2")  # the final model's checkpoint
    # validation is its own task: one validate_step_<N> metrics file per checkpoint, the segments validate nothing
    _, vals = store.sql("SELECT DISTINCT step FROM metrics WHERE stage = 'ppo' AND key LIKE 'val-core/%' ORDER BY 1")
    assert vals == [(1,), (2,)]


@pytest.mark.slow
def test_mlflow_holds_parent_nested_runs_inputs_and_metrics(flow_home):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{flow_home / 'mlflow.db'}")
    runs, parents = _parents(client)
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["prefect.flow_run_id"]
    # the final validation and evaluation metrics are summarised on the parent run
    assert "val-core/openai/gsm8k/reward/mean_at_2" in parent.data.metrics
    assert "test_score/openai/gsm8k" in parent.data.metrics
    # stage runs are named '<stage> · <flow run>' and tagged rlhf.stage
    children = {r.data.tags["rlhf.stage"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert set(children) == STAGES
    assert all(r.info.run_name.startswith(f"{stage} · ") for stage, r in children.items())
    assert all(r.info.status == "FINISHED" for r in children.values())

    ppo = children["ppo"]
    history = {k: client.get_metric_history(ppo.info.run_id, k) for k in PPO_METRICS}
    for key, points in history.items():
        # both segments log into one run, each step once: segment 2 resumed at step 1's checkpoint
        assert sorted(m.step for m in points) == [1, 2], key
    assert ppo.data.params["algorithm.adv_estimator"] == "grpo"
    assert any(k.startswith("val-core/openai/gsm8k/reward/mean") for k in ppo.data.metrics)

    prep, filtered = children["prepare_data"], children["filter_prompts"]
    sha = lambda tags, name: hashlib.sha256(Path(tags[f"dataset.{name}.path"]).read_bytes()).hexdigest()  # noqa: E731
    assert prep.data.tags["dataset.gsm8k_train.sha256"] == sha(prep.data.tags, "gsm8k_train")
    # PPO trains on the filter_prompts output (overlong prompts dropped with the model's tokenizer)
    digest = sha(filtered.data.tags, "filtered_train")
    assert filtered.data.tags["dataset.filtered_train.sha256"] == digest
    assert int(filtered.data.params["train.kept"]) + int(filtered.data.params["train.dropped"]) == 64
    for run in (prep, filtered, children["sft"], ppo):
        contexts = {i.dataset.name: {t.key: t.value for t in i.tags}["mlflow.data.context"]
                    for i in run.inputs.dataset_inputs}
        assert "training" in contexts.values() and "validation" in contexts.values()
    assert ppo.data.tags["dataset.gsm8k_train.sha256"] == digest
    assert [a.path for a in client.list_artifacts(children["sft"].info.run_id)] == ["config", "hf_model"]
    # the ppo run: its resolved config, the reward chart and the merged (loadable) final policy
    assert [a.path for a in client.list_artifacts(ppo.info.run_id)] == ["charts", "config", "hf_model"]
    assert [a.path for a in client.list_artifacts(ppo.info.run_id, "charts")] == ["charts/reward_over_steps.png"]
    assert "hf_model/config.json" in {a.path for a in client.list_artifacts(ppo.info.run_id, "hf_model")}
    # segment 1 logged stop_after_step=1, segment 2 changed it: a tag, not a failed param update
    assert ppo.data.params["trainer.stop_after_step"] == "2" and ppo.data.tags["param.trainer.stop_after_step"] == "1"
    assert any(k.startswith("test_score/") for k in children["evaluate"].data.metrics)
    assert {a.path for a in client.list_artifacts(children["evaluate"].info.run_id)} >= {"config", "samples"}
    # the final policy is a registered model version with its lineage
    [version] = client.search_model_versions("name = 'rlhf'")
    assert version.run_id == ppo.info.run_id
    assert Path(version.tags["sft_model"]).resolve() == Path(children["sft"].data.tags["artifact.hf_model.path"])
    assert version.tags["ppo_checkpoint"].endswith("global_step_2") and version.tags["dataset.gsm8k_train.sha256"] == digest
    # the parent run says where it came from, and is named after the flow run
    assert parent.info.run_name != "rlhf" and len(parent.data.tags["rlhf.config_sha256"]) == 64
    assert parent.data.tags["git.dirty"] in ("true", "false")
    exp = client.get_experiment(parent.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


@pytest.mark.slow
def test_second_run_reuses_cached_stages(flow_home, gsm8k_dir):
    """Same inputs again: prepare_data, build_model and sft come from Prefect's cache (their output folders are
    keyed by input digests); the parent run points at the runs that made them, and only ppo runs anew (one step,
    no evaluation, to keep it short). A failed segment's Prefect retry is tests/reliability/test_faults.py's."""
    from mlflow import MlflowClient

    from infra.results import ResultsStore

    _run_flow(flow_home, gsm8k_dir, "--ppo-steps", "1", "--skip-evaluate")
    client = MlflowClient(tracking_uri=f"sqlite:///{flow_home / 'mlflow.db'}")
    runs, parents = _parents(client)
    assert len(parents) == 2
    first, second = parents
    for stage in ("prepare_data", "build_model", "filter_prompts", "sft"):
        assert second.data.tags[f"stage.{stage}.run_id"] == first.data.tags[f"stage.{stage}.run_id"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == second.info.run_id]
    cached = {r.data.tags["rlhf.stage"]: r.data.tags["rlhf.cached_from_run_id"] for r in children
              if "rlhf.cached_from_run_id" in r.data.tags}  # records pointing at the first run's stage runs
    assert cached == {stage: first.data.tags[f"stage.{stage}.run_id"]
                      for stage in ("prepare_data", "build_model", "filter_prompts", "sft")}
    new_children = {r.data.tags["rlhf.stage"]: r for r in children if "rlhf.cached_from_run_id" not in r.data.tags}
    assert set(new_children) == {"ppo"}
    # the new ppo run trained from the cached SFT model: its registered version names the first run's one
    versions = {str(v.version): v for v in client.search_model_versions("name = 'rlhf'")}
    assert set(versions) == {"1", "2"} and versions["2"].run_id == new_children["ppo"].info.run_id
    assert versions["2"].tags["sft_model"] == versions["1"].tags["sft_model"]
    history = client.get_metric_history(new_children["ppo"].info.run_id, "critic/score/mean")
    assert [m.step for m in history] == [1]
    # DuckDB: the second flow run's own rows are the flow and its ppo stage (the cached stages stay the first's)
    flow_run_id = second.data.tags["prefect.flow_run_id"]
    _, rows = ResultsStore(flow_home).sql(
        f"SELECT stage, status FROM runs WHERE flow_run_id = '{flow_run_id}' ORDER BY stage")
    assert rows == [("flow", "FINISHED"), ("ppo", "FINISHED")]


@pytest.mark.slow
def test_gae_flow_starts_its_critic_from_the_sft_model(tmp_path, gsm8k_dir):
    """The README's ``--adv-estimator gae`` flow: the critic is built from the SFT model (the pipeline once left
    ``critic.model.path`` at verl's default, and the PPO stage failed inside a Ray worker). Own home: the shared
    one's run count is asserted above."""
    from mlflow import MlflowClient

    home = tmp_path / "home"
    _run_flow(home, gsm8k_dir, "--ppo-steps", "1", "--skip-evaluate", "--adv-estimator", "gae")
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    runs = {r.data.tags["rlhf.stage"]: r for r in _parents(client)[0] if "rlhf.stage" in r.data.tags}
    sft_model = runs["sft"].data.tags["artifact.hf_model.path"]
    params = runs["ppo"].data.params
    assert params["algorithm.adv_estimator"] == "gae"
    assert params["critic.model.path"] == params["actor_rollout_ref.model.path"] == sft_model
    assert [m.step for m in client.get_metric_history(runs["ppo"].info.run_id, "critic/vf_loss")] == [1]
