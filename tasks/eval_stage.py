"""The ``evaluate`` stage: the final model (the last checkpoint's actor merged once into a Hugging Face folder,
:func:`merged_policy`, which ``register_model`` reuses) generates on every evaluation suite and is scored with
``evaluation.yaml`` semantics (``tasks.stages``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import lineage
from infra.results import ResultsStore
from tasks import plan, remote
from tasks.common import lineage_name, parquet_files, stage
from tasks.deadline import StageDeadline
from tasks.retry import retry_unless_bad_input
from tasks.runlog import evaluate_run_name, log_line
from tasks.samples import questions_by_prompt_id


def merged_policy(checkpoint: str, run_dir: str, deadline: StageDeadline) -> str:
    """The actor of ``checkpoint`` merged into a Hugging Face folder ``<run_dir>/hf_policy`` (on Ray), once per flow
    run: ``hf_policy.source`` records the actor folder it was merged from, so the evaluate and register_model tasks
    share one merge (a different checkpoint is merged again).

    Raises:
        FileNotFoundError: ``checkpoint`` has no ``actor`` folder.
    """
    from rlhf_core.atomic import atomic_write_text

    actor, target = Path(checkpoint) / "actor", Path(run_dir) / "hf_policy"
    stamp = target.with_name("hf_policy.source")
    if not actor.is_dir():
        raise FileNotFoundError(f"{checkpoint}: no actor checkpoint to merge")
    if stamp.is_file() and stamp.read_text() == str(actor) and (target / "config.json").is_file():
        return str(target)
    stamp.unlink(missing_ok=True)
    merged = deadline.run_on_ray(remote.merge_remote, str(actor), str(target))
    atomic_write_text(stamp, str(actor))
    return merged


@task(name="evaluate", task_run_name=evaluate_run_name,
      retry_condition_fn=retry_unless_bad_input, cache_policy=NO_CACHE)
def evaluate(overrides: list[str], ctx: dict[str, Any], checkpoint: str | None = None,
             val_file: str | None = None, global_step: int = 0, suites: list[dict[str, Any]] | None = None,
             ppo_overrides: list[str] | None = None, model_path: str | None = None) -> dict[str, Any]:
    """Generate with the final model on every evaluation suite, then score each suite with ``evaluation.yaml``
    semantics (per ``data_source``, pass@k).

    The final model is ``checkpoint``'s actor merged into a Hugging Face folder (:func:`merged_policy`, reused by
    register_model), or ``model_path`` when there is no checkpoint. Each suite's files are concatenated into
    ``<run_dir>/evaluate/<suite>/prompts.parquet``, answered by ``tasks.remote.generation_remote`` (verl
    ``main_generation`` keys: :func:`tasks.plan.generation_overrides`) into ``responses.parquet``, and scored by
    ``evaluation_remote``.

    Args:
        overrides: evaluation overrides (the task adds ``data.path`` and ``output.samples_dir``).
        checkpoint: the final PPO checkpoint (``global_step_N``), recorded on every sample.
        val_file: the validation parquet (the default suite's file).
        global_step: the PPO step of the final model: the ``step`` of the metrics rows.
        suites: ``[{name, files, n, temperature, top_p, response_length}]``; None or [] = one suite ``val``
            (:func:`tasks.plan.resolve_suites`).
        ppo_overrides: the PPO run's overrides (prompt length, chat template, dtype, device; ``val_kwargs``).
        model_path: the model evaluated when ``checkpoint`` is None.

    Returns:
        The metrics of every suite (``test_score/<suite>/<data_source>``, ``pass@k/<suite>/<data_source>``, ...;
        the default suite without ``<suite>/``), also on the evaluate MLflow run and in DuckDB ``metrics`` (stage
        evaluate, file ``metrics_<suite>``); samples in DuckDB with their suite (``infra.results`` ``suite``).

    Raises:
        ConfigError: a bad suite (before any model loads); see :func:`tasks.plan.resolve_suites`.
        ValueError: neither ``checkpoint`` nor ``model_path``.
    """
    import pandas as pd
    from omegaconf import OmegaConf

    from rlhf_core.config import load_config
    from rlhf_core.data.fs import copy_to_local

    deadline = StageDeadline.of("evaluate", ctx)
    ppo_config = load_config("ppo_trainer", list(ppo_overrides or []))
    resolved = plan.resolve_suites(list(suites or []), str(val_file), ppo_config)
    out = Path(ctx["run_dir"]) / "evaluate"
    config = load_config("evaluation", plan.eval_overrides([], overrides, responses_path=str(out / "<suite>"),
                                                           samples_dir=str(out / "<suite>" / "samples")))
    if not checkpoint and not model_path:
        raise ValueError("evaluate: no checkpoint and no model_path to evaluate")
    params = {**OmegaConf.to_container(config, resolve=True), "suites": resolved, "checkpoint": checkpoint}
    metrics: dict[str, float] = {}
    with stage("evaluate", params, ctx) as run_id:
        model = merged_policy(checkpoint, ctx["run_dir"], deadline) if checkpoint else str(model_path)
        store = ResultsStore(ctx["home"])
        for suite in resolved:
            folder = out / suite["name"]
            folder.mkdir(parents=True, exist_ok=True)
            prompts = folder / "prompts.parquet"
            pd.concat([pd.read_parquet(copy_to_local(f)) for f in suite["files"]],
                      ignore_index=True).to_parquet(prompts)
            responses = folder / "responses.parquet"
            deadline.run_on_ray(remote.generation_remote, plan.generation_overrides(
                suite, str(prompts), str(responses), model, ppo_config))
            full = plan.eval_overrides([], overrides, responses_path=str(responses),
                                       samples_dir=str(folder / "samples"))
            lineage.log_dataset(run_id, responses, f"responses_{suite['name']}", "evaluation")
            raw = deadline.run_on_ray(remote.evaluation_remote, full, env=lineage.stage_env(run_id))
            label = suite["name"] if suite["labelled"] else None
            named = raw if label is None else plan.suite_metric_names(
                raw, label, pd.read_parquet(responses, columns=["data_source"])["data_source"])
            metrics.update(named)
            store.register_metrics([{"step": int(global_step), **named}], run_id, "evaluate",
                                   name=f"metrics_{suite['name']}")
            sample_files = parquet_files(folder / "samples")
            kept = [str(Path(f).with_name(f"{suite['name']}.parquet")) for f in sample_files]
            for src, dst in zip(sample_files, kept):  # one DuckDB file per suite (they are named by file)
                Path(src).replace(dst)
            store.register_samples(kept, run_id, "evaluate", checkpoint=checkpoint, suite=label,
                                   questions=questions_by_prompt_id(kept, str(prompts)), step=int(global_step))
            for f in kept:
                lineage.client().log_artifact(run_id, f, "samples")
            log_line(f"evaluate · {suite['name']}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in sorted(named.items()) if k.startswith("test_score/")))
        lineage.log_metrics(run_id, {lineage_name(k): v for k, v in metrics.items()}, step=int(global_step))
    return metrics
