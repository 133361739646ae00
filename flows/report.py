"""What the ``rlhf`` flow records about itself: its ``runs`` row, the regression gate, the
example query it prints. No Prefect import here (artifacts are in ``flows.artifacts``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from infra import lineage
from infra.compare import (
    Comparison,
    ResolvedRun,
    RunNotFoundError,
    compare_scores,
    evaluated_runs,
    prompt_scores,
    regression_message,
    regressions,
    resolve_run,
)
from infra.results import ResultsStore

PREVIOUS_SUCCESSFUL = "previous-successful"


class RegressionError(RuntimeError):
    """The evaluation dropped below the baseline by more than ``max_regression``."""


def now() -> dt.datetime:
    """Naive UTC now (the ``runs`` table's timestamps)."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def index_flow(store: ResultsStore, flow_run_id: str, name: str | None, params: dict[str, Any],
               status: str, started: dt.datetime, ended: dt.datetime | None = None) -> None:
    """Write the flow run's single ``runs`` row (``kind`` flow, ``stage`` flow)."""
    store.index_run(flow_run_id, flow_run_id, "flow", status, started, ended,
                    json.dumps(params, sort_keys=True, default=str), name=name, kind="flow")


def resolve_baseline(store: ResultsStore, baseline: str | None,
                     flow_run_id: str | None) -> ResolvedRun | None:
    """The baseline evaluation of the regression gate, resolved before any training.

    Args:
        baseline: None (no gate), ``previous-successful`` (the newest flow run that finished
            with an evaluation, other than ``flow_run_id``) or a run reference
            (``infra.compare.resolve_run``).

    Returns:
        The baseline's samples, or None when there is no gate or no previous successful run.

    Raises:
        RunNotFoundError: an explicit baseline id that names no run with samples.
    """
    if baseline is None:
        return None
    if baseline == PREVIOUS_SUCCESSFUL:
        runs = evaluated_runs(store, flow_status="FINISHED", exclude_flow=flow_run_id)
        return resolve_run(store, runs[0][0]) if runs else None
    try:
        return resolve_run(store, baseline)
    except RunNotFoundError as exc:
        raise RunNotFoundError(f"flow parameter baseline: {exc}") from exc


def eval_run_of(store: ResultsStore, flow_run_id: str) -> str | None:
    """The newest evaluate stage run of ``flow_run_id`` (None when it has none)."""
    _, rows = store.sql(f"SELECT run_id FROM runs WHERE flow_run_id = '{flow_run_id}' "
                        f"AND stage = 'evaluate' AND kind = 'stage' ORDER BY started_at DESC LIMIT 1")
    return rows[0][0] if rows else None


def gate(store: ResultsStore, baseline: ResolvedRun, eval_run_id: str, max_regression: float,
         parent_run_id: str | None = None, seed: int = 0, n_boot: int = 10000) -> tuple[Comparison, str | None]:
    """Compare the evaluation ``eval_run_id`` with ``baseline``.

    The per-source difference and interval are logged on ``parent_run_id`` as metrics
    ``gate/<data_source>/{diff,ci_low,ci_high}`` and the verdict as tag ``regression_gate``.

    Returns:
        ``(comparison, message)``: ``message`` is None when no data source's whole interval lies
        below ``-max_regression``, else the failure text naming the data sources and numbers.
    """
    current = resolve_run(store, eval_run_id)
    sources = compare_scores(prompt_scores(store, baseline), prompt_scores(store, current), seed, n_boot)
    cmp = Comparison(baseline, current, sources, seed, n_boot)
    failed = regressions(cmp, max_regression)
    message = regression_message(cmp, failed, max_regression) if failed else None
    if parent_run_id:
        from tasks.common import lineage_name

        values = {}
        for s in sources:
            for key in ("diff", "ci_low", "ci_high"):
                values[lineage_name(f"gate/{s.data_source}/{key}")] = getattr(s, key)
        lineage.log_metrics(parent_run_id, values)
        lineage.set_tags(parent_run_id, {"regression_gate": "failed" if failed else "passed",
                                         "regression_gate.baseline": baseline.run_id})
    return cmp, message


def example_query(flow_run_id: str) -> str:
    """The query the flow suggests at the end: mean score per stage and step of this flow run."""
    return ("SELECT stage, step, data_source, avg(score) AS mean_score, count(*) AS n FROM samples "
            f"WHERE run_id IN (SELECT run_id FROM runs WHERE flow_run_id = '{flow_run_id}') "
            "GROUP BY ALL ORDER BY stage, step")


def gate_summary(cmp: Comparison) -> list[dict[str, Any]]:
    """The comparison as plain rows (for logs and artifacts)."""
    return [{k: v for k, v in dataclasses.asdict(s).items() if k != "pairs"} for s in cmp.sources]
