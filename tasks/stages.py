"""The pipeline's Prefect tasks: prepare_data, build_model, sft, ppo_segment, validate, evaluate.

Each task opens its MLflow nested run (``tasks.common.stage``), dispatches the heavy work to
Ray (``infra.ray_cluster.run_on_ray``) and registers produced samples / metrics in the
DuckDB results store. Stages whose output is a pure function of their inputs carry a cache
key over their input files' digests and write into a folder named by that key, so a cache
hit points at an existing output. Each task enforces its pipeline.yaml ``timeout_seconds`` where
its work runs (``tasks.deadline``, not Prefect's thread timeout) and names its run after what it
does (``tasks.runlog``: ``sft · 64 rows, 1 epoch``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import filelock
from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import lineage
from infra.home import remember
from infra.results import ResultsStore
from tasks import plan, remote
from tasks.common import keep_steps_through, last_per_step_and_key, parquet_files, read_jsonl, stage
from tasks.deadline import StageDeadline
from tasks.progress import StepProgress
from tasks.runlog import (build_model_run_name, evaluate_run_name, log_line, prepare_data_run_name, sft_run_name,
                          validate_run_name)

HOUR = 3600


def retry_unless_bad_input(_task: Any, _task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a failed stage unless its error is non-retriable.

    ``plan.is_retriable`` decides (input errors — ConfigError, DataError, FileNotFoundError,
    RemoteUnavailableError — and a full or read-only disk, also wrapped in a RayTaskError, are not
    retried). When the exception cannot be read the stage is retried.
    """
    exc = getattr(state, "data", None)
    if not isinstance(exc, BaseException):
        try:
            exc = state.result(raise_on_failure=False)
        except Exception:  # noqa: BLE001 - unreadable result: keep the retry policy
            return True
    return plan.is_retriable(exc if isinstance(exc, BaseException) else None)


PIPELINE_TASKS = plan.PIPELINE_TASKS


def _gsm8k_files(gsm8k_dir: str | None) -> list[str]:
    if not gsm8k_dir:
        return []
    return [str(p) for p in sorted(Path(gsm8k_dir).glob("*")) if p.suffix in (".jsonl", ".parquet")]


def _prepare_key(_ctx: Any, p: dict[str, Any]) -> str | None:
    if p.get("task") == "countdown":  # generated from a fixed seed: the parameters are the whole input
        args = p.get("countdown") or {}  # {} keeps the key earlier runs cached under
        return plan.inputs_key("prepare_data", [], task="countdown", train=p["train_prompts"],
                               val=p["val_prompts"], home=p["ctx"]["home"], **({"countdown": args} if args else {}))
    files = _gsm8k_files(p.get("gsm8k_dir"))
    if not files:  # hub download: no stable digest to key on
        return None
    task = {} if p.get("task", "gsm8k") == "gsm8k" else {"task": p["task"]}  # gsm8k keeps its earlier keys
    return plan.inputs_key("prepare_data", files, train=p["train_prompts"], val=p["val_prompts"],
                           home=p["ctx"]["home"], **task)


@task(name="prepare_data", task_run_name=prepare_data_run_name, retries=2, retry_delay_seconds=10,
      retry_condition_fn=retry_unless_bad_input, cache_key_fn=_prepare_key, persist_result=True)
def prepare_data(gsm8k_dir: str | None, train_prompts: int, val_prompts: int,
                 ctx: dict[str, Any], task: str = "gsm8k", countdown: dict[str, int] | None = None) -> dict[str, str]:
    """Preprocess GSM8K to the verl schema (or generate Countdown) and cut the train/val subsets.

    Args:
        gsm8k_dir: folder with ``train.jsonl``/``test.jsonl`` (GSM8K's original format); None → the hub.
        train_prompts, val_prompts: rows kept from each split (first N; <=0 keeps all). For ``countdown`` they
            are the generated sizes (seed 0; <=0 → 20000 train, 500 test).
        task: ``gsm8k``, ``gsm8k_tools`` (verl's multi-turn tool schema, plus a ``messages`` column of
            synthetic tool-use traces for SFT: ``rlhf_core.data.gsm8k_multiturn``) or ``countdown``
            (``rlhf_core.data.countdown``).
        countdown: ``generate_countdown`` keyword arguments (``min_numbers``, ``max_numbers``, ``max_number``;
            a preset's ``countdown:``); None or {} = its defaults. Ignored for the GSM8K tasks.

    Returns:
        ``{"train": path, "val": path, "train_sha256": hex, "val_sha256": hex, "run_id": str}``
        (``run_id``: this stage's MLflow run — on a cache hit, the run that produced it).
    """
    from rlhf_core.data.countdown import generate_countdown
    from rlhf_core.data.gsm8k import preprocess_gsm8k
    from rlhf_core.data.gsm8k_multiturn import add_tool_traces

    if task not in PIPELINE_TASKS:
        raise ValueError(f"unknown pipeline task {task!r}; known: {list(PIPELINE_TASKS)}")
    deadline = StageDeadline.of("prepare_data", ctx)  # runs here, not on Ray: checked once the data is cut
    out = Path(ctx["home"]) / "data" / task
    params = {"task": task, "gsm8k_dir": gsm8k_dir, "train_prompts": train_prompts, "val_prompts": val_prompts,
              **({"countdown": countdown} if task == "countdown" and countdown else {})}
    with stage("prepare_data", params, ctx) as run_id:
        tag = ""
        if task == "countdown":
            n_train, n_val = (train_prompts if train_prompts > 0 else 20000), (val_prompts if val_prompts > 0 else 500)
            args = dict(countdown or {})
            tag = "".join(f"_{k}{v}" for k, v in sorted(args.items()))  # each generation its own folder
            splits = generate_countdown(str(out / f"full_{n_train}_{n_val}{tag}"), n_train, n_val, seed=0, **args)
        else:
            splits = preprocess_gsm8k(gsm8k_dir, str(out / "full"), multiturn=task == "gsm8k_tools")
        train = plan.take_rows(splits["train"], str(out / f"train_{train_prompts}{tag}.parquet"), train_prompts)
        val = plan.take_rows(splits["test"], str(out / f"test_{val_prompts}{tag}.parquet"), val_prompts)
        if task == "gsm8k_tools":  # the SFT stage reads the traces; PPO ignores the extra column
            train, val = add_tool_traces(train, train), add_tool_traces(val, val)
        deadline.left()  # StageTimeoutError past tasks.prepare_data.timeout_seconds
        result = {"train": train, "val": val, "run_id": run_id}
        result["train_sha256"] = lineage.log_dataset(run_id, train, f"{task}_train", "training")
        result["val_sha256"] = lineage.log_dataset(run_id, val, f"{task}_val", "validation")
    if gsm8k_dir:  # the next `rlhf pipeline` in this home finds the data without GSM8K_DIR
        remember("gsm8k_dir", str(Path(gsm8k_dir).resolve()), Path(ctx["home"]))
    return result


def _build_key(_ctx: Any, p: dict[str, Any]) -> str:
    return plan.inputs_key("build_model", [p["train_file"]], sizes=p["sizes"], home=p["ctx"]["home"])


@task(name="build_model", task_run_name=build_model_run_name, retries=1, retry_delay_seconds=10,
      retry_condition_fn=retry_unless_bad_input, cache_key_fn=_build_key, persist_result=True)
def build_model(train_file: str, sizes: dict[str, int], ctx: dict[str, Any]) -> dict[str, str]:
    """Build the tiny Qwen2-style model + BPE tokenizer from the training text (on Ray).

    The folder is a pure function of the inputs (its name is their key). Flow runs started at once
    on one home all miss Prefect's cache: the build runs under a file lock (``<folder>.lock``) and
    a folder that is already there (written atomically, so complete) is used as it is. Rebuilding
    it would swap the folder under a run that is loading it.

    Returns:
        ``{"model_path": HF folder $RLHF_HOME/models/tiny-<key>, "run_id": MLflow run}``.
    """
    deadline = StageDeadline.of("build_model", ctx)
    key = plan.inputs_key("build_model", [train_file], sizes=sizes)[:16]
    out_dir = str(Path(ctx["home"]) / "models" / f"tiny-{key}")
    with stage("build_model", {"sizes": sizes, "train_file": train_file}, ctx) as run_id:
        lineage.log_dataset(run_id, train_file, "gsm8k_train", "training")
        with filelock.FileLock(f"{out_dir}.lock", timeout=HOUR):
            if Path(out_dir, "config.json").is_file():
                path = out_dir  # built by a concurrent flow run with the same inputs
            else:
                path = deadline.run_on_ray(remote.build_model_remote, train_file, out_dir, dict(sizes))
        lineage.log_dir_artifact(run_id, path, "model")
    return {"model_path": path, "run_id": run_id}


def _sft_key(_ctx: Any, p: dict[str, Any]) -> str:
    return plan.inputs_key("sft", [p["model_path"], p["train_file"], p["val_file"]],
                           overrides=p["overrides"], home=p["ctx"]["home"])


@task(name="sft", task_run_name=sft_run_name, retries=1, retry_delay_seconds=30,
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
        metrics_file.unlink(missing_ok=True)
        env = {**lineage.stage_env(run_id), "RLHF_METRICS_FILE": str(metrics_file)}
        result = deadline.run_on_ray(remote.sft_remote, full, env=env)
        ResultsStore(ctx["home"]).register_metrics(read_jsonl(metrics_file), run_id, "sft")
        hf_dir = result.get("hf_dir") or result["hf_model_dir"]
        lineage.log_dir_artifact(run_id, hf_dir, "hf_model")
    return {"hf_dir": hf_dir, "run_id": run_id}


@task(name="ppo_segment", retries=2, retry_delay_seconds=30,
      retry_condition_fn=retry_unless_bad_input, cache_policy=NO_CACHE)
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
    keep_steps_through(metrics_file, resume_step(config))  # a retry keeps what its dead attempt logged up to there
    env = {**lineage.stage_env(ppo_run_id), "RLHF_METRICS_FILE": str(metrics_file)}
    progress = StepProgress(metrics_file, int(config.trainer.total_training_steps), progress_id,
                            config.trainer.total_training_seconds)
    result = deadline.run_on_ray(remote.ppo_remote, list(overrides), env=env, on_poll=progress.poll)
    progress.finish()
    store = ResultsStore(ctx["home"])
    store.register_metrics(last_per_step_and_key(read_jsonl(metrics_file)), ppo_run_id, "ppo",
                           name=f"segment_{segment}")
    register_validation_samples(store, config, ppo_run_id)
    lineage.set_tags(ppo_run_id, {f"segment.{segment}.global_step": result.get("global_step"),
                                  f"segment.{segment}.worker_nodes": ",".join(result.get("worker_nodes") or [])})
    return result


@task(name="validate", task_run_name=validate_run_name, retries=1, retry_delay_seconds=30,
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
    result = deadline.run_on_ray(remote.ppo_remote, full, env=env)
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
    from infra.manual_runs import checkpoints_by_step

    files = parquet_files(config.trainer.validation_data_dir)
    val_files = config.data.val_files
    val_file = val_files if isinstance(val_files, str) else (list(val_files) or [None])[0]
    ckpt_root = Path(config.trainer.default_local_dir)
    return store.register_samples(files, run_id, "ppo",
                                  checkpoint=checkpoints_by_step(ckpt_root) if ckpt_root.exists() else None,
                                  questions=plan.questions_by_prompt_id(files, val_file))


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


@task(name="evaluate", task_run_name=evaluate_run_name, retries=1, retry_delay_seconds=30,
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
                                   questions=plan.questions_by_prompt_id(kept, str(prompts)))
            for f in kept:
                lineage.client().log_artifact(run_id, f, "samples")
            log_line(f"evaluate · {suite['name']}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in sorted(named.items()) if k.startswith("test_score/")))
        lineage.log_metrics(run_id, {lineage_name(k): v for k, v in metrics.items()}, step=int(global_step))
    return metrics


def lineage_name(key: str) -> str:
    """A metric name MLflow accepts (``@`` → ``_at_``, like the core's MLflow sink)."""
    try:
        from rlhf_core.trainer.tracking import sanitize_mlflow_name
    except ImportError:  # pragma: no cover
        return key.replace("@", "_at_")
    return sanitize_mlflow_name(key)


__all__ = ["prepare_data", "build_model", "sft", "ppo_segment", "validate", "evaluate"]
