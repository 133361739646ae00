"""The flow run's Prefect artifacts and its one-line-per-stage log.

- markdown ``rlhf-summary``: the stage table (status, duration, MLflow run link), the final
  validation and evaluation metrics, the regression-gate verdict, the registered model version;
- link ``mlflow-run``: the parent MLflow run (every MLflow link opens the model-training view);
- table ``rlhf-evaluation``: one row per ``data_source`` (``test_score``, ``pass@k``);
- the progress artifact ``ppo-progress`` is created by the flow and moved by the PPO
  segments (``tasks.progress``).
"""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from infra import lineage
from infra.results import ResultsStore
from rlhf_core.redact import redact, redact_text
from tasks.runlog import log_line

HEADLINE_KEYS = {
    "sft": ("val/loss", "train/loss"),
    "ppo": ("critic/score/mean", "response_length/mean", "actor/pg_loss"),
    "evaluate": ("test_score/",),
}


def mlflow_run_url(run_id: str) -> str:
    """A link to the run in the MLflow UI's model-training view (:func:`infra.lineage.run_url`): the tracking
    server's when it is one, else the address ``mlflow server --backend-store-uri $MLFLOW_TRACKING_URI`` serves
    by default."""
    return lineage.run_url(run_id)


def link_parent_run(parent_run_id: str) -> None:
    """Link artifact ``mlflow-run`` of the flow run: its parent MLflow run, model-training view (none when
    lineage is degraded: there is no MLflow run to open)."""
    if lineage.degraded() is None:
        create_link_artifact(mlflow_run_url(parent_run_id), link_text=f"MLflow run {parent_run_id}", key="mlflow-run",
                             description="the flow run's parent MLflow run (stages nested under it)")


def stage_rows(store: ResultsStore, flow_run_id: str) -> list[dict[str, Any]]:
    """This flow run's stage runs, in start order: stage, status, seconds, run id."""
    _, rows = store.sql(
        "SELECT stage, status, epoch(ended_at) - epoch(started_at) AS seconds, run_id FROM runs "
        f"WHERE flow_run_id = '{flow_run_id}' AND kind = 'stage' ORDER BY started_at")
    return [{"stage": r[0], "status": r[1], "seconds": r[2], "run_id": r[3]} for r in rows]


def headline(store: ResultsStore, stage: str, run_id: str) -> str:
    """The stage's headline figures: the last logged value of its key metrics."""
    keys = HEADLINE_KEYS.get(stage, ())
    if not keys:
        return ""
    cond = " OR ".join(f"starts_with(key, '{k}')" for k in keys)
    _, rows = store.sql(f"SELECT key, arg_max(value, step) FROM metrics WHERE run_id = '{run_id}' "
                        f"AND ({cond}) GROUP BY key ORDER BY key")
    return ", ".join(f"{k} {v:.4g}" for k, v in rows)


def log_stage(store: ResultsStore, stage: str, run_id: str, cached: bool = False) -> str:
    """Log one line for a finished stage with its headline figures on the flow run's logger (the Prefect UI's
    Logs tab: ``tasks.runlog.log_line``); returns the line."""
    _, rows = store.sql("SELECT status, epoch(ended_at) - epoch(started_at) FROM runs "
                        f"WHERE run_id = '{run_id}' ORDER BY ended_at DESC LIMIT 1")
    status, seconds = rows[0] if rows else ("?", None)
    took = "cached result of an earlier run" if cached else (
        f"{seconds:.1f} s" if seconds is not None else "running")
    figures = headline(store, stage, run_id)
    line = f"stage {stage}: {status}, {took}, MLflow run {run_id}" + (f"; {figures}" if figures else "")
    return log_line(line)


def evaluation_table(evaluation: dict[str, float]) -> list[dict[str, Any]]:
    """``{"test_score/ds": x, "pass@1/ds": y, "pass@1/num_prompts/ds": n, "reward/num_errors/ds": e}`` → one
    row per data source (``ds`` may hold slashes, as ``openai/gsm8k``; every source has a ``test_score``)."""
    sources = sorted((k[len("test_score/"):] for k in evaluation if k.startswith("test_score/")), key=len,
                     reverse=True)  # longest first: a source that ends another one's name matches first
    rows: dict[str, dict[str, Any]] = {}
    for key, value in evaluation.items():
        source = next((s for s in sources if key.endswith("/" + s)), None)
        if source is not None:
            rows.setdefault(source, {"data_source": source})[key[:-len(source) - 1]] = round(float(value), 6)
    return [rows[k] for k in sorted(rows)]


def publish(store: ResultsStore, flow_run_id: str, parent_run_id: str, cached: dict[str, str],
            ppo_result: dict[str, Any], evaluation: dict[str, float], gate: str | None = None,
            registered: str | None = None) -> str:
    """Create the summary markdown and the evaluation table artifacts of this flow run (secrets redacted:
    :mod:`rlhf_core.redact`); ``registered`` is the register_model task's line. Returns the markdown (redacted),
    which the flow also logs as ``summary.md`` of the parent run."""
    lines = ["# rlhf flow run summary", "",
             f"Parent MLflow run: [{parent_run_id}]({mlflow_run_url(parent_run_id)})", "",
             "| stage | status | duration (s) | MLflow run |", "| --- | --- | --- | --- |"]
    for stage, run_id in cached.items():
        lines.append(f"| {stage} | cached | - | [{run_id}]({mlflow_run_url(run_id)}) |")
    for r in stage_rows(store, flow_run_id):
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.1f}"
        lines.append(f"| {r['stage']} | {r['status']} | {secs} | [{r['run_id']}]({mlflow_run_url(r['run_id'])}) |")
    final_val = {k: v for k, v in (ppo_result.get("metrics") or {}).items() if k.startswith("val-")}
    lines += ["", f"## Final validation (PPO step {ppo_result.get('global_step')})", "",
              "| metric | value |", "| --- | --- |"]
    lines += [f"| {k} | {float(v):.4f} |" for k, v in sorted(final_val.items())] or ["| (none) | |"]
    lines += ["", "## Evaluation", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| {k} | {float(v):.4f} |" for k, v in sorted(evaluation.items())] or ["| (none) | |"]
    if gate:
        lines += ["", "## Regression gate", "", "```", gate, "```"]
    if registered:
        lines += ["", "## Model registry", "", registered]
    # the gate text and any value may quote a config or environment value: scrubbed of secrets
    markdown = redact_text("\n".join(lines))
    create_markdown_artifact(markdown, key="rlhf-summary",
                             description=f"stages, final metrics and MLflow runs of flow run {flow_run_id}")
    if evaluation:
        create_table_artifact(redact(evaluation_table(evaluation)), key="rlhf-evaluation",
                              description="evaluation per data_source (mean score over prompts, pass@k)")
    return markdown
