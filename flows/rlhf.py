"""The ``rlhf`` flow: prepare_data → build_model → sft → ppo_segment ×K → evaluate.

Run locally (embedded Ray, Prefect ephemeral mode, MLflow SQLite, DuckDB under
``$RLHF_HOME``)::

    python -m flows.rlhf                      # what `make demo` calls; the same as `rlhf pipeline`
    rlhf pipeline --ppo-steps 2 --train-prompts 64   # `rlhf pipeline --help` lists every option

or as deployment ``rlhf/full`` (``prefect.yaml``). Parameters left as None come from
``configs/pipeline.yaml``; override lists come from ``configs/presets/<preset>.yaml``,
then the pipeline's own choices, then the ``*_overrides`` parameters (which win). Every
stage's override list is checked (load_config) when the flow starts, so a typo fails in
seconds; a ConfigError, DataError or FileNotFoundError in a stage is not retried. When the
ppo overrides set ``custom_reward_function.path``, the preset's reward_kwargs are dropped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from infra.home import configure_environment

configure_environment()  # before prefect reads PREFECT_HOME (embedded defaults; user settings kept)

from prefect import flow  # noqa: E402
from prefect.runtime import flow_run  # noqa: E402

from flows.settings import PipelineSettings, resolve_settings, validate_overrides  # noqa: E402
from infra import lineage  # noqa: E402
from infra.home import rlhf_home  # noqa: E402
from infra.ray_cluster import connect_ray  # noqa: E402
from infra.results_cli import EXAMPLE_QUERY  # noqa: E402
from rlhf_core.cli import run_command  # noqa: E402
from tasks import plan  # noqa: E402
from tasks.common import make_context, stage  # noqa: E402
from tasks.stages import build_model, evaluate, lineage_name, ppo_segment, prepare_data, sft  # noqa: E402


@flow(name="rlhf", log_prints=True)
def rlhf(
    train_prompts: int | None = None,
    val_prompts: int | None = None,
    sft_epochs: int | None = None,
    ppo_steps: int | None = None,
    segment_steps: int | None = None,
    adv_estimator: str | None = None,
    preset: str | None = None,
    model_path: str | None = None,
    gsm8k_dir: str | None = None,
    ray_address: str | None = None,
    experiment: str | None = None,
    sft_overrides: list[str] | None = None,
    ppo_overrides: list[str] | None = None,
    eval_overrides: list[str] | None = None,
    skip_sft: bool | None = None,
    skip_evaluate: bool | None = None,
) -> dict[str, Any]:
    """Post-train a model with SFT then PPO-family RL, and evaluate it.

    Returns:
        ``{"parent_run_id", "model_path", "sft_model", "ppo": final PPO result,
        "evaluation": metrics, "home": str}``.
    """
    s = resolve_settings(locals())
    validate_overrides(s)  # a typo in any override list fails here, before data/SFT (ConfigError)
    home = rlhf_home()
    fr_id = str(flow_run.get_id() or "local")
    run_dir = home / "runs" / fr_id
    connect_ray(s.ray_address)
    with lineage.pipeline_run(s.experiment, fr_id, s.as_params()) as parent_run_id:
        ctx = make_context(str(home), s.experiment, parent_run_id, fr_id, str(run_dir), s.ray_address)
        prepare_data, build_model, sft, ppo_segment, evaluate = _configured_tasks(s)
        data = prepare_data(s.gsm8k_dir, s.train_prompts, s.val_prompts, ctx, task=s.task)
        _record(parent_run_id, "prepare_data", data)
        base_model = s.model_path
        if not base_model:
            built = build_model(data["train"], s.model_sizes, ctx)
            base_model = _record(parent_run_id, "build_model", built)["model_path"]
        model = base_model
        if s.sft_enabled:
            trained = sft(base_model, data["train"], data["val"], s.sft_list(), ctx)
            model = _record(parent_run_id, "sft", trained)["hf_dir"]
        ppo_result = _run_ppo(s, model, data, str(run_dir), ctx, ppo_segment)
        evaluation = {}
        if s.evaluate_enabled:
            evaluation = evaluate(str(run_dir / "val_samples"), s.eval_list(), ctx)
        _log_summary(parent_run_id, ppo_result, evaluation)
        _print_learning(run_dir, s.val_prompts)
    return {"parent_run_id": parent_run_id, "model_path": base_model, "sft_model": model,
            "ppo": ppo_result, "evaluation": evaluation, "home": str(home)}


def _record(parent_run_id: str, stage_name: str, output: dict[str, Any]) -> dict[str, Any]:
    """Tag the parent run with the stage run that produced ``output`` (on a cache hit: an earlier run's)."""
    lineage.set_tags(parent_run_id, {f"stage.{stage_name}.run_id": output["run_id"]})
    return output


def _log_summary(parent_run_id: str, ppo_result: dict[str, Any], evaluation: dict[str, Any]) -> None:
    """Final validation (``val-*``) and evaluation metrics on the parent run, at the last global step."""
    final = {k: v for k, v in (ppo_result.get("metrics") or {}).items() if k.startswith("val-")}
    final.update(evaluation or {})
    lineage.log_metrics(parent_run_id, {lineage_name(k): v for k, v in final.items()},
                        step=int(ppo_result.get("global_step") or 0))


def _print_learning(run_dir: Path, val_prompts: int) -> None:
    """Print the core validation metric before and after PPO (greedy accuracy under the learn presets)."""
    from tasks.common import read_jsonl

    rows = [r for f in sorted((run_dir / "metrics").glob("segment_*.jsonl")) for r in read_jsonl(f)]
    summary = plan.validation_before_after(rows)
    if summary is None:
        print("no validation metric was logged (trainer.val_before_train / test_freq)")
        return
    print(f"{summary['name']} on {val_prompts} held-out prompts: step {summary['before_step']}: "
          f"{summary['before']:.3f} -> step {summary['after_step']}: {summary['after']:.3f} "
          f"(gain {summary['gain']:+.3f})")


def _configured_tasks(s: PipelineSettings) -> tuple:
    """The five stage tasks with the retries/timeouts of pipeline.yaml's ``tasks:`` applied."""
    tasks = {"prepare_data": prepare_data, "build_model": build_model, "sft": sft,
             "ppo_segment": ppo_segment, "evaluate": evaluate}
    return tuple(t.with_options(**s.task_options.get(name, {})) for name, t in tasks.items())


def _run_ppo(s: PipelineSettings, model: str, data: dict[str, str], run_dir: str,
             ctx: dict[str, Any], ppo_task: Any = ppo_segment) -> dict[str, Any]:
    """One ``ppo`` MLflow run; one ppo_segment task per checkpoint boundary."""
    result: dict[str, Any] = {}
    stage_params = {"total_steps": s.ppo_steps, "segment_steps": s.segment_steps,
                    "adv_estimator": s.adv_estimator, "model_path": model}
    with stage("ppo", stage_params, ctx) as ppo_run_id:
        lineage.log_dataset(ppo_run_id, data["train"], "gsm8k_train", "training")
        lineage.log_dataset(ppo_run_id, data["val"], "gsm8k_val", "validation")
        for i, stop in enumerate(plan.segment_boundaries(s.ppo_steps, s.segment_steps), start=1):
            overrides = s.ppo_list(model_path=model, train_file=data["train"], val_file=data["val"],
                                   run_dir=run_dir, stop_after_step=stop)
            result = ppo_task(overrides, i, ppo_run_id, ctx)
        ckpt = result.get("checkpoint_dir")
        if ckpt and os.path.isdir(ckpt):  # copied only when small (a tiny model), else tagged
            lineage.log_dir_artifact(ppo_run_id, ckpt, "checkpoint")
    return result


# every flow parameter as a command-line option: (type or "flag" or "list", help); None = configs/pipeline.yaml
PIPELINE_OPTIONS: dict[str, tuple[Any, str]] = {
    "train_prompts": (int, "rows of the GSM8K train split used, the first N (pipeline.yaml data.train_prompts)"),
    "val_prompts": (int, "rows of the test split used for validation, the first N (data.val_prompts)"),
    "sft_epochs": (int, "SFT epochs (sft.epochs; trainer.total_epochs of the sft stage)"),
    "ppo_steps": (int, "PPO iterations in all (ppo.total_steps; trainer.total_training_steps)"),
    "segment_steps": (int, "PPO steps per ppo_segment task, each ending in a checkpoint (ppo.segment_steps)"),
    "adv_estimator": (str, "algorithm.adv_estimator: gae, grpo, rloo, reinforce_plus_plus, remax, ... "
                           "(ppo.adv_estimator)"),
    "preset": (str, "configs/presets/<PRESET>.yaml, whose override lists come first (default tiny_cpu)"),
    "model_path": (str, "a Hugging Face causal-LM folder to start from; unset: build the tiny model from the data"),
    "gsm8k_dir": (str, "local GSM8K (train/test .jsonl or verl parquet); unset: $GSM8K_DIR, else the hub"),
    "ray_address": (str, "an existing Ray cluster (auto or ray://host:port); unset: embedded local Ray"),
    "experiment": (str, "MLflow experiment name, also trainer.project_name (default rlhf)"),
    "sft_overrides": ("list", "sft_trainer.yaml overrides for the sft stage (they win over preset and pipeline)"),
    "ppo_overrides": ("list", "ppo_trainer.yaml overrides for every ppo_segment (they win)"),
    "eval_overrides": ("list", "evaluation.yaml overrides for the evaluate stage (they win)"),
    "skip_sft": ("flag", "skip the sft stage (PPO starts from the base model)"),
    "skip_evaluate": ("flag", "skip the evaluate stage"),
}


def pipeline_parser() -> argparse.ArgumentParser:
    """The ``rlhf pipeline`` parser: one ``--option`` per flow parameter (:data:`PIPELINE_OPTIONS`)."""
    parser = argparse.ArgumentParser(prog="rlhf pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="also: python -m flows.rlhf [options]; an option left out takes its "
                                            "value from configs/pipeline.yaml")
    for name, (kind, help_) in PIPELINE_OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        if kind == "flag":
            parser.add_argument(flag, action="store_true", default=None, help=help_)
        elif kind == "list":
            parser.add_argument(flag, nargs="*", metavar="KEY=VALUE", help=help_)
        else:
            parser.add_argument(flag, type=kind, metavar=name.split("_")[-1].upper(), help=help_)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``rlhf pipeline [--option value ...]`` (or ``python -m flows.rlhf``): run the flow locally and say where
    the results are; returns the exit code (input errors one line, exit 1; see :mod:`rlhf_core.cli`)."""
    def command(args: list[str]) -> int:
        params = {k: v for k, v in vars(pipeline_parser().parse_args(args)).items() if v is not None}
        out = rlhf(**params)
        home = Path(out["home"])
        print(f"\nResults under {home}")
        print(f"  MLflow: {os.environ.get('MLFLOW_TRACKING_URI')}  (parent run {out['parent_run_id']})")
        print(f"  DuckDB: {home / 'results.duckdb'}  (views samples, metrics, runs)")
        print(f"  Try:    {rlhf_command()} results sql \"{EXAMPLE_QUERY}\"")
        return 0

    return run_command("rlhf pipeline", command, sys.argv[1:] if argv is None else argv)


def rlhf_command() -> str:
    """How to call the ``rlhf`` CLI here: ``rlhf`` when it is on PATH, else the venv's script
    (``.venv/bin/rlhf``, relative to the current folder when below it)."""
    if shutil.which("rlhf"):
        return "rlhf"
    script = Path(sys.executable).parent / "rlhf"
    if not script.exists():
        return ".venv/bin/rlhf"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


if __name__ == "__main__":
    raise SystemExit(main())
