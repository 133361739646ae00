"""Offline evaluation of a responses parquet (verl ``verl/trainer/main_eval.py``, config ``evaluation.yaml``).

Input parquet, one row per prompt: ``data.prompt_key`` (a string or chat message list), ``data.response_key``
(a list of N response strings), ``data.data_source_key`` and ``data.reward_model_key`` (a dict with
``ground_truth``); an ``extra_info`` column is passed to scorers that accept it. ``data.path`` may be remote
(``hdfs://``, ``s3://`` ...): it is fetched with :func:`rlhf_core.data.fs.copy_to_local`.

Every response is scored in Ray tasks (:func:`score_rows_parallel`, sized by ``ray_init.num_cpus``) with
``custom_reward_function`` (or :func:`default_compute_score`),
called as ``fn(data_source, solution_str, ground_truth[, extra_info=...])`` — positionally like verl's
``main_eval`` so verl custom functions with three parameters keep working; ``extra_info`` is passed only when
the function accepts it. A response whose scorer raises, or returns ``None``/NaN/±inf/a non-number, scores 0: one
warning names the rows, the ``reward_error`` column marks it (0/1) and ``reward/num_errors/<ds>`` counts them; an
unknown data source with the default scorer is refused before Ray starts, naming the row
(:func:`check_data_sources`).

Metrics (per data source ``ds``):

* ``test_score/<ds>``: mean over prompts of the mean score over that prompt's responses (verl's number);
* ``reward/num_errors/<ds>``: responses scored 0 because their score could not be computed;
* ``pass@<k>/<ds>``: the unbiased pass@k (see :func:`rlhf_core.metrics.validation.pass_at_k`) averaged over
  prompts that have at least ``k`` responses, for ``k`` in ``1, 2, 4, …`` and ``N``; a response counts as
  correct when its ``acc`` (if the scorer reports one) else its ``score`` is ``> 0.5``;
* ``pass@<k>/num_prompts/<ds>``: how many prompts that average covers (``pass@1/num_prompts/<ds>``: all of them).
  A prompt with fewer responses than the data source's largest ``N`` is left out of the larger ``k``:
  :func:`run_evaluation` logs one warning per data source naming how many and which rows
  (:func:`short_prompts`).

When ``output.samples_dir`` is set, every response is written atomically to
``<output.samples_dir>/eval_samples.parquet`` (columns of :mod:`rlhf_core.metrics.samples`; ``step`` 0,
``uid`` = row index as text, ``sample_idx`` = response index, plus the scorer's extra keys).
"""
from __future__ import annotations

import inspect
import logging
import os
from collections import defaultdict
from typing import Any, Callable

import numpy as np
import pyarrow.parquet as pq

from rlhf_core.data import DataError
from rlhf_core.metrics.samples import CORE_COLUMNS, render_prompt, write_samples_parquet
from rlhf_core.metrics.validation import pass_k_values, pass_at_k
from rlhf_core.progress import progress
from rlhf_core.reward.custom import FileRewardFunction, eval_reward_function
from rlhf_core.reward.managers import ScoreFailure, score_value
from rlhf_core.reward.scorers import UnknownDataSourceError, check_default_data_sources

SAMPLES_FILE = "eval_samples"

logger = logging.getLogger(__name__)


def _accepts_extra_info(fn: Callable[..., Any]) -> bool:
    target = fn._fn if isinstance(fn, FileRewardFunction) and fn._fn is not None else fn
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "extra_info" or p.kind is p.VAR_KEYWORD for p in params)


def _as_list(value: Any) -> list:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def load_eval_rows(config: Any) -> list[dict]:
    """Read ``data.path`` (copied to a local cache first when remote) as one dict per row.

    Raises:
        FileNotFoundError: ``data.path`` does not exist. DataError: a configured column is missing (naming the
            columns the file has) or the file has no rows.
    """
    data = config.data
    path = str(data.path)
    if "://" in path and not path.startswith("file://"):
        from rlhf_core.data.fs import copy_to_local  # lazy: only remote paths need fsspec plumbing

        path = copy_to_local(path)
    elif path.startswith("file://"):
        path = path[len("file://") :]
    if not os.path.exists(path):
        raise FileNotFoundError(f"data.path {path!r} does not exist")
    table = pq.read_table(path)
    for key in ("prompt_key", "response_key", "data_source_key", "reward_model_key"):
        col = data[key]
        if col not in table.column_names:
            raise DataError(f"{path}: data.{key}={col!r} is not a column; columns: {table.column_names}")
    if table.num_rows == 0:
        raise DataError(f"{path}: no rows to evaluate")
    return table.to_pylist()


def score_rows(records: list[dict], config: Any, scorer: Callable[..., Any], start: int = 0) -> list[dict]:
    """One row dict per response (sample-file columns plus scorer extras); ``records`` are the file's rows from
    row ``start`` on (their ``uid`` and error messages count from there)."""
    data = config.data
    prompt_key, response_key = data.prompt_key, data.response_key
    ds_key, rm_key = data.data_source_key, data.reward_model_key
    pass_extra = _accepts_extra_info(scorer)
    rows = []
    failures: list[str] = []
    for i, rec in enumerate(progress(records, "scoring responses", unit="prompt"), start=start):
        reward_data = rec[rm_key]
        ground_truth = reward_data.get("ground_truth") if isinstance(reward_data, dict) else reward_data
        data_source = str(rec[ds_key])
        kwargs = {"extra_info": rec.get("extra_info") or {}} if pass_extra else {}
        for j, response in enumerate(_as_list(rec[response_key])):
            try:
                result = scorer(data_source, response, ground_truth, **kwargs)
            except UnknownDataSourceError as exc:  # a configuration error: every row of that source would fail
                raise RuntimeError(f"reward function failed on row {i}, response {j}: {exc}") from exc
            except Exception as exc:  # noqa: BLE001 - a scorer failure scores 0, logged and counted
                result = ScoreFailure(f"{type(exc).__name__}: {exc}")
            if isinstance(result, dict) and "score" not in result:
                raise KeyError(f"reward function returned a dict without 'score' on row {i}: keys {sorted(result)}")
            score, reason = score_value(result)
            extras = {k: v for k, v in result.items() if k != "score"} if isinstance(result, dict) else {}
            extras = {k: v for k, v in extras.items() if k not in CORE_COLUMNS}  # never overwrite uid, step...
            if reason is not None:
                failures.append(f"row {i} response {j}: {reason}")
            rows.append({
                "step": 0, "data_source": data_source, "uid": str(i), "sample_idx": j,
                "prompt": render_prompt(rec.get(prompt_key)), "response": response,
                "ground_truth": ground_truth, "score": score, **extras, "reward_error": int(reason is not None),
            })
    if failures:
        logger.warning("reward function: %d responses scored 0 because their score could not be computed: %s%s",
                       len(failures), "; ".join(failures[:5]), " ..." if len(failures) > 5 else "")
    return rows


def _score_chunk(records: list[dict], config: Any, start: int) -> list[dict]:
    return score_rows(records, config, eval_reward_function(config), start)


def score_rows_parallel(records: list[dict], config: Any) -> list[dict]:
    """:func:`score_rows` over all ``records``, in Ray tasks as verl's ``main_eval`` (one CPU each).

    ``ray_init.num_cpus`` sizes the embedded Ray instance (null: all CPUs) and so the number of tasks running at
    once; ``ray_init.address`` connects to an existing cluster instead. The rows are split into as many
    contiguous chunks as the cluster has free CPUs; each task loads the reward function itself, so a
    ``custom_reward_function`` file only has to be readable where the task runs. ``num_cpus: 1`` scores in this
    process (one CPU: a Ray task would only add start-up time) unless ``ray_kwargs.timeline_json_file`` asks for
    the Ray timeline of the scoring tasks, written there once they end. A Ray instance started here is shut down
    after.
    The result (rows, order, uids) is the same for any ``num_cpus``.
    """
    ray_cfg = config.ray_init
    timeline = config.ray_kwargs.timeline_json_file
    if ray_cfg.num_cpus == 1 and ray_cfg.address is None and timeline is None:
        return _score_chunk(records, config, 0)
    import ray  # lazy: only evaluation with Ray workers needs it

    from rlhf_core.distributed.ray_init import init_ray, ray_init_extra, write_ray_timeline

    started = not ray.is_initialized()
    # verl passes ray_kwargs.ray_init to ray.init (num_cpus there is ray_init.num_cpus's alias, read above)
    init_ray(ray_cfg.address, ray_cfg.num_cpus, extra=ray_init_extra(config.ray_kwargs.ray_init, ("num_cpus",)))
    try:
        n = max(1, min(len(records), int(ray.available_resources().get("CPU", 1))))
        bounds = np.linspace(0, len(records), n + 1).astype(int).tolist()
        task = ray.remote(num_cpus=1)(_score_chunk)
        refs = [task.remote(records[a:b], config, a) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        rows = [row for part in ray.get(refs) for row in part]
        write_ray_timeline(timeline)  # ray_kwargs.timeline_json_file: the scoring tasks' timeline
        return rows
    finally:
        if started:
            ray.shutdown()


def evaluation_metrics(rows: list[dict]) -> dict[str, float]:
    """``test_score/<ds>`` and ``pass@<k>/<ds>`` from the per-response rows (see the module docstring)."""
    by_prompt: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_prompt[r["data_source"]][r["uid"]].append(r)
    metrics: dict[str, float] = {}
    for ds, prompts in by_prompt.items():
        metrics[f"test_score/{ds}"] = float(np.mean([np.mean([r["score"] for r in rs]) for rs in prompts.values()]))
        metrics[f"reward/num_errors/{ds}"] = float(sum(int(r.get("reward_error") or 0) for rs in prompts.values()
                                                       for r in rs))
        per_k: dict[int, list[float]] = defaultdict(list)
        for rs in prompts.values():
            correct = sum(1 for r in rs if float(r["acc"] if r.get("acc") is not None else r["score"]) > 0.5)
            for k in pass_k_values(len(rs)):
                per_k[k].append(pass_at_k(len(rs), correct, k))
        for k in sorted(per_k):
            metrics[f"pass@{k}/{ds}"] = float(np.mean(per_k[k]))
            metrics[f"pass@{k}/num_prompts/{ds}"] = float(len(per_k[k]))
    return metrics


def short_prompts(rows: list[dict]) -> dict[str, tuple[int, dict[str, int]]]:
    """Per data source with uneven prompts: ``(N, {uid: responses})`` for every prompt with fewer responses than
    the largest count ``N`` of that data source (those prompts are missing from ``pass@N`` and maybe smaller k)."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        counts[r["data_source"]][r["uid"]] += 1
    out: dict[str, tuple[int, dict[str, int]]] = {}
    for ds, per_uid in counts.items():
        n_max = max(per_uid.values())
        short = {uid: n for uid, n in per_uid.items() if n < n_max}
        if short:
            out[ds] = (n_max, short)
    return out


def report_short_prompts(rows: list[dict]) -> list[str]:
    """One warning line per data source with prompts that have too few responses for its largest pass@k (logged,
    and returned): how many of its prompts, and which rows with how many responses each."""
    n_prompts = defaultdict(set)
    for r in rows:
        n_prompts[r["data_source"]].add(r["uid"])
    lines = []
    for ds, (n_max, short) in short_prompts(rows).items():
        listed = ", ".join(f"row {uid} ({n})" for uid, n in sorted(short.items(), key=lambda kv: int(kv[0])))
        lines.append(f"{len(short)} of {len(n_prompts[ds])} prompts of data_source {ds!r} have fewer than {n_max} "
                     f"responses and are left out of pass@{n_max} (see pass@<k>/num_prompts/{ds}): {listed}")
        logger.warning("%s", lines[-1])
    return lines


def check_data_sources(records: list[dict], config: Any) -> None:
    """With the default scorer, refuse a row whose ``data.data_source_key`` it has no scorer for
    (:func:`~rlhf_core.reward.scorers.check_default_data_source`) before Ray starts and any response is scored.

    Raises:
        DataError: naming ``data.path``, the row and the data source.
    """
    try:  # eval_reward_function: no sandbox (verl's main_eval)
        check_default_data_sources((str(rec[config.data.data_source_key]) for rec in records), has_sandbox=False)
    except UnknownDataSourceError as exc:
        raise DataError(f"{config.data.path} {exc}") from None


def run_evaluation(config: Any) -> dict[str, float]:
    """Score a responses parquet as ``evaluation.yaml`` describes; returns the metrics (see module docstring).

    Raises:
        DataError: a configured column is missing or the file is empty, or (with the default scorer) a row's data
        source has no scorer, naming the row, before Ray starts. FileNotFoundError / AttributeError: a bad
        ``custom_reward_function``.
    """
    eval_reward_function(config)  # a bad custom_reward_function fails here, before Ray starts
    records = load_eval_rows(config)
    if not config.custom_reward_function.path:
        check_data_sources(records, config)
    rows = score_rows_parallel(records, config)
    report_short_prompts(rows)
    samples_dir = config.output.samples_dir
    if samples_dir and rows:
        write_samples_parquet(rows, str(samples_dir), SAMPLES_FILE)
    return evaluation_metrics(rows)
