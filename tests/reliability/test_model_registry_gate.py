"""The model registry after the regression gate: real MLflow SQLite store and registry, real DuckDB gate.

Three nights of the same flow: night 1 has no earlier run to compare with, night 2 scores as well as night 1
(the gate passes), night 3 fails half its prompts (the gate fails). Each night registers its merged policy
after the gate (``tasks.register.publish_version``, what the ``register_model`` task runs after the merge).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import mlflow.artifacts
import pytest

from conftest_services import *  # noqa: F401,F403
from flows import report
from infra import lineage, model_registry
from rlhf_core.metrics.samples import write_samples_parquet
from tasks.register import gate_verdict, publish_version

MODEL = "exp-gate"
T0 = dt.datetime(2026, 11, 1, 2, 0, 0)


def _eval_run(store, tmp_path, flow_id: str, run_id: str, scores: list[int], day: int) -> None:
    """A finished flow run ``flow_id`` whose evaluate stage ``run_id`` scored prompt ``i`` with ``scores[i]``
    (one sample per prompt, so a prompt's mean is its score)."""
    rows = [{"step": 0, "data_source": "openai/gsm8k", "uid": str(i), "sample_idx": 0, "prompt": f"user: q {i}",
             "response": "r", "ground_truth": "1", "score": float(score)} for i, score in enumerate(scores)]
    path = write_samples_parquet(rows, str(tmp_path / run_id), "eval_samples")
    start = T0 + dt.timedelta(days=day)
    store.index_run(flow_id, flow_id, "flow", "FINISHED", start, start + dt.timedelta(hours=1), "{}",
                    name=f"night-{day}", kind="flow")
    store.index_run(run_id, flow_id, "evaluate", "FINISHED", start, start + dt.timedelta(minutes=5), "{}",
                    name="evaluate")
    store.register_samples([path], run_id, "evaluate")


def _night(results_store, tmp_path, day: int, scores: list[int], baseline_ref: str | None):
    """Night ``day``: an evaluation with ``scores``, the gate against ``baseline_ref`` (None: no earlier run),
    then the registration of a policy folder whose config.json says which night made it."""
    flow, eval_run = f"flow{day}", f"eval{day}"
    _eval_run(results_store, tmp_path, flow, eval_run, scores, day=day)
    baseline = report.resolve_baseline(results_store, baseline_ref, flow) if baseline_ref else None
    failure = detail = None
    if baseline is not None:
        _, failure = report.gate(results_store, baseline, eval_run, max_regression=0.1)
        detail = failure or f"passed vs {baseline.run_id}"
    verdict = gate_verdict(True, baseline is not None, failure)
    hf = tmp_path / f"hf_policy_{day}"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "qwen2", "night": day}))
    ppo_run = lineage.start_run(MODEL, f"ppo · night-{day}")
    evaluation = {"test_score/openai/gsm8k": sum(scores) / len(scores), "pass@1/openai/gsm8k": sum(scores) / len(scores)}
    out = publish_version(ppo_run, hf, MODEL, {"flow_run_id": flow}, evaluation, verdict, detail,
                          baseline.run_id if baseline is not None else None)
    return verdict, out


def _champion_night(tmp_path) -> int:
    """Which night's folder ``models:/<MODEL>@champion`` resolves to (downloaded through the registry URI)."""
    folder = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL}@champion", dst_path=str(tmp_path)))
    return json.loads((folder / "config.json").read_text())["night"]


def test_champion_moves_only_when_the_gate_passes(rlhf_env, results_store, mlflow_client, tmp_path):
    # night 1: the gate is on (previous-successful) but there is no earlier run: registered as candidate only
    verdict, out = _night(results_store, tmp_path, 1, [1] * 8, None)
    assert verdict == "no baseline" and out["version"] == "1" and out["aliases"] == ["candidate"]
    with pytest.raises(Exception, match="champion"):
        mlflow_client.get_model_version_by_alias(MODEL, "champion")

    # night 2 scores every prompt as night 1 did: diffs all 0, interval [0, 0] -> passed; champion = version 2
    verdict, out = _night(results_store, tmp_path, 2, [1] * 8, report.PREVIOUS_SUCCESSFUL)
    assert verdict == "passed" and out["aliases"] == ["candidate", "champion"]
    assert mlflow_client.get_model_version_by_alias(MODEL, "champion").version in (2, "2")
    v2 = mlflow_client.get_model_version(MODEL, "2")
    assert v2.tags["regression_gate"] == "passed" and v2.tags["regression_gate.baseline"] == "eval1"
    assert v2.tags["eval.test_score/openai/gsm8k"] == "1" and v2.tags["eval.pass_at_1/openai/gsm8k"] == "1"
    assert "Regression gate: passed; alias champion moved here" in v2.description
    assert "merged policy of MLflow run" in v2.description
    assert "registered model exp-gate version 2 (regression gate: passed" in out["line"]
    assert out["url"].endswith(f"/#/models/{MODEL}/versions/2?workflowType=machine_learning")
    assert _champion_night(tmp_path / "a") == 2

    # night 3 fails prompts 0-3: diffs {-1 x4, 0 x4}, 95% interval [-0.875, -0.125] lies below -0.1 -> failed
    verdict, out = _night(results_store, tmp_path, 3, [0] * 4 + [1] * 4, report.PREVIOUS_SUCCESSFUL)
    assert verdict == "failed" and out["version"] == "3" and out["aliases"] == ["candidate"]
    v3 = mlflow_client.get_model_version(MODEL, "3")
    assert v3.tags["regression_gate"] == "failed" and v3.tags["regression_gate.baseline"] == "eval2"
    assert "[-0.8750, -0.1250]" in v3.tags["regression_gate.detail"]
    assert v3.tags["eval.test_score/openai/gsm8k"] == "0.5"
    assert "Regression gate: failed; alias champion not moved" in v3.description
    assert "[-0.8750, -0.1250]" in v3.description
    # champion stayed on version 2; candidate moved to the new version
    assert str(mlflow_client.get_model_version_by_alias(MODEL, "champion").version) == "2"
    assert str(mlflow_client.get_model_version_by_alias(MODEL, "candidate").version) == "3"
    assert sorted(mlflow_client.get_model_version(MODEL, "2").aliases) == ["champion"]
    assert _champion_night(tmp_path / "b") == 2


def test_verdicts_and_a_bad_verdict(rlhf_env):
    assert gate_verdict(False, False, None) == "off"
    assert gate_verdict(True, False, None) == "no baseline"
    assert gate_verdict(True, True, "openai/gsm8k dropped") == "failed"
    assert gate_verdict(True, True, None) == "passed"
    with pytest.raises(ValueError, match="verdict 'ok' is not one of"):
        model_registry.record_verdict(MODEL, "1", {}, "ok")
