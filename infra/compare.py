"""Compare the evaluation of two runs prompt by prompt, with a paired-bootstrap interval.

A run's *prompt scores* are the mean score over the samples of each prompt of its evaluation
(stage ``evaluate``; a run without one: its last validation step). Two runs are paired by
prompt (``prompt_id``, the hash of the rendered prompt and ``data_source``, else ``uid``); per
``data_source`` the comparison reports the mean of each run over the paired prompts, the mean
difference ``B - A`` with a percentile paired-bootstrap 95 % interval (Efron & Tibshirani 1993,
ch. 13: resample the paired differences with replacement, seeded), and where each prompt went
(:func:`prompt_category`): every prompt of either run is counted in exactly one of ``improved``,
``regressed``, ``still_passing``, ``still_failing`` (the prompts both runs scored) or ``new`` (only
in B) / ``missing`` (only in A).

Run references (:func:`resolve_run`): a Prefect flow-run id, an MLflow (stage) run id, or
``latest`` / ``previous`` (the newest and second-newest runs with an evaluation).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from infra.results import ResultsStore
from infra.text import escape_control

PASS_THRESHOLD = 0.5  # a prompt "passes" when its mean score is above this (evaluation's acc rule)
CHANGE_EPS = 1e-9  # a prompt's score changed when |score_b - score_a| exceeds this (means summed in another order)
CATEGORIES = ("improved", "regressed", "still_passing", "still_failing")
_RUN_INDEX = ("(SELECT run_id, any_value(flow_run_id) AS flow_run_id, min(started_at) AS started_at, "
              "any_value(status) AS status, any_value(kind) AS kind FROM runs GROUP BY run_id)")


class RunNotFoundError(LookupError):
    """A run reference names no run with samples in the results store."""


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
    """The samples of one run that a comparison uses."""

    ref: str            # what the user wrote
    run_id: str         # the stage run whose samples are compared
    flow_run_id: str | None
    stage: str
    step: int


@dataclasses.dataclass(frozen=True)
class SourceComparison:
    """One ``data_source`` of a comparison (scores are per-prompt means over samples)."""

    data_source: str
    n_prompts: int      # prompts present in both runs = improved + regressed + still_passing + still_failing
    mean_a: float       # over the paired prompts (nan when there is none)
    mean_b: float
    diff: float         # mean_b - mean_a
    ci_low: float       # 2.5th percentile of the bootstrap distribution of the mean difference
    ci_high: float      # 97.5th percentile
    improved: int       # score_b > score_a (+ CHANGE_EPS)
    regressed: int      # score_b < score_a (- CHANGE_EPS)
    still_passing: int  # the same score, above PASS_THRESHOLD
    still_failing: int  # the same score, at or below PASS_THRESHOLD
    new: int            # prompts only in B
    missing: int        # prompts only in A
    pairs: pd.DataFrame  # prompt_id, question, prompt, score_a, score_b, diff, category


@dataclasses.dataclass(frozen=True)
class Comparison:
    """``rlhf results compare A B``: per data source, B relative to A."""

    a: ResolvedRun
    b: ResolvedRun
    sources: list[SourceComparison]
    seed: int
    n_boot: int


def _q(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def evaluated_runs(store: ResultsStore, flow_status: str | None = None,
                   exclude_flow: str | None = None) -> list[tuple[str, str | None]]:
    """``(run_id, flow_run_id)`` of runs with evaluation samples, newest first.

    Args:
        flow_status: keep only the evaluations of flow runs with this status (``FINISHED``).
        exclude_flow: leave out the stage runs of this flow run (the one in progress).
    """
    where = []
    if flow_status:
        where.append(f"f.status = {_q(flow_status)}")
    if exclude_flow:
        where.append(f"coalesce(r.flow_run_id, '') <> {_q(exclude_flow)}")
    sql = (f"SELECT e.run_id, r.flow_run_id FROM (SELECT DISTINCT run_id FROM samples "
           f"WHERE stage = 'evaluate') e JOIN {_RUN_INDEX} r ON r.run_id = e.run_id "
           f"LEFT JOIN {_RUN_INDEX} f ON f.run_id = r.flow_run_id AND f.kind = 'flow' "
           f"{'WHERE ' + ' AND '.join(where) if where else ''} "
           f"ORDER BY coalesce(f.started_at, r.started_at) DESC, r.started_at DESC")
    return [(r[0], r[1]) for r in store.sql(sql)[1]]


def resolve_run(store: ResultsStore, ref: str) -> ResolvedRun:
    """The samples a run reference points at (see the module docstring).

    A flow-run id resolves to the newest evaluation of that flow run; a stage run id to its
    evaluation samples, else its last validation step.

    Raises:
        RunNotFoundError: no such run, or the run has no samples; the message lists what exists.
    """
    if ref in ("latest", "previous"):
        runs = evaluated_runs(store)
        k = 0 if ref == "latest" else 1
        if len(runs) <= k:
            raise RunNotFoundError(f"run {ref!r}: the store has {len(runs)} evaluated run(s), "
                                   f"need {k + 1} ({store.db_path})")
        return _stage_samples(store, ref, runs[k][0])
    names, rows = store.sql(
        f"SELECT run_id FROM {_RUN_INDEX} WHERE flow_run_id = {_q(ref)} AND run_id <> {_q(ref)} "
        f"AND run_id IN (SELECT DISTINCT run_id FROM samples WHERE stage = 'evaluate') "
        f"ORDER BY started_at DESC")
    if rows:
        return _stage_samples(store, ref, rows[0][0])
    return _stage_samples(store, ref, ref)


def _stage_samples(store: ResultsStore, ref: str, run_id: str) -> ResolvedRun:
    _, rows = store.sql(f"SELECT stage, max(step) FROM samples WHERE run_id = {_q(run_id)} "
                        f"GROUP BY stage ORDER BY stage = 'evaluate' DESC, max(step) DESC")
    if not rows:
        known = [r[0] for r in evaluated_runs(store)[:5]]
        raise RunNotFoundError(f"run {ref!r}: no flow run, MLflow run or samples with that id in "
                               f"{store.db_path}; newest evaluated runs: {known or 'none'}")
    _, flow = store.sql(f"SELECT any_value(flow_run_id) FROM runs WHERE run_id = {_q(run_id)}")
    return ResolvedRun(ref, run_id, flow[0][0] if flow else None, rows[0][0], int(rows[0][1]))


def prompt_scores(store: ResultsStore, run: ResolvedRun) -> pd.DataFrame:
    """One row per prompt of ``run``: ``data_source, prompt_id, question, prompt, score``."""
    names, rows = store.sql(
        "SELECT data_source, coalesce(prompt_id, uid) AS prompt_id, any_value(question) AS question, "
        "any_value(prompt) AS prompt, avg(score) AS score FROM samples "
        f"WHERE run_id = {_q(run.run_id)} AND stage = {_q(run.stage)} AND step = {int(run.step)} "
        "GROUP BY ALL")
    return pd.DataFrame(rows, columns=names)


def paired_bootstrap_ci(diffs: np.ndarray, seed: int = 0, n_boot: int = 10000,
                        level: float = 0.95, chunk: int = 1000) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of paired differences.

    Draws ``n_boot`` resamples of ``len(diffs)`` indices with replacement from
    ``numpy.random.default_rng(seed)`` (in chunks of ``chunk`` resamples, same stream), takes
    each resample's mean and returns the ``(1-level)/2`` and ``(1+level)/2`` quantiles (numpy's
    linear interpolation).

    Args:
        diffs: ``(n,)`` float, per-prompt ``score_b - score_a``.

    Returns:
        ``(low, high)``; ``(nan, nan)`` when ``diffs`` is empty.
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, d.size, size=(min(chunk, n_boot - start), d.size))
        means.append(d[idx].mean(axis=1))
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(np.concatenate(means), [alpha, 1.0 - alpha])
    return float(low), float(high)


def prompt_category(score_a: float, score_b: float) -> str:
    """Where one prompt went from run A to run B; each prompt gets exactly one category.

    ``improved`` when its mean score rose (``score_b - score_a > CHANGE_EPS``), ``regressed`` when it fell,
    else (the same score) ``still_passing`` when it is above :data:`PASS_THRESHOLD`, ``still_failing`` when not.
    A change counts before pass/fail: a prompt whose score rose from 0 to 0.1 (a format reward) is
    ``improved`` although it fails in both runs, so the counts add up to the prompts compared.
    """
    diff = float(score_b) - float(score_a)
    if diff > CHANGE_EPS:
        return "improved"
    if diff < -CHANGE_EPS:
        return "regressed"
    return "still_passing" if float(score_b) > PASS_THRESHOLD else "still_failing"


def compare_scores(a: pd.DataFrame, b: pd.DataFrame, seed: int = 0,
                   n_boot: int = 10000) -> list[SourceComparison]:
    """Pair two prompt-score tables (:func:`prompt_scores`) and summarise per data source.

    One :class:`SourceComparison` per ``data_source`` of either table (sorted); a source without a
    prompt in both has ``n_prompts == 0`` and nan means and interval. Per source,
    ``improved + regressed + still_passing + still_failing == n_prompts`` (:func:`prompt_category`),
    ``n_prompts + missing`` is A's prompt count and ``n_prompts + new`` is B's.
    """
    keys = ["data_source", "prompt_id"]
    both = a.merge(b, on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    out = []
    for ds, rows in both.groupby("data_source", sort=True):
        grp = rows[rows["_merge"] == "both"]
        diff = (grp["score_b"] - grp["score_a"]).to_numpy(dtype=np.float64)
        low, high = paired_bootstrap_ci(diff, seed=seed, n_boot=n_boot)
        category = [prompt_category(x, y) for x, y in zip(grp["score_a"], grp["score_b"])]
        table = pd.DataFrame({
            "prompt_id": grp["prompt_id"], "question": grp["question_b"].fillna(grp["question_a"]),
            "prompt": grp["prompt_b"], "score_a": grp["score_a"], "score_b": grp["score_b"], "diff": diff,
            "category": pd.Series(category, index=grp.index, dtype=object)})
        counts = {c: category.count(c) for c in CATEGORIES}
        out.append(SourceComparison(
            data_source=str(ds), n_prompts=len(grp), mean_a=_mean(grp["score_a"]), mean_b=_mean(grp["score_b"]),
            diff=_mean(diff), ci_low=low, ci_high=high, **counts,
            new=int((rows["_merge"] == "right_only").sum()), missing=int((rows["_merge"] == "left_only").sum()),
            pairs=table.sort_values(["diff", "prompt_id"]).reset_index(drop=True)))
    return out


def _mean(values: Any) -> float:
    """The mean of ``values`` as a float; nan when there is none (no numpy warning)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()) if arr.size else float("nan")


def compare_runs(store: ResultsStore, ref_a: str, ref_b: str, seed: int = 0,
                 n_boot: int = 10000) -> Comparison:
    """Compare run ``ref_b`` against run ``ref_a`` (see the module docstring).

    Raises:
        RunNotFoundError: a reference resolves to no samples.
    """
    a, b = resolve_run(store, ref_a), resolve_run(store, ref_b)
    sources = compare_scores(prompt_scores(store, a), prompt_scores(store, b), seed, n_boot)
    return Comparison(a, b, sources, seed, n_boot)


def regressions(cmp: Comparison, max_regression: float) -> list[SourceComparison]:
    """Data sources whose whole interval lies below ``-max_regression`` (``ci_high < -max_regression``)."""
    return [s for s in cmp.sources if s.ci_high < -float(max_regression)]


def regression_message(cmp: Comparison, failed: list[SourceComparison], max_regression: float) -> str:
    """One line per regressed data source, naming the runs and the numbers."""
    lines = [f"regression gate: run {cmp.b.run_id} is worse than baseline {cmp.a.run_id} "
             f"by more than max_regression={max_regression:g}:"]
    for s in failed:
        lines.append(f"  {s.data_source}: mean score {s.mean_a:.4f} -> {s.mean_b:.4f} "
                     f"(diff {s.diff:+.4f}, 95% CI [{s.ci_low:+.4f}, {s.ci_high:+.4f}], "
                     f"{s.regressed} of {s.n_prompts} prompts regressed)")
    return "\n".join(lines)


def _describe(run: ResolvedRun) -> str:
    flow = f" (flow run {run.flow_run_id})" if run.flow_run_id else ""
    return f"{run.ref} = run {run.run_id}{flow}, {run.stage} step {run.step}"


def format_comparison(cmp: Comparison, show: str | None = None, limit: int = 20) -> str:
    """Text report; ``show`` in ``regressed|improved|failing`` (``failing``: ``still_failing``) also lists the
    prompts of that category (worst first)."""
    lines = [f"A: {_describe(cmp.a)}", f"B: {_describe(cmp.b)}",
             f"paired by prompt; 95% CI: paired bootstrap, {cmp.n_boot} resamples, seed {cmp.seed}", ""]
    header = ("data_source", "prompts", "mean_A", "mean_B", "diff", "95% CI", "improved", "regressed",
              "still_passing", "still_failing", "new", "missing")
    rows: list[tuple[Any, ...]] = [
        (escape_control(str(s.data_source)), s.n_prompts,
         *((f"{s.mean_a:.4f}", f"{s.mean_b:.4f}", f"{s.diff:+.4f}", f"[{s.ci_low:+.4f}, {s.ci_high:+.4f}]")
           if s.n_prompts else ("-", "-", "-", "-")),
         s.improved, s.regressed, s.still_passing, s.still_failing, s.new, s.missing)
        for s in cmp.sources]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
    if not any(s.n_prompts for s in cmp.sources):
        lines.append("(no prompt is in both runs)")
    else:
        lines.append(f"prompts: scored by both runs = improved + regressed + still_passing + still_failing (a changed "
                     f"mean score counts first;\n  pass: mean score > {PASS_THRESHOLD:g}); new: only in B; "
                     "missing: only in A")
    if show:
        for s in (s for s in cmp.sources if s.n_prompts):
            p = s.pairs
            sel = {"regressed": p[p["category"] == "regressed"], "improved": p[p["category"] == "improved"].iloc[::-1],
                   "failing": p[p["category"] == "still_failing"]}[show]
            lines += ["", f"{show} prompts of {escape_control(str(s.data_source))} ({len(sel)}):"]
            for _, r in sel.head(limit).iterrows():
                text = escape_control(str(r["question"] if r["question"] is not None else r["prompt"]))
                lines.append(f"  {r['prompt_id']}  {r['score_a']:.3f} -> {r['score_b']:.3f}  {text[:100]}")
    return "\n".join(lines)
