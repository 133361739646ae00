"""The ``register_model`` task: merge the final PPO checkpoint and register it, after evaluation and the gate.

The flow calls it once the regression gate has spoken, so the version carries how it scored: the evaluation
metrics and the gate's verdict are on the version (:func:`infra.model_registry.record_verdict`), alias
``candidate`` names every new version and ``champion`` moves only when the gate passed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import lineage, model_registry
from tasks.deadline import StageDeadline
from tasks.runlog import log_line
from tasks.eval_stage import merged_policy
from tasks.retry import retry_unless_bad_input


def gate_verdict(gate_on: bool, baseline_found: bool, failure: str | None) -> str:
    """The verdict recorded on the version: ``off`` (no baseline configured), ``no baseline`` (configured, but no
    earlier successful run to compare with), else ``failed`` when the gate gave a failure text, ``passed``."""
    if not gate_on:
        return model_registry.GATE_OFF
    if not baseline_found:
        return model_registry.GATE_NO_BASELINE
    return model_registry.GATE_FAILED if failure else model_registry.GATE_PASSED


def publish_version(ppo_run_id: str, hf_dir: str | Path, model_name: str, lineage_tags: Mapping[str, Any],
                    evaluation: Mapping[str, float], verdict: str, detail: str | None = None,
                    baseline_run_id: str | None = None) -> dict[str, Any]:
    """Register the merged folder ``hf_dir`` as a new version of ``model_name`` (artifact ``hf_model`` of the ppo
    run), put the evaluation and ``verdict`` on it and move the aliases (:mod:`infra.model_registry`); log one line.

    Returns:
        ``{"version": "3", "aliases": ["candidate", "champion"], "url": MLflow UI link, "line": the logged line}``;
        ``version`` is None when lineage is degraded (nothing registered).
    """
    version = model_registry.register_policy(ppo_run_id, hf_dir, model_name, lineage_tags)
    if version == "none":
        line = f"model not registered: MLflow lineage is degraded ({lineage.degraded()}); merged policy in {hf_dir}"
        log_line(line)
        return {"version": None, "aliases": [], "url": None, "line": line}
    aliases = model_registry.record_verdict(model_name, version, evaluation, verdict, detail, baseline_run_id)
    url = lineage.model_version_url(model_name, version)
    champion = (f"models:/{model_name}@{model_registry.CHAMPION} now loads it" if model_registry.CHAMPION in aliases
                else f"{model_registry.CHAMPION} not moved")
    line = (f"registered model {model_name} version {version} (regression gate: {verdict}; aliases "
            f"{', '.join(aliases)}; {champion}): {url}")
    log_line(line)
    return {"version": version, "aliases": aliases, "url": url, "line": line}


@task(name="register_model", task_run_name="register_model {model_name}",
      retry_condition_fn=retry_unless_bad_input, cache_policy=NO_CACHE)
def register_model(ppo_run_id: str, checkpoint_dir: str | None, model_name: str, lineage_tags: dict[str, Any],
                   ctx: dict[str, Any], evaluation: dict[str, float], verdict: str, detail: str | None = None,
                   baseline_run_id: str | None = None) -> dict[str, Any]:
    """Merge the actor of ``checkpoint_dir`` into a Hugging Face folder (``<run_dir>/hf_policy``, on Ray, unless the
    evaluate task already did: ``tasks.eval_stage.merged_policy``) and
    :func:`publish_version` it. Runs after evaluation and the regression gate (``verdict``: see
    :func:`gate_verdict`).

    Returns:
        :func:`publish_version`'s dict, plus ``hf_dir``; ``version`` None and no merge when the checkpoint has
        no ``actor`` folder (nothing to register).
    """
    actor = Path(checkpoint_dir or "") / "actor"
    if not checkpoint_dir or not actor.is_dir():
        line = f"model not registered: no actor checkpoint in {checkpoint_dir}"
        log_line(line)
        return {"version": None, "aliases": [], "url": None, "line": line, "hf_dir": None}
    # tasks.register_model.timeout_seconds, enforced on the merge's Ray job (tasks.deadline); the evaluate task's
    # merge of the same checkpoint is reused
    merged = merged_policy(str(checkpoint_dir), ctx["run_dir"], StageDeadline.of("register_model", ctx))
    out = publish_version(ppo_run_id, merged, model_name, lineage_tags, evaluation, verdict, detail, baseline_run_id)
    return {**out, "hf_dir": merged}


__all__ = ["gate_verdict", "publish_version", "register_model"]
