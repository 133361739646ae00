"""The training stages on Ray: ``sft``, ``ppo_segment`` (PPO up to the next checkpoint boundary; a retry resumes
from the latest complete checkpoint) and ``validate`` (one PPO checkpoint in verl's validation-only mode), with the
DuckDB registration of their metrics and validation samples (``tasks.stages``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import lineage
from infra.results import ResultsStore
from infra.run_folders import last_per_step_and_key, read_jsonl
from tasks import plan, remote
from tasks.common import parquet_files, stage
from tasks.deadline import StageDeadline
from tasks.progress import StepProgress
from tasks.retry import retry_unless_bad_input
from tasks.runlog import log_line, sft_run_name, validate_run_name
from tasks.samples import questions_by_prompt_id


def _sft_key(_ctx: Any, p: dict[str, Any]) -> str:
    return plan.inputs_key("sft", [p["model_path"], p["train_file"], p["val_file"]],
                           overrides=p["overrides"], home=p["ctx"]["home"])


@task(name="sft", task_run_name=sft_run_name,
      retry_condition_fn=retry_unless_bad_input, cache_key_fn=_sft_key, persist_result=True)
def sft(model_path: str, train_file: str, val_file: str, overrides: list[str],
        ctx: dict[str, Any]) -> dict[str, str]:
    """Supervised fine-tuning (a Ray job running ``run_sft``).

    Args:
        overrides: ``sft_trainer`` overrides without the paths (this task adds model, data
            and output folder).

    Returns:
        ``{"hf_dir": the final HF model folder, "run_id": MLflow run}``.
    """
    from rlhf_core.config import load_config

    deadline = StageDeadline.of("sft", ctx)
    key = _sft_key(None, {"model_path": model_path, "train_file": train_file, "val_file": val_file,
                          "overrides": overrides, "ctx": ctx})[:16]
    out_dir = Path(ctx["home"]) / "sft" / key
    full = plan.sft_overrides([], overrides, model_path=model_path, train_file=train_file,
                              val_file=val_file, out_dir=str(out_dir), experiment=ctx["experiment"])
    config = load_config("sft_trainer", full)  # fails here, before Ray, on a bad key
    metrics_file = out_dir / "metrics.jsonl"
    with stage("sft", config, ctx) as run_id:
        lineage.log_dataset(run_id, train_file, "sft_train", "training")
        lineage.log_dataset(run_id, val_file, "sft_val", "validation")
        # not removed before the attempt: the SFT trainer keeps its lines of the steps it resumes after (a retry, or
        # a resumed pipeline) and moves an earlier run's file aside when it starts from scratch (metrics_file.py)
        env = {**lineage.stage_env(run_id), "RLHF_METRICS_FILE": str(metrics_file)}
        result = deadline.run_on_ray(remote.sft_remote, full, env=env)
        ResultsStore(ctx["home"]).register_metrics(read_jsonl(metrics_file), run_id, "sft")
        hf_dir = result.get("hf_dir") or result["hf_model_dir"]
        lineage.log_dir_artifact(run_id, hf_dir, "hf_model")
    return {"hf_dir": hf_dir, "run_id": run_id}


@task(name="ppo_segment", retry_condition_fn=retry_unless_bad_input, cache_policy=NO_CACHE)
def ppo_segment(overrides: list[str], segment: int, ppo_run_id: str,
                ctx: dict[str, Any], progress_id: str | None = None) -> dict[str, Any]:
    """Run PPO until ``trainer.stop_after_step`` (in ``overrides``), checkpointing there.

    A retry (or a re-run of a finished segment) resumes from the latest checkpoint in
    ``trainer.default_local_dir`` (``resume_mode=auto``). Metrics go to the ``ppo`` MLflow
    run ``ppo_run_id`` (whose single ``runs`` row the flow writes); validation samples (with
    their prompt id, raw question and checkpoint) and per-step metrics are registered in DuckDB.
    While it runs, one line per step is printed and the progress artifact ``progress_id`` moves.

    Returns:
        ``run_ppo``'s result: final metrics (incl. ``val-core/...``), ``global_step``,
        ``checkpoint_dir``.
    """
    from rlhf_core.config import load_config

    deadline = StageDeadline.of("ppo_segment", ctx)
    config = load_config("ppo_trainer", overrides)
    run_dir = Path(config.trainer.default_local_dir).parent
    metrics_file = run_dir / "metrics" / f"segment_{segment}.jsonl"
    # a retry resumes from the segment's last complete checkpoint; the trainer keeps the metrics lines up to it and
    # copies the dead attempt's whole file to <file>.N first (rlhf_core.trainer.metrics_file.prepare_metrics_file)
    env = {**lineage.stage_env(ppo_run_id), "RLHF_METRICS_FILE": str(metrics_file)}
    progress = StepProgress(metrics_file, int(config.trainer.total_training_steps), progress_id,
                            config.trainer.total_training_seconds)
    result = deadline.run_on_ray(remote.ppo_remote, list(overrides), env=env, on_poll=progress.poll,
                                 runtime_env=ppo_runtime_env(config, ctx))
    progress.finish()
    store = ResultsStore(ctx["home"])
    store.register_metrics(last_per_step_and_key(read_jsonl(metrics_file)), ppo_run_id, "ppo",
                           name=f"segment_{segment}")
    register_validation_samples(store, config, ppo_run_id)
    lineage.set_tags(ppo_run_id, {f"segment.{segment}.global_step": result.get("global_step"),
                                  f"segment.{segment}.worker_nodes": ",".join(result.get("worker_nodes") or [])})
    return result


@task(name="validate", task_run_name=validate_run_name,
      retry_condition_fn=retry_unless_bad_input, cache_policy=NO_CACHE)
def validate(overrides: list[str], checkpoint: str | None, global_step: int, ppo_run_id: str,
             ctx: dict[str, Any]) -> dict[str, Any]:
    """Validate one PPO checkpoint (or, ``checkpoint=None``, the starting model at step 0) on Ray: the PPO trainer in
    verl's validation-only mode (:func:`tasks.plan.validate_overrides`), which loads the checkpoint's actor weights
    and logs ``val-core/*``/``val-aux/*`` at its global step. A failure here is retried on its own: the segment
    that wrote the checkpoint is not run again.

    Args:
        overrides: the PPO run's overrides (those of the segment that wrote ``checkpoint``).
        checkpoint: a complete ``global_step_N`` folder; None = the starting model (``val_before_train``).
        global_step: ``N`` (0 for the starting model): the step the metrics are logged at.
        ppo_run_id: the ``ppo`` MLflow run the metrics go to.

    Returns:
        ``{"metrics": {val-core/..., val-aux/...}, "global_step": N, "checkpoint_dir": checkpoint}``; the metrics are
        also in DuckDB (stage ``ppo``, file ``validate_step_<N>``) with the samples
        (:func:`register_validation_samples`).

    Raises:
        ValueError: the trainer validated another step than ``global_step`` (a checkpoint folder of another step).
    """
    from rlhf_core.config import load_config

    deadline = StageDeadline.of("validate", ctx)
    full = plan.validate_overrides(overrides, checkpoint)
    config = load_config("ppo_trainer", full)  # fails here, before Ray, on a bad key
    metrics_file = Path(config.trainer.default_local_dir).parent / "metrics" / f"validate_step_{int(global_step)}.jsonl"
    metrics_file.unlink(missing_ok=True)  # a retry validates again from the start
    env = {**lineage.stage_env(ppo_run_id), "RLHF_METRICS_FILE": str(metrics_file)}
    result = deadline.run_on_ray(remote.ppo_remote, full, env=env, runtime_env=ppo_runtime_env(config, ctx))
    if int(result["global_step"]) != int(global_step):
        raise ValueError(f"validate: {checkpoint} validated at step {result['global_step']}, expected {global_step}")
    store = ResultsStore(ctx["home"])
    store.register_metrics(last_per_step_and_key(read_jsonl(metrics_file)), ppo_run_id, "ppo",
                           name=f"validate_step_{int(global_step)}")
    register_validation_samples(store, config, ppo_run_id)
    metrics = {k: v for k, v in (result.get("metrics") or {}).items() if k.startswith("val-")}
    core = sorted(k for k in metrics if k.startswith("val-core/"))
    log_line(f"validate · step {int(global_step)}: " + (", ".join(f"{k} {metrics[k]:.3f}" for k in core[:4])
                                                       or "no validation data"))
    return {"metrics": metrics, "global_step": int(global_step), "checkpoint_dir": checkpoint}


def ppo_runtime_env(config: Any, ctx: dict[str, Any]) -> dict[str, Any] | None:
    """The PPO driver task's Ray ``runtime_env``: ``ray_kwargs.ray_init.runtime_env`` (``py_executable``,
    ``env_vars``) as ``rlhf ppo`` hands it to ``ray.init`` (:func:`rlhf_core.distributed.ray_init.ppo_stage_runtime_env`;
    its workers inherit it). Raises ConfigError for a ``py_executable`` whose program is not here, on an embedded
    Ray (no ``ray_address`` nor ``$RAY_ADDRESS``)."""
    import os

    from rlhf_core.distributed.ray_init import ppo_stage_runtime_env

    return ppo_stage_runtime_env(config, embedded=not (ctx["ray_address"] or os.environ.get("RAY_ADDRESS")))


def resume_step(config: Any) -> int | None:
    """The global step a PPO run with ``config`` resumes from (``trainer.resume_mode``: for ``auto`` the tracker's
    checkpoint, or the newest complete one before it when that one is incomplete), or None when it starts from
    scratch."""
    from rlhf_core.trainer.checkpoint_manager import CheckpointManager, parse_global_step
    from rlhf_core.trainer.ppo_checkpoint import resume_components

    t = config.trainer
    path = CheckpointManager.from_config(t).resolve_resume(t.resume_mode, t.resume_from_path,
                                                           resume_components(config))
    return None if path is None else parse_global_step(path)


def register_validation_samples(store: ResultsStore, config: Any, run_id: str) -> int:
    """Register the validation sample files of a PPO config with questions and checkpoints."""
    from infra.run_folders import checkpoints_by_step

    files = parquet_files(config.trainer.validation_data_dir)
    val_files = config.data.val_files
    val_file = val_files if isinstance(val_files, str) else (list(val_files) or [None])[0]
    ckpt_root = Path(config.trainer.default_local_dir)
    return store.register_samples(files, run_id, "ppo",
                                  checkpoint=checkpoints_by_step(ckpt_root) if ckpt_root.exists() else None,
                                  questions=questions_by_prompt_id(files, val_file))

