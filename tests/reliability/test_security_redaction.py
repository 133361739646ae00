"""Security defaults (issue #12), part 2: secrets redacted from MLflow params, DuckDB params_json, Prefect
artifacts, tracking sinks and logs (part 1, servers, trust_remote_code and user code: test_security.py).

Real services where a sink is concerned: MLflow (SQLite store), DuckDB, a Prefect test server. No mocks of them.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest_services import *  # noqa: F401,F403 - rlhf_env, free_port (prefect_harness: tests/conftest.py)
from rlhf_core.config import load_base, load_config
from rlhf_core.config.schema import flatten
from rlhf_core.redact import SECRET, install_log_redaction, is_secret_name, redact, redact_text


SECRET_NAMES = ["api_key", "access_key", "secret_key", "token", "password", "credentials", "secret",
                "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD",
                "MLFLOW_TRACKING_TOKEN", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "OPENAI_API_KEY", "apiKey",
                "custom_reward_function.reward_kwargs.api_key", "reward_model.reward_kwargs.credentials.user",
                "actor_rollout_ref.rollout.engine_kwargs.vllm.hf_token", "db_password", "client_secret"]
# column names, token counts and tokenizer settings: names with "key"/"token" in them that are not secrets
NOT_SECRET_NAMES = ["data.prompt_key", "data.reward_fn_key", "data.response_key", "data.image_key",
                    "data.multiturn.messages_key", "data.data_source_key", "data.reward_model_key",
                    "actor_rollout_ref.rollout.max_num_batched_tokens", "critic.ppo_max_token_len_per_gpu",
                    "actor_rollout_ref.model.tokenizer_path", "data.tokenizer", "pad_token", "eos_token",
                    "data.balance_dp_token", "actor_rollout_ref.rollout.trace.token2text", "HF_TOKEN_PATH",
                    "TOKENIZERS_PARALLELISM", "monkey", "keys", "KEYBOARD"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_are_secret(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_column_and_token_count_names_are_not_secret(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("config_name", ["ppo_trainer", "sft_trainer", "evaluation"])
def test_no_shipped_config_key_is_redacted(config_name):
    """Every key of rlhf_core/configs/<name>.yaml (all ``*_key`` columns included) survives redaction unchanged."""
    base = load_base(config_name)
    raw = OmegaConf.to_container(base, resolve=False)
    assert [k for k in flatten(base, resolve=False) if is_secret_name(k)] == []
    assert redact(raw) == raw


def test_redact_values_nested_urls_overrides_and_copies(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wandb-env-value-123")
    cfg = {"reward_kwargs": {"api_key": "sk-nested-999", "note": "uses sk-nested-999 twice", "enabled_token": True,
                             "credentials": {"user": "bob", "pw": "pw-in-credentials"}, "limit_token": None,
                             "secret_pin": 1234},
           "url": "https://alice:url-pass-777@sandbox.example/run?token=qtok-555&n=3",
           "overrides": ["+custom_reward_function.reward_kwargs.api_key=override-val-1", "trainer.total_epochs=2"],
           "log": "WANDB_API_KEY is wandb-env-value-123"}
    out = redact(cfg)
    # hand-derived: the secret-named leaves become ***, bool/None stay (they cannot hold a secret), a number does
    assert out["reward_kwargs"] == {"api_key": SECRET, "note": f"uses {SECRET} twice", "enabled_token": True,
                                    "credentials": {"user": SECRET, "pw": SECRET}, "limit_token": None,
                                    "secret_pin": SECRET}
    assert out["url"] == f"https://alice:{SECRET}@sandbox.example/run?token={SECRET}&n=3"
    assert out["overrides"] == [f"+custom_reward_function.reward_kwargs.api_key={SECRET}", "trainer.total_epochs=2"]
    assert out["log"] == f"WANDB_API_KEY is {SECRET}"
    assert cfg["reward_kwargs"]["api_key"] == "sk-nested-999"  # the input is not changed
    assert redact_text("a later line quoting sk-nested-999") == f"a later line quoting {SECRET}"


# secrets placed where a user could put them: free-form dicts of rlhf_core/configs/ppo_trainer.yaml, a URL key, an
# environment variable whose value is also quoted in a non-secret field
VALUES = {"reward": "rk-reward-kwargs-0001", "vllm": "hf-engine-kwargs-0002", "url": "url-password-0003",
          "env": "hf-env-token-0004", "rm": "rm-credentials-0005"}


def _secret_config(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", VALUES["env"])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "mlflow-pass-0006")
    return load_config("ppo_trainer", [
        f"+custom_reward_function.reward_kwargs.api_key={VALUES['reward']}",
        f"+custom_reward_function.reward_kwargs.hub_note=pulled-with-{VALUES['env']}",
        f"+actor_rollout_ref.rollout.engine_kwargs.vllm.hf_token={VALUES['vllm']}",
        f"+custom_reward_function.reward_kwargs.endpoint=https://svc:{VALUES['url']}@sandbox.internal/run",
        f"+reward_model.reward_kwargs.credentials.password={VALUES['rm']}",
    ])


def _assert_clean(text: str, where: str) -> None:
    leaked = [v for v in [*VALUES.values(), "mlflow-pass-0006"] if v in text]
    assert leaked == [], f"{where} leaks {leaked}"


def test_secrets_stay_out_of_mlflow_duckdb_and_tracking(rlhf_env, results_store, mlflow_client, monkeypatch):
    from rlhf_core.trainer.tracking import Tracking
    from tasks.common import make_context, stage

    cfg = _secret_config(monkeypatch)
    ctx = make_context(str(rlhf_env), "security", None, None, str(rlhf_env / "run"))
    with stage("ppo", cfg, ctx) as run_id:
        pass  # entering the stage logs the config (params, tags, artifact); the stage's work is not under test
    run = mlflow_client.get_run(run_id)
    params = run.data.params
    _assert_clean(json.dumps(params), "MLflow params")
    assert params["custom_reward_function.reward_kwargs.api_key"] == SECRET
    assert params["custom_reward_function.reward_kwargs.endpoint"] == f"https://svc:{SECRET}@sandbox.internal/run"
    assert params["custom_reward_function.reward_kwargs.hub_note"] == f"pulled-with-{SECRET}"
    assert params["data.prompt_key"] == "prompt" and params["data.reward_fn_key"] == "data_source"  # kept
    _assert_clean(json.dumps(run.data.tags), "MLflow tags")
    artifact = Path(mlflow_client.download_artifacts(run_id, "config/ppo.json", str(rlhf_env / "dl")))
    _assert_clean(artifact.read_text(), "config artifact")
    _, rows = results_store.sql(f"SELECT params_json FROM runs WHERE run_id = '{run_id}'")
    assert len(rows) == 1
    _assert_clean(rows[0][0], "DuckDB runs.params_json")
    assert json.loads(rows[0][0])["actor_rollout_ref.rollout.engine_kwargs.vllm.hf_token"] == SECRET
    # a params_json written by any other caller (the flow's own row) is redacted by the store itself
    results_store.index_run("flowrow", "flowrow", "flow", "FINISHED", None, None,
                            json.dumps({"ppo_overrides": [f"+a.b.api_key={VALUES['reward']}"]}), kind="flow")
    _, rows = results_store.sql("SELECT params_json FROM runs WHERE run_id = 'flowrow'")
    assert json.loads(rows[0][0]) == {"ppo_overrides": [f"+a.b.api_key={SECRET}"]}
    # the trainers' own MLflow sink (rlhf ppo outside the flow) logs the same redacted params
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    tracking = Tracking("security-core", "run", ["mlflow"], config=cfg)
    sink_params = mlflow_client.get_run(tracking.sinks["mlflow"].run_id).data.params
    tracking.finish()
    _assert_clean(json.dumps(sink_params), "trainer MLflow sink")
    assert sink_params["custom_reward_function.reward_kwargs.api_key"] == SECRET


def test_secrets_stay_out_of_logs(monkeypatch, caplog):
    cfg = _secret_config(monkeypatch)
    install_log_redaction()
    redact(cfg)  # what Tracking / validate_overrides do with a run's config: its secret values are now known
    log = logging.getLogger("rlhf_core.security_probe")
    with caplog.at_level(logging.INFO, logger="rlhf_core.security_probe"):
        log.info("reward kwargs %s", dict(cfg.custom_reward_function.reward_kwargs))
        log.info("engine kwargs %s", dict(cfg.actor_rollout_ref.rollout.engine_kwargs.vllm))
        log.info("scoring service at %s", cfg.custom_reward_function.reward_kwargs.endpoint)
        log.warning("token from the environment: %s", os.environ["HF_TOKEN"])
        log.info("override +reward_model.reward_kwargs.credentials.password=%s", VALUES["rm"])
    text = caplog.text + "".join(r.getMessage() for r in caplog.records)
    _assert_clean(text, "log records")
    assert text.count(SECRET) >= 6 and "hub_note" in text  # the lines are there, only the values are gone


def test_secrets_stay_out_of_prefect_artifacts(prefect_harness, rlhf_env, results_store, monkeypatch):
    from prefect import flow
    from prefect.client.orchestration import get_client

    from flows import artifacts

    _secret_config(monkeypatch)  # HF_TOKEN in the environment
    key = "rlhf-summary"

    @flow(name="security-artifact-probe")
    def probe() -> None:
        artifacts.publish(results_store, "probe-flow", "probe-parent", {}, {"metrics": {}, "global_step": 0},
                          {f"test_score/src-{VALUES['env']}": 0.5},
                          gate=f"baseline compared with HF_TOKEN={VALUES['env']} at https://u:{VALUES['url']}@h/")

    probe()

    async def read() -> list:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))

    import asyncio

    found = asyncio.run(read())
    markdown = "\n".join(str(a.data) for a in found)  # this run's and any other test's summaries
    assert "baseline compared with" in markdown, "no rlhf-summary artifact of this run"
    _assert_clean(markdown, "Prefect markdown artifacts")
    assert f"HF_TOKEN={SECRET}" in markdown and f"https://u:{SECRET}@h/" in markdown
