"""The ``rlhf`` flow's steps between its tasks (``flows.rlhf``): the tasks with the experiment's retries
(:func:`configured_tasks`), the PPO chain of ppo_segment and validate tasks (:func:`run_ppo`), the stage recorder
(:class:`Recorder`), the ``register_model`` step (:func:`register`) and the summaries on the parent run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows import artifacts
from flows.interrupt import result_of
from flows.settings import PipelineSettings
from infra import lineage, model_registry
from infra.results import ResultsStore
from rlhf_core.config import load_config
from tasks import plan
from tasks.common import lineage_name, stage
from tasks.deadline import split_task_options
from tasks.learning import learning_line, validation_before_after
from tasks.progress import create_ppo_progress
from tasks.register import register_model
from tasks.runlog import log_line, ppo_segment_run_name
from tasks.stages import build_model, evaluate, filter_prompts, ppo_segment, prepare_data, sft, validate


class Recorder:
    """Tags the parent run with each stage's run and logs one line per stage (flows.artifacts)."""

    def __init__(self, parent_run_id: str, store: ResultsStore, flow_run_id: str, flow_run_name: str | None = None):
        self.parent_run_id, self.store, self.flow_run_id = parent_run_id, store, flow_run_id
        self.flow_run_name = flow_run_name
        self.cached: dict[str, str] = {}  # stage -> run id of an earlier flow run (Prefect cache hit)

    def __call__(self, stage_name: str, output: dict[str, Any]) -> dict[str, Any]:
        """Tag the parent run with the stage run that produced ``output`` (on a cache hit: an earlier run's, and
        a child run of this flow run that points at it: ``lineage.cached_stage_run``)."""
        run_id = output["run_id"]
        lineage.set_tags(self.parent_run_id, {f"stage.{stage_name}.run_id": run_id})
        _, rows = self.store.sql(f"SELECT flow_run_id FROM runs WHERE run_id = '{run_id}'")
        cached = bool(rows) and rows[0][0] != self.flow_run_id
        if cached:
            self.cached[stage_name] = run_id
            lineage.cached_stage_run(stage_name, run_id, self.parent_run_id, self.flow_run_id, self.flow_run_name)
        artifacts.log_stage(self.store, stage_name, run_id, cached=cached)
        return output

    def log(self, stage_name: str) -> None:
        """The line of a stage whose run is found in this flow run's rows."""
        _, rows = self.store.sql(f"SELECT run_id FROM runs WHERE flow_run_id = '{self.flow_run_id}' "
                                 f"AND stage = '{stage_name}' AND kind = 'stage' ORDER BY started_at DESC LIMIT 1")
        if rows:
            artifacts.log_stage(self.store, stage_name, rows[0][0])


def log_summary(parent_run_id: str, ppo_result: dict[str, Any], evaluation: dict[str, Any]) -> None:
    """Final validation (``val-*``) and evaluation metrics on the parent run, at the last global step."""
    final = {k: v for k, v in (ppo_result.get("metrics") or {}).items() if k.startswith("val-")}
    final.update(evaluation or {})
    lineage.log_metrics(parent_run_id, {lineage_name(k): v for k, v in final.items()},
                        step=int(ppo_result.get("global_step") or 0))


def print_learning(run_dir: Path, val_prompts: int, val_file: str | None = None) -> None:
    """Log the core validation metric before and after PPO (greedy accuracy under experiments/countdown.yaml) on the
    flow run's logger (``tasks.runlog.log_line``). The prompt count is the rows of ``val_file`` (the prepared, and
    when ``filter_prompts`` ran filtered, validation parquet that the validations read) when given, else
    ``val_prompts`` (``data.val_max_samples``, whose default -1 means "all" and is no count)."""
    import pyarrow.parquet as pq

    from infra.run_folders import read_jsonl

    if val_file:
        val_prompts = pq.read_metadata(val_file).num_rows

    folder = run_dir / "metrics"  # in-segment validations (test_freq) and the validate tasks' files
    files = [f for pattern in ("segment_*.jsonl", "validate_step_*.jsonl") for f in sorted(folder.glob(pattern))]
    rows = [r for f in files for r in read_jsonl(f)]
    log_line(learning_line(validation_before_after(rows), val_prompts))  # baseline: the step-0 validation


def configured_tasks(s: PipelineSettings) -> tuple:
    """The eight tasks with the retries of the experiment's ``tasks:`` applied. Their ``timeout_seconds`` go into the
    flow context instead (``ctx["timeouts"]``), enforced by each task where its work runs (``tasks.deadline``):
    Prefect's own timeout cannot interrupt a sync task's blocking call and warns on every task run."""
    tasks = {"prepare_data": prepare_data, "build_model": build_model, "sft": sft,
             "ppo_segment": ppo_segment, "validate": validate, "evaluate": evaluate, "register_model": register_model,
             "filter_prompts": filter_prompts}
    options = split_task_options(s.task_options)[0]
    return tuple(t.with_options(**options.get(name, {})) for name, t in tasks.items())


def run_ppo(s: PipelineSettings, model: str, data: dict[str, str], run_dir: str,
             ctx: dict[str, Any], ppo_task: Any = ppo_segment, upstream: Any = None,
             validate_task: Any = validate) -> tuple[dict[str, Any], Any]:
    """One ``ppo`` MLflow run (and ``runs`` row, whose params are the last segment's whole
    resolved config); one ppo_segment task per checkpoint boundary, each followed by a ``validate`` task of its
    checkpoint (``validate · step 10``), each waiting for the last. ``trainer.val_before_train`` (the experiment's or
    the run's) becomes a ``validate`` task of the starting model at step 0 before the first segment; the segments
    themselves run without it (``plan.segment_overrides``) and, unless ``trainer.test_freq`` was set, without
    validation (``plan.ppo_overrides``).

    Returns:
        ``(final segment result with ``run_id`` = the ppo MLflow run, its last validation's ``val-*`` metrics
        in ``metrics`` and ``overrides`` = the last segment's list, the future of the last task)``.
    """
    result: dict[str, Any] = {}
    bounds = plan.segment_boundaries(s.ppo_steps, s.segment_steps)
    lists = [s.ppo_list(model_path=model, train_file=data["train"], val_file=data["val"],
                        run_dir=run_dir, stop_after_step=stop) for stop in bounds]
    with stage("ppo", load_config("ppo_trainer", lists[-1]), ctx) as ppo_run_id:
        lineage.log_dataset(ppo_run_id, data["train"], f"{s.data_label}_train", "training")
        lineage.log_dataset(ppo_run_id, data["val"], f"{s.data_label}_val", "validation")

        def check(overrides: list[str], checkpoint: str | None, step: int, after: Any) -> Any:
            return validate_task.submit(overrides, checkpoint, step, ppo_run_id, ctx,
                                        wait_for=[after] if after is not None else None)

        if load_config("ppo_trainer", lists[0]).trainer.val_before_train:
            upstream = check(lists[0], None, 0, upstream)
            result_of(upstream)
        first = 1
        progress_id = create_ppo_progress(s.ppo_steps)
        for i, (stop, overrides) in enumerate(zip(bounds, lists), start=1):
            done = trained_segment(overrides, i, stop, ppo_run_id, ctx)  # a resumed run: trained before
            if done is not None:
                if done.get("checkpoint_dir") and not done["metrics"]:  # its validation did not finish: again
                    upstream = check(overrides, done["checkpoint_dir"], stop, upstream)
                    done = {**done, "metrics": result_of(upstream)["metrics"]}
                result, first = done, stop + 1
                continue
            name = ppo_segment_run_name(i, len(bounds), first, stop)
            upstream = ppo_task.with_options(task_run_name=name).submit(
                plan.segment_overrides(overrides), i, ppo_run_id, ctx, progress_id,
                wait_for=[upstream] if upstream is not None else None)
            result = result_of(upstream)
            if result.get("checkpoint_dir"):  # none: the segment trained nothing (a run resumed past its end)
                upstream = check(overrides, result["checkpoint_dir"], int(result["global_step"]), upstream)
                result = {**result, "metrics": {**(result.get("metrics") or {}), **result_of(upstream)["metrics"]}}
            first = stop + 1
        reward_chart(ppo_run_id, ctx)
    return {**result, "run_id": ppo_run_id, "overrides": lists[-1]}, upstream


def trained_segment(overrides: list[str], segment: int, stop: int, ppo_run_id: str,
                    ctx: dict[str, Any]) -> dict[str, Any] | None:
    """A segment a resumed run (``flows.resume``) need not start: the latest complete checkpoint of the run folder
    (the one ``trainer.resume_mode=auto`` would load) is at or past its last step ``stop``. Its metrics files
    (``segment_<i>.jsonl``, ``validate_step_<stop>.jsonl``) and validation samples are registered under this run's
    ppo run ``ppo_run_id``, as its tasks would have done. None: the segment is to be run (no such checkpoint, or one
    the trainer itself must judge: an incomplete tracked step).

    Returns:
        ``{"global_step": stop, "checkpoint_dir": global_step_<stop> folder (None when retention removed it),
        "metrics": its validation's val-* metrics ({} when its validate task did not finish), "worker_nodes": []}``.
    """
    from infra.run_folders import last_per_step_and_key, read_jsonl
    from rlhf_core.safe_load import CheckpointError
    from tasks.train_stages import register_validation_samples, resume_step

    config = load_config("ppo_trainer", overrides)
    try:
        step = resume_step(config)
    except (CheckpointError, ValueError):
        return None
    if step is None or step < stop:
        return None
    root = Path(str(config.trainer.default_local_dir))
    folder, store = root.parent / "metrics", ResultsStore(ctx["home"])
    seg_rows = last_per_step_and_key(read_jsonl(folder / f"segment_{segment}.jsonl"))
    if seg_rows:
        store.register_metrics(seg_rows, ppo_run_id, "ppo", name=f"segment_{segment}")
    val_rows = [r for r in last_per_step_and_key(read_jsonl(folder / f"validate_step_{stop}.jsonl"))
                if str(r.get("name", "")).startswith("val-")]
    if val_rows:
        store.register_metrics(val_rows, ppo_run_id, "ppo", name=f"validate_step_{stop}")
    register_validation_samples(store, config, ppo_run_id)
    ckpt = root / f"global_step_{stop}"
    log_line(f"ppo_segment {segment}: steps up to {stop} were trained by the resumed run (its checkpoint at step "
             f"{step}); not run again")
    return {"global_step": stop, "checkpoint_dir": str(ckpt) if ckpt.is_dir() else None,
            "metrics": {r["name"]: r["value"] for r in val_rows}, "worker_nodes": []}


def reward_chart(ppo_run_id: str, ctx: dict[str, Any]) -> None:
    """The reward-over-steps PNG in the run folder and as artifact ``charts/`` of the ppo run."""
    store = ResultsStore(ctx["home"])
    _, rows = store.sql(f"SELECT step, key, value FROM metrics WHERE run_id = '{ppo_run_id}' "
                        "AND (key = 'critic/score/mean' OR key LIKE 'val-core/%')")
    if rows:
        png = model_registry.reward_chart(rows, Path(ctx["run_dir"]) / "reward_over_steps.png")
        if lineage.degraded() is None:  # the chart stays in run_dir either way
            lineage.client().log_artifact(ppo_run_id, png, "charts")


def register(s: PipelineSettings, ppo_result: dict[str, Any], sft_model: str, data: dict[str, str],
              ctx: dict[str, Any], evaluation: dict[str, Any], task: Any, verdict: str, gate_text: str | None,
              baseline_run_id: str | None, upstream: Any) -> dict[str, Any]:
    """The ``register_model`` task, after evaluation and the gate: the final actor checkpoint merged into a
    Hugging Face folder, logged as ``hf_model`` of the ppo run and registered as a new version of the model
    named after the experiment, with its lineage (datasets, SFT parent model, PPO checkpoint), the evaluation
    and the gate's ``verdict`` (``tasks.register``). Returns the task's result."""
    ckpt = ppo_result.get("checkpoint_dir")
    tags = {"sft_model": sft_model, "ppo_checkpoint": ckpt, "flow_run_id": ctx["flow_run_id"],
            f"dataset.{s.data_label}_train.path": data["train"], f"dataset.{s.data_label}_val.path": data["val"]}
    tags.update({f"dataset.{s.data_label}_{k.split('_')[0]}.sha256": v for k, v in data.items() if k.endswith("_sha256")})
    return result_of(task.submit(ppo_result["run_id"], ckpt, s.experiment, tags, ctx, dict(evaluation), verdict,
                                 gate_text, baseline_run_id, wait_for=[upstream]))
