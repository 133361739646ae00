"""The pipeline's Prefect tasks: prepare_data, build_model, sft, ppo_segment, validate, evaluate.

Each task opens its MLflow nested run (``tasks.common.stage``), dispatches the heavy work to
Ray (``infra.ray_cluster.run_on_ray``) and registers produced samples / metrics in the
DuckDB results store. Stages whose output is a pure function of their inputs carry a cache
key over their input files' digests and write into a folder named by that key, so a cache
hit points at an existing output. Each task enforces its ``tasks.<stage>.timeout_seconds`` where
its work runs (``tasks.deadline``, not Prefect's thread timeout) and names its run after what it
does (``tasks.runlog``: ``sft · 64 rows, 1 epoch``). The decorators set no retries: the one place for a stage's
retries is the experiment's ``tasks.<stage>`` (defaults in ``flows/experiment.py``), applied by the flow
(``flows.rlhf._configured_tasks``).
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
from infra.run_folders import last_per_step_and_key, read_jsonl
from tasks import plan, remote
from tasks.common import keep_steps_through, parquet_files, stage
from tasks.deadline import StageDeadline
from tasks.progress import StepProgress
from tasks.runlog import (build_model_run_name, evaluate_run_name, filter_prompts_run_name, log_line,
                          prepare_data_run_name, sft_run_name, validate_run_name)

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


def _local_inputs(data: dict[str, Any]) -> list[str] | None:
    """The local copies of every input file of ``prepare_data`` (remote ones copied once into the cache), or the
    generator's inputs; None when the inputs cannot be digested (a hub download, an unreadable URL)."""
    from rlhf_core.data.fs import copy_to_local
    from rlhf_core.data.generators import GENERATORS

    if data["generator"]:
        return GENERATORS[data["generator"]].input_files(data["generator_args"])
    names = [*data["train_files"], *data["val_files"], *data["sft_train_files"], *data["sft_val_files"],
             *(f for suite in data["suites"] for f in suite["files"])]
    try:
        return [copy_to_local(str(n)) for n in names]
    except (OSError, ValueError, ImportError):  # the task itself reports the missing file, naming it
        return None


def _prepare_key(_ctx: Any, p: dict[str, Any]) -> str | None:
    """Cache key: the digests of the input files' bytes and the data settings (Prefect ``cache_key_fn``)."""
    files = _local_inputs(p["data"])
    if files is None:
        return None
    return plan.inputs_key("prepare_data", files, data=p["data"], home=p["ctx"]["home"])


@task(name="prepare_data", task_run_name=prepare_data_run_name,
      retry_condition_fn=retry_unless_bad_input, cache_key_fn=_prepare_key, persist_result=True)
def prepare_data(data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """Copy the experiment's data once (fsspec), check verl's RL schema, cut the first N rows, digest.

    Args:
        data: ``PipelineSettings.data_spec()``: ``generator`` (a ``rlhf_core.data.generators`` name, whose output
            is used as the files) and ``generator_args``, or ``train_files``/``val_files`` (paths or fsspec URLs);
            ``train_prompts``/``val_prompts`` (first N rows; <= 0 all); ``sft_train_files``/``sft_val_files``
            (verl SFT parquet, copied as they are; [] = the RL files); ``suites`` (``[{"name", "files"}]``,
            checked like the RL files); ``prompt_key`` (the PPO config's ``data.prompt_key``).

    Returns:
        ``{"train", "val": prepared parquet, "train_sha256", "val_sha256", "sft_train", "sft_val",
        "suites": {name: parquet}, "inputs": [{"split", "file", "sha256", "rows"}], "rows": {split: n},
        "run_id"}`` (``run_id``: this stage's MLflow run — on a cache hit, the run that produced it). Overlong
        prompts are filtered later, with the model's tokenizer (``filter_prompts``).

    Raises:
        DataError: a missing ``prompt``/``data_source``/``reward_model.ground_truth`` column, a prompt that is a
            string, an empty file (one line naming file, row and column). FileNotFoundError: a missing file.
    """
    from rlhf_core.data.generators import GENERATORS, data_label
    from rlhf_core.data.prepare import gather

    deadline = StageDeadline.of("prepare_data", ctx)  # runs here, not on Ray: checked once the data is written
    key = (_prepare_key(None, {"data": data, "ctx": ctx}) or plan.inputs_key("prepare_data", [], data=data))[:16]
    out = Path(ctx["home"]) / "data" / "prepared" / key
    label = data_label(data["generator"])
    with stage("prepare_data", data, ctx) as run_id:
        train_files, val_files = data["train_files"], data["val_files"]
        n_train, n_val = int(data["train_prompts"]), int(data["val_prompts"])
        if data["generator"]:
            made = GENERATORS[data["generator"]].generate(
                str(Path(ctx["home"]) / "data" / data["generator"]), n_train, n_val, **data["generator_args"])
            train_files, val_files = [made["train"]], [made["val"]]
        pk = data["prompt_key"]
        parts = {"train": gather(train_files, str(out / "train.parquet"), n_train, pk),
                 "val": gather(val_files, str(out / "val.parquet"), n_val, pk)}
        for split, files in (("sft_train", data["sft_train_files"]), ("sft_val", data["sft_val_files"])):
            if files:  # verl's SFT schema (prompt/response or messages): copied and digested, not RL-checked
                parts[split] = gather(files, str(out / f"{split}.parquet"), -1, check=False)
        for suite in data["suites"]:
            parts[f"suite:{suite['name']}"] = gather(suite["files"], str(out / f"suite_{suite['name']}.parquet"), -1, pk)
        deadline.left()  # StageTimeoutError past tasks.prepare_data.timeout_seconds
        result: dict[str, Any] = {
            "train": parts["train"]["path"], "val": parts["val"]["path"],
            "sft_train": parts.get("sft_train", parts["train"])["path"],
            "sft_val": parts.get("sft_val", parts["val"])["path"],
            "suites": {k.split(":", 1)[1]: v["path"] for k, v in parts.items() if k.startswith("suite:")},
            "inputs": [{"split": split, **i} for split, p in parts.items() for i in p["inputs"]],
            "rows": {split: p["rows"] for split, p in parts.items()}, "run_id": run_id}
        lineage.log_params(run_id, {f"prepared.{split}.rows": p["rows"] for split, p in parts.items()})
        lineage.log_params(run_id, {f"input.{i['split']}.{n}.sha256": i["sha256"]
                                    for n, i in enumerate(result["inputs"])})
        result["train_sha256"] = lineage.log_dataset(run_id, result["train"], f"{label}_train", "training")
        result["val_sha256"] = lineage.log_dataset(run_id, result["val"], f"{label}_val", "validation")
        for name, path in result["suites"].items():
            lineage.log_dataset(run_id, path, f"suite_{name}", "evaluation")
    source_dir = data["generator_args"].get("source_dir")
    if source_dir and "://" not in str(source_dir):  # the next `rlhf pipeline` in this home finds the data
        remember("gsm8k_dir", str(Path(source_dir).resolve()), Path(ctx["home"]))
    return result


def _tokenizer_files(model_path: str) -> list[str]:
    """The files of a local model folder that define its tokenizer and chat template (weights left out)."""
    skip = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".lock")
    folder = Path(model_path)
    return [str(f) for f in sorted(folder.iterdir()) if f.is_file() and not f.name.endswith(skip)] \
        if folder.is_dir() else []


def _filter_key(_ctx: Any, p: dict[str, Any]) -> str | None:
    from rlhf_core.data.fs import copy_to_local, is_local

    model = p["model_path"]
    if not is_local(model):
        try:
            model = copy_to_local(model)
        except (OSError, ValueError, ImportError):
            return None
    data = p["prepared"]
    return plan.inputs_key("filter_prompts", [data["train"], data["val"], *_tokenizer_files(model)],
                           cfg=p["cfg"], home=p["ctx"]["home"])


@task(name="filter_prompts", task_run_name=filter_prompts_run_name,
      retry_condition_fn=retry_unless_bad_input, cache_key_fn=_filter_key, persist_result=True)
def filter_prompts(prepared: dict[str, Any], model_path: str, cfg: dict[str, Any],
                   ctx: dict[str, Any]) -> dict[str, Any]:
    """Drop the prepared train/val rows whose prompt is longer than ``cfg["max_prompt_length"]`` tokens with the
    model's tokenizer and chat template (verl's ``data.filter_overlong_prompts``), in
    ``cfg["workers"]`` processes (``data.filter_overlong_prompts_workers``).

    It runs after ``build_model`` (a built model's tokenizer is trained on the prepared data), or right after
    ``prepare_data`` when the experiment names a model; the PPO stage then reads these files with
    ``data.filter_overlong_prompts=False`` and filters nothing again. SFT reads the unfiltered files.

    Args:
        cfg: ``{"max_prompt_length", "workers", "prompt_key", "template_kwargs"}`` of the PPO config's ``data``.

    Returns:
        ``prepared`` with ``train``/``val`` (and their ``*_sha256``) replaced by the filtered files,
        ``filtered: {"train": {"kept", "dropped"}, "val": {...}}`` and ``run_id`` (this stage's MLflow run).
    """
    from rlhf_core.data.fs import copy_to_local
    from rlhf_core.data.prepare import filter_overlong
    from rlhf_core.models.loading import load_tokenizer

    deadline = StageDeadline.of("filter_prompts", ctx)
    key = (_filter_key(None, {"prepared": prepared, "model_path": model_path, "cfg": cfg, "ctx": ctx})
           or plan.inputs_key("filter_prompts", [prepared["train"], prepared["val"]], cfg=cfg))[:16]
    out = Path(ctx["home"]) / "data" / "filtered" / key
    with stage("filter_prompts", {**cfg, "model_path": model_path}, ctx) as run_id:
        tokenizer = load_tokenizer(copy_to_local(model_path))
        counts = {split: filter_overlong(prepared[split], str(out / f"{split}.parquet"), tokenizer,
                                         int(cfg["max_prompt_length"]), int(cfg["workers"]), cfg["prompt_key"],
                                         dict(cfg["template_kwargs"]))
                  for split in ("train", "val")}
        deadline.left()
        lineage.log_params(run_id, {f"{split}.{k}": c[k] for split, c in counts.items() for k in ("kept", "dropped")})
        result = {**prepared, "run_id": run_id,
                  "filtered": {split: {"kept": c["kept"], "dropped": c["dropped"]} for split, c in counts.items()}}
        for split, context in (("train", "training"), ("val", "validation")):
            result[split] = counts[split]["path"]
            result[f"{split}_sha256"] = lineage.log_dataset(run_id, counts[split]["path"], f"filtered_{split}", context)
        log_line("filter_prompts: " + ", ".join(
            f"{split} kept {c['kept']}, dropped {c['dropped']} (> {cfg['max_prompt_length']} tokens)"
            for split, c in counts.items()))
    return result


def _build_key(_ctx: Any, p: dict[str, Any]) -> str:
    return plan.inputs_key("build_model", [p["train_file"]], sizes=p["sizes"], home=p["ctx"]["home"])


@task(name="build_model", task_run_name=build_model_run_name,
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
        lineage.log_dataset(run_id, train_file, "tokenizer_text", "training")  # the text its tokenizer learns
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
        metrics_file.unlink(missing_ok=True)
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
    from infra.run_folders import checkpoints_by_step

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


__all__ = ["prepare_data", "filter_prompts", "build_model", "sft", "ppo_segment", "validate", "evaluate"]
