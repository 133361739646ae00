"""The whole `rlhf` flow on real GSM8K prompts, embedded services, then SQL and MLflow checks.

Runs ``python -m flows.rlhf`` in a subprocess exactly as ``rlhf pipeline`` does (embedded Ray,
Prefect ephemeral mode, MLflow SQLite and DuckDB under a temporary ``RLHF_HOME``), with two
PPO segments so the second one resumes from the first one's checkpoint; then a second, shorter
run of the same inputs that takes its first three stages from Prefect's cache. Last, a separate run of an
experiment file written by the test: verl-schema parquet served by an S3 server (moto, 127.0.0.1), its own reward
function file, two evaluation suites and GAE.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray  # starts Ray through an entry point (the rlhf CLI, a trainer, the flow)


REPO = Path(__file__).resolve().parents[2]
STAGES = {"prepare_data", "build_model", "filter_prompts", "sft", "ppo", "evaluate"}
PPO_METRICS = {"critic/score/mean", "actor/pg_loss", "actor/entropy", "timing_s/gen", "perf/throughput"}


def _run_flow(home: Path, gsm8k_dir: Path | None, *extra: str, experiment: Path | None = None,
              env: dict[str, str] | None = None) -> str:
    """``python -m flows.rlhf`` on the default experiment with this module's sizes, or on ``experiment`` as it is
    (then ``extra`` only); ``env`` is added to the process's environment."""
    run_env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MLFLOW_", "PREFECT_", "RLHF_", "RAY_ADDRESS"))}
    run_env.update(RLHF_HOME=str(home), RAY_AUTH_MODE="disabled", **(env or {}))
    if gsm8k_dir is not None:
        run_env["GSM8K_DIR"] = str(gsm8k_dir)
    sizes = ["--train-prompts", "64", "--val-prompts", "8", "--ppo-steps", "2", "--segment-steps", "1",
             "--sft-epochs", "1"]
    cmd = [sys.executable, "-m", "flows.rlhf",
           *(sizes if experiment is None else ["--experiment", str(experiment)]), *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=run_env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert "rlhf results sql" in proc.stdout  # the run tells the user how to query it
    return proc.stdout


@pytest.fixture(scope="module")
def flow_home(tmp_path_factory, gsm8k_dir):
    home = tmp_path_factory.mktemp("e2e") / "home"
    _run_flow(home, gsm8k_dir)
    return home


def _parents(client, experiment: str = "rlhf"):
    exp = client.get_experiment_by_name(experiment)
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


# The S3 experiment below: its reward rule, which the test applies again to every stored sample.
REWARD_PY = """\
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    \"\"\"(len(response) + len(ground truth)) mod 5, over 4: a rule a test can apply again to a stored sample.\"\"\"
    return ((len(solution_str) + len(ground_truth)) % 5) / 4
"""


def _rule(response: str, ground_truth: str) -> float:
    return ((len(response) + len(ground_truth)) % 5) / 4


def _rl_rows(source: str, questions: list[tuple[str, str]]) -> list[dict]:
    """verl's RL schema: prompt as chat messages, data_source, reward_model.ground_truth, extra_info (the SFT
    stage reads extra_info.question/answer, as experiments/gsm8k_tiny.yaml does)."""
    return [{"prompt": [{"role": "user", "content": q}], "data_source": source, "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": a},
             "extra_info": {"split": source, "index": i, "question": q, "answer": f"#### {a}"}}
            for i, (q, a) in enumerate(questions)]


def _sums(pairs: list[tuple[int, int]]) -> list[tuple[str, str]]:
    return [(f"What is {a} + {b}?", str(a + b)) for a, b in pairs]


# 200 words: Qwen2's pre-tokenizer splits words, so at least 200 tokens with any vocabulary, above
# data.max_prompt_length=64. A short prompt has at most 16 characters and ChatML adds 3 special tokens and 17 other
# characters ('user', 'assistant', newlines): at most 36 tokens (a byte-level token is at least one ASCII character).
OVERLONG = "Count the apples: " + " ".join(["apples"] * 200) + "?"

S3_EXPERIMENT = """\
name: s3-gae
description: verl-schema parquet on an S3 server, custom reward, two suites, GAE from the SFT model
model:
  path: null
  tiny: {{vocab_size: 2000, hidden_size: 64, intermediate_size: 128, num_layers: 2, num_attention_heads: 2,
         num_key_value_heads: 1}}
data:
  train_files: [s3://{bucket}/rl/train.parquet]
  val_files: [s3://{bucket}/rl/val.parquet]
sft:
  epochs: 1
  overrides: [data.prompt_key=extra_info, data.response_key=extra_info, "data.prompt_dict_keys=[question]",
              "data.response_dict_keys=[answer]", data.train_batch_size=4, data.micro_batch_size_per_gpu=2,
              data.max_length=384, data.truncation=right, trainer.n_gpus_per_node=1, trainer.device=cpu,
              "trainer.logger=[console,mlflow,file]"]
ppo:
  total_steps: 2
  segment_steps: 1
  adv_estimator: gae
  overrides:
    - data.max_prompt_length=64
    - data.max_response_length=8
    - data.train_batch_size=4
    - data.filter_overlong_prompts=True
    - actor_rollout_ref.rollout.name=hf
    - actor_rollout_ref.rollout.n=2
    - actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    - actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
    - actor_rollout_ref.actor.ppo_mini_batch_size=4
    - actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
    - critic.ppo_micro_batch_size_per_gpu=8
    - trainer.n_gpus_per_node=1
    - trainer.device=cpu
    - trainer.val_before_train=False
    - trainer.total_epochs=10
    - "trainer.logger=[mlflow,file]"
reward: {{path: reward.py, name: compute_score}}
evaluation:
  overrides: [ray_init.num_cpus=1]   # score in the evaluation task itself (4 + 2 responses)
  suites:
    - {{name: sums, files: [s3://{bucket}/eval/sums.parquet], n: 1, temperature: 0.0, response_length: 6}}
    - {{name: doubles, files: [s3://{bucket}/eval/doubles.parquet], n: 2, temperature: 1.0, response_length: 6}}
"""


@pytest.fixture
def s3_endpoint():
    """moto's S3 server on 127.0.0.1 (a free port), in this process; its URL."""
    from moto.server import ThreadedMotoServer

    from conftest_services import pick_free_port

    port = pick_free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _prefect_task_runs(home: Path, prefix: str) -> list[tuple[str, str, int]]:
    """(name, state, run count) of the flow's task runs named ``prefix...``, from the ephemeral Prefect database."""
    import sqlite3

    with sqlite3.connect(home / "prefect" / "prefect.db") as con:
        return con.execute("SELECT name, state_type, run_count FROM task_run WHERE name LIKE ? ORDER BY name",
                           (f"{prefix}%",)).fetchall()


@pytest.mark.slow
def test_s3_experiment_with_custom_reward_and_two_suites_runs_gae_from_the_sft_model(tmp_path, s3_endpoint):
    """Issue 33: an experiment file (written here) whose data are verl-schema parquet files on an S3 server (moto,
    127.0.0.1), with its own reward function file and two evaluation suites, runs the whole flow: prepare_data
    records the uploaded bytes' sha256, filter_prompts drops the one overlong prompt, each of the two segments gets
    one validate task, every stored sample is scored by the file's rule, both suites' metrics are in MLflow and
    DuckDB. And the README's GAE flow: the critic starts from the SFT model (the pipeline once left
    ``critic.model.path`` at verl's default, and the PPO stage failed inside a Ray worker)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    import s3fs

    bucket = "rlhf-data"
    files = {  # 8 short training prompts and an overlong 9th; 2 prompts in val and in each suite
        "rl/train.parquet": _rl_rows("sums", _sums([(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4), (6, 1), (9, 9)])
                                     + [(OVERLONG, "200")]),
        "rl/val.parquet": _rl_rows("sums", _sums([(2, 3), (8, 1)])),
        "eval/sums.parquet": _rl_rows("sums", _sums([(11, 22), (30, 4)])),
        "eval/doubles.parquet": _rl_rows("doubles", [("Double 6.", "12"), ("Double 21.", "42")]),
    }
    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=s3_endpoint)
    fs.mkdir(bucket)
    digests = {}
    for key, rows in files.items():
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buf)
        fs.pipe(f"{bucket}/{key}", buf.getvalue())
        digests[key] = hashlib.sha256(buf.getvalue()).hexdigest()
    experiment = tmp_path / "exp" / "s3_gae.yaml"
    experiment.parent.mkdir()
    experiment.write_text(S3_EXPERIMENT.format(bucket=bucket))
    (experiment.parent / "reward.py").write_text(REWARD_PY)

    home = tmp_path / "home"
    # the flow's s3fs takes its endpoint from fsspec's own configuration (FSSPEC_<PROTOCOL>_<KWARG>, no code of
    # ours) and its credentials from botocore's AWS_* variables
    _run_flow(home, None, experiment=experiment,
              env={"FSSPEC_S3_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                   "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                   "AWS_EC2_METADATA_DISABLED": "true", "NO_PROXY": "127.0.0.1,localhost"})
    _check_s3_run(home, experiment.parent / "reward.py", digests)


def _check_s3_run(home: Path, reward_file: Path, digests: dict[str, str]) -> None:
    """The assertions of the S3 experiment's flow run in ``home`` (``digests``: sha256 of each uploaded object)."""
    from mlflow import MlflowClient

    from infra.results import ResultsStore

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    runs, parents = _parents(client, "s3-gae")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    stages = {r.data.tags["rlhf.stage"]: r for r in runs
              if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id}
    assert set(stages) == STAGES
    # prepare_data copied the S3 objects: the digests it recorded are those of the bytes uploaded above, in the
    # order train, val, then the suites; 9 + 2 rows prepared
    prep = stages["prepare_data"].data.params
    assert {k: v for k, v in prep.items() if k.startswith("input.")} == {
        "input.train.0.sha256": digests["rl/train.parquet"], "input.val.1.sha256": digests["rl/val.parquet"],
        "input.suite:sums.2.sha256": digests["eval/sums.parquet"],
        "input.suite:doubles.3.sha256": digests["eval/doubles.parquet"]}
    assert (prep["prepared.train.rows"], prep["prepared.val.rows"]) == ("9", "2")
    # filter_prompts: the 200-word prompt is dropped (>= 200 tokens > 64), the 8 short ones and both val kept
    filtered = stages["filter_prompts"].data.params
    assert [filtered[f"{s}.{k}"] for s in ("train", "val") for k in ("kept", "dropped")] == ["8", "1", "2", "0"]

    # GAE: the critic is built from the SFT model, as the actor is; both segments logged a critic loss
    sft_model = stages["sft"].data.tags["artifact.hf_model.path"]
    ppo = stages["ppo"]
    assert ppo.data.params["algorithm.adv_estimator"] == "gae"
    assert ppo.data.params["critic.model.path"] == ppo.data.params["actor_rollout_ref.model.path"] == sft_model
    # the experiment's reward file scores training, validation and evaluation
    assert ppo.data.params["custom_reward_function.path"] == str(reward_file)
    assert stages["evaluate"].data.params["custom_reward_function.path"] == str(reward_file)
    assert [m.step for m in client.get_metric_history(ppo.info.run_id, "critic/vf_loss")] == [1, 2]
    # two segments of one step, each followed by exactly one validate task, which logged val-core at its step
    assert _prefect_task_runs(home, "ppo_segment") == [("ppo_segment 1/2 (steps 1-1)", "COMPLETED", 1),
                                                       ("ppo_segment 2/2 (steps 2-2)", "COMPLETED", 1)]
    assert _prefect_task_runs(home, "validate") == [("validate · step 1", "COMPLETED", 1),
                                                    ("validate · step 2", "COMPLETED", 1)]
    val_key = next(k for k in ppo.data.metrics if k.startswith("val-core/sums/"))
    assert [m.step for m in client.get_metric_history(ppo.info.run_id, val_key)] == [1, 2]

    store = ResultsStore(home)
    # every stored sample (validation at steps 1 and 2, both suites) is scored by the file's rule
    _, samples = store.sql("SELECT stage, step, suite, data_source, uid, response, ground_truth, score FROM samples")
    assert samples and all(score == _rule(resp, truth) for *_, resp, truth, score in samples)
    counts = collections.Counter((stage, step if stage == "ppo" else suite, ds)
                                 for stage, step, suite, ds, *_ in samples)
    # validation: 2 val prompts x val_kwargs.n=1 (greedy) at steps 1 and 2; the suites: 2 prompts x n=1 and
    # 2 prompts x n=2, each sample's data_source '<suite>/<data_source>'
    assert counts == {("ppo", 1, "sums"): 2, ("ppo", 2, "sums"): 2, ("evaluate", "sums", "sums/sums"): 2,
                      ("evaluate", "doubles", "doubles/doubles"): 4}
    # test_score/<suite>/<data_source>: the mean over prompts of each prompt's mean score, from those samples
    expected = {}
    for suite, ds in (("sums", "sums"), ("doubles", "doubles")):
        per_prompt: dict[str, list[float]] = {}
        for stage, _, s, _, uid, _, _, score in samples:
            if stage == "evaluate" and s == suite:
                per_prompt.setdefault(uid, []).append(score)
        assert len(per_prompt) == 2
        expected[f"test_score/{suite}/{ds}"] = sum(sum(v) / len(v) for v in per_prompt.values()) / 2
    logged = stages["evaluate"].data.metrics
    assert {k: logged[k] for k in expected} == pytest.approx(expected, abs=1e-12)
    _, rows = store.sql("SELECT key, step, value FROM metrics WHERE stage = 'evaluate' AND key LIKE 'test_score/%'")
    assert {k: (step, v) for k, step, v in rows} == {k: (2, pytest.approx(v, abs=1e-12)) for k, v in expected.items()}
