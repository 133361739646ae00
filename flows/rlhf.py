"""The ``rlhf`` flow: prepare_data → build_model → filter_prompts → sft → (ppo_segment → validate) ×K → evaluate
→ register_model, for one experiment file (``flows/experiment.py``; the built-in demos are in ``experiments/``).

Run locally (embedded Ray, Prefect ephemeral mode, MLflow SQLite, DuckDB under
``$RLHF_HOME``)::

    python -m flows.rlhf                      # what `make demo` calls; the same as `rlhf pipeline`
    rlhf pipeline --experiment experiments/countdown.yaml [--dry-run]
    rlhf pipeline --ppo-steps 2 --train-prompts 64   # `rlhf pipeline --help` lists every option
    rlhf pipeline --experiment experiments/countdown.yaml --resume   # continue a killed run (flows/resume.py)

or as deployment ``rlhf/full`` (``prefect.yaml``). Parameters left as None come from the experiment file
(default ``experiments/gsm8k_tiny.yaml``); a stage's overrides are the experiment's (its config file, the fields
that map to keys, its ``overrides``), then the pipeline's own choices, then the ``*_overrides`` parameters (which
win). Every stage's override list, every row of every RL data file, the model and the reward function are
checked when the flow starts (``flows.preflight``), so a bad input fails in seconds; an input error in a stage
(ConfigError, DataError, FileNotFoundError, RemoteUnavailableError, a full or read-only disk:
``tasks.retry.is_retriable``) is not retried. When the ppo overrides set ``custom_reward_function.path``, the
experiment's reward_kwargs are dropped.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from infra.home import configure_environment
from rlhf_core.progress import quiet_progress_bars_when_redirected
from rlhf_core.redact import install_log_redaction

configure_environment()  # before prefect reads PREFECT_HOME (embedded defaults; user settings kept)
install_log_redaction()  # every record of this process, Prefect's run logs included, is scrubbed of secrets
# stderr redirected (make demo > log, a Prefect worker's flow-run process): no model-load bars from the Ray workers,
# which inherit this when the flow starts Ray; `rlhf pipeline` set it already (rlhf_cli)
quiet_progress_bars_when_redirected()

from prefect import flow  # noqa: E402
from prefect.runtime import flow_run  # noqa: E402

from flows import artifacts, interrupt, report  # noqa: E402
from flows import resume as resume_run  # noqa: E402
from flows.interrupt import result_of  # noqa: E402
from flows.local_run import (check_parameters, mlflow_ui_lines, quiet_input_error_tracebacks,  # noqa: E402
                             rlhf_command, start_ephemeral_prefect)
from flows.pipeline_steps import (Recorder, configured_tasks, log_summary, print_learning, register,  # noqa: E402
                                  run_ppo)
from flows.preflight import config_notes, run_checks  # noqa: E402
from flows.settings import PipelineSettings, resolve_settings  # noqa: E402
from infra import lineage  # noqa: E402
from infra.home import rlhf_home  # noqa: E402
from infra.ray_cluster import check_shared_paths, connect_ray  # noqa: E402
from infra.results import ResultsStore  # noqa: E402
from rlhf_core.cli import run_command  # noqa: E402
from tasks.common import make_context  # noqa: E402
from tasks.deadline import split_task_options  # noqa: E402
from tasks.register import gate_verdict  # noqa: E402
from tasks.runlog import log_line  # noqa: E402


@flow(name="rlhf", log_prints=True)
def rlhf(
    experiment_file: str | None = None,
    experiment_content: str | None = None,
    experiment_sha256: str | None = None,
    experiment_base_dir: str | None = None,
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
    baseline: str | None = None,
    max_regression: float | None = None,
    resume: str | None = None,
) -> dict[str, Any]:
    """Post-train a model with SFT then PPO-family RL, and evaluate it: the experiment ``experiment_content`` (its
    YAML text, which wins; a deployment carries it) or ``experiment_file`` (default ``experiments/gsm8k_tiny.yaml``;
    ``preset=NAME`` is ``experiments/<NAME>.yaml``), with the other parameters as run-time overrides of its fields
    (``flows.settings``). ``experiment_sha256``, when given, must be the content's digest (else ConfigError);
    ``experiment_base_dir`` is the folder relative paths in the content are resolved against.

    ``baseline`` (``previous-successful`` | a flow-run or MLflow run id | None) turns on the
    regression gate: after evaluation the run is compared with the baseline prompt by prompt,
    and a data source whose whole 95 % interval of the score difference lies below
    ``-max_regression`` fails the flow run (RegressionError), after everything was recorded.
    An explicit baseline that does not exist fails before any training.

    ``resume`` (a flow-run id or name, or ``last``) continues a run that did not finish in its own run folder
    (``flows.resume``): stages that finished come from Prefect's cache, PPO resumes from its latest complete
    checkpoint. ResumeError (before any stage) for a run that finished, is still running or had other settings.

    Returns:
        ``{"parent_run_id", "flow_run_id", "model_path", "sft_model", "ppo": final PPO result,
        "evaluation": metrics, "home": str}``.
    """
    s = resolve_settings(locals())
    run_checks(s)  # configs, data heads, model, reward: a bad input fails here in one line, before any stage
    home = rlhf_home()
    fr_id = str(flow_run.get_id() or "local")
    interrupt.note_flow_run(fr_id, flow_run.get_name())
    store = ResultsStore(home)
    baseline_run = report.resolve_baseline(store, s.baseline, fr_id)  # a wrong id fails here
    resumed = resume_run.find_run(home, resume, s.as_params()) if resume else None  # before this run's row
    lock = resume_run.lock_run_dir(resume_run.run_dir(home, resumed or fr_id))  # held until the flow ends
    try:
        if resumed is not None:
            resume_run.mark_interrupted(store, resumed)
            step = resume_run.checkpoint_step(resume_run.run_dir(home, resumed))
            log_line(f"resuming flow run {resumed}: finished stages come from the cache; PPO continues from "
                     + (f"its checkpoint at step {step}" if step is not None else "step 0 (it has no checkpoint)"))
        elif resume:
            log_line(f"--resume {resume}: no unfinished run of this experiment with the same settings; a new run")
        else:
            note = resume_run.unfinished_note(home, s.as_params(), fr_id)
            if note:
                log_line(note, logging.WARNING)
        started, status = report.now(), "FAILED"
        report.index_flow(store, fr_id, flow_run.get_name(), s.as_params(), "RUNNING", started)
        try:
            try:
                out = _pipeline(s, home, fr_id, store, baseline_run, resumed)
                status = "FINISHED"
                if resumed is not None:  # its work is done: not to be offered for --resume again
                    resume_run.mark_resumed(store, resumed)
            finally:
                report.index_flow(store, fr_id, flow_run.get_name(), s.as_params(), status, started, report.now())
        except KeyboardInterrupt:  # Ctrl-C: recorded above; Prefect would wait for the running stage (flows.interrupt)
            interrupt.stop()
    finally:
        lock.release()
    return out


def _pipeline(s: PipelineSettings, home: Path, fr_id: str, store: ResultsStore,
              baseline_run: Any, resumed: str | None = None) -> dict[str, Any]:
    """The stages of one flow run inside its parent MLflow run (see :func:`rlhf`), in the run folder
    ``<home>/runs/<fr_id>``, or that of the flow run ``resumed`` (``flows.resume``).

    Each task gets the future of the one before it (``wait_for``), so the Prefect run graph
    shows the chain prepare_data → build_model → sft → ppo_segment × K → evaluate.
    """
    run_dir = resume_run.run_dir(home, resumed or fr_id)
    connect_ray(s.ray_address)
    if s.ray_address or os.environ.get("RAY_ADDRESS"):  # an existing cluster: every node must see the home
        check_shared_paths([str(home)])
    url = flow_run.get_flow_run_ui_url()  # None in ephemeral mode (no UI)
    fr_name = flow_run.get_name()
    source = {lineage.SOURCE_NAME_TAG: f"{Path(__file__).resolve()} (Prefect flow rlhf)",
              lineage.SOURCE_TYPE_TAG: "LOCAL"}
    with lineage.pipeline_run(s.experiment, fr_id, s.as_params(), run_name=fr_name or "rlhf",
                              tags={**source, **({lineage.FLOW_RUN_URL_TAG: url} if url else {}),
                                    **({resume_run.RESUMED_TAG: resumed} if resumed else {})}) as parent_run_id:
        artifacts.link_parent_run(parent_run_id)
        lineage.log_dict_artifact(parent_run_id, {**s.as_params(), "resolved_overrides": {
            "sft": s.sft_list(), "evaluate": s.eval_list()}}, "config/pipeline.json")
        ctx = make_context(str(home), s.experiment, parent_run_id, fr_id, str(run_dir), s.ray_address,
                           flow_run_name=fr_name, timeouts=split_task_options(s.task_options)[1])
        (prepare_data, build_model, sft, ppo_segment, validate, evaluate, register_model,
         filter_prompts) = configured_tasks(s)
        rec = Recorder(parent_run_id, store, fr_id, fr_name)
        upstream: Any = prepare_data.submit(s.data_spec(), ctx)
        data = rec("prepare_data", result_of(upstream))
        for split, context in (("train", "training"), ("val", "validation")):  # the parent's own dataset inputs
            lineage.log_dataset(parent_run_id, data[split], f"{s.data_label}_{split}", context)
        base_model = s.model_path
        if not base_model:
            upstream = build_model.submit(data["train"], s.model_sizes, ctx, wait_for=[upstream])
            base_model = rec("build_model", result_of(upstream))["model_path"]
        if s.prefilter:  # after build_model: a built model's tokenizer is trained on the prepared data
            upstream = filter_prompts.submit(data, base_model, s.filter_cfg, ctx, wait_for=[upstream])
            data = rec("filter_prompts", result_of(upstream))
        model = base_model
        if s.sft_enabled:  # SFT reads the unfiltered prepared files (or the experiment's SFT files)
            upstream = sft.submit(base_model, data["sft_train"], data["sft_val"], s.sft_list(), ctx,
                                  wait_for=[upstream])
            model = rec("sft", result_of(upstream))["hf_dir"]
        ppo_result, upstream = run_ppo(s, model, data, str(run_dir), ctx, ppo_segment, upstream, validate)
        rec.log("ppo")
        evaluation: dict[str, Any] = {}
        if s.evaluate_enabled:
            upstream = evaluate.submit(  # generates with the final model on every suite, then scores
                s.eval_list(), ctx, checkpoint=ppo_result.get("checkpoint_dir"), val_file=data["val"],
                global_step=int(ppo_result.get("global_step") or 0), suites=s.suites,
                ppo_overrides=ppo_result["overrides"], model_path=model, wait_for=[upstream])
            evaluation = result_of(upstream)
            rec.log("evaluate")
        log_summary(parent_run_id, ppo_result, evaluation)
        print_learning(run_dir, s.val_prompts, data.get("val"))
        failure = gate_text = None
        if baseline_run is not None:
            cmp, failure = report.gate(store, baseline_run, report.eval_run_of(store, fr_id),
                                       s.max_regression, parent_run_id)
            gate_text = failure or "\n".join(
                f"passed vs {baseline_run.run_id}: {r['data_source']} {r['mean_a']:.4f} -> {r['mean_b']:.4f} "
                f"(diff {r['diff']:+.4f}, 95% CI [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}])"
                for r in report.gate_summary(cmp))
            log_line(f"regression gate: {gate_text}")
        elif s.baseline:
            log_line(f"regression gate: no earlier successful run to compare with ({s.baseline})")
        registered = register(s, ppo_result, model, data, ctx, evaluation, register_model,
                              gate_verdict(s.baseline is not None, baseline_run is not None, failure), gate_text,
                              baseline_run.run_id if baseline_run is not None else None, upstream)
        summary = artifacts.publish(store, fr_id, parent_run_id, rec.cached, ppo_result, evaluation, gate_text,
                                    registered=registered.get("line"))
        lineage.log_text_artifact(parent_run_id, summary, "summary.md")
        if failure:
            raise report.RegressionError(failure)
    if lineage.degraded() is not None:
        log_line(f"lineage degraded: {lineage.degraded()}; results are in {home} (DuckDB store), not in MLflow",
                 logging.WARNING)
    return {"parent_run_id": parent_run_id, "flow_run_id": fr_id, "model_path": base_model,
            "sft_model": model, "ppo": ppo_result, "evaluation": evaluation, "home": str(home),
            "lineage_degraded": lineage.degraded()}



# the flow parameters that are command-line options: (type or "flag" or "list", help); an option left out is None =
# the experiment file's value. experiment_content/experiment_sha256/experiment_base_dir are a deployment's (rlhf deploy)
PIPELINE_OPTIONS: dict[str, tuple[Any, str]] = {
    "experiment_file": (str, "the experiment file (YAML; schema: flows/experiment.py); default "
                             "experiments/gsm8k_tiny.yaml. Also --experiment FILE.yaml"),
    "train_prompts": (int, "rows of the training data used, the first N (data.train_max_samples)"),
    "val_prompts": (int, "rows of the validation data used, the first N (data.val_max_samples)"),
    "sft_epochs": (int, "SFT epochs (sft.epochs; trainer.total_epochs of the sft stage)"),
    "ppo_steps": (int, "PPO iterations in all (ppo.total_steps; trainer.total_training_steps)"),
    "segment_steps": (int, "PPO steps per ppo_segment task, each ending in a checkpoint (ppo.segment_steps)"),
    "adv_estimator": (str, "algorithm.adv_estimator: gae, grpo, rloo, reinforce_plus_plus, remax, ... "
                           "(ppo.adv_estimator)"),
    "preset": (str, "experiments/<PRESET>.yaml (tiny_cpu = gsm8k_tiny, tiny_cpu_tools = gsm8k_tools, countdown)"),
    "model_path": (str, "a Hugging Face causal-LM folder or URL to start from (model.path)"),
    "gsm8k_dir": (str, "folder with GSM8K's train.jsonl and test.jsonl (data.generator_args.source_dir of the "
                       "gsm8k generators); unset: $GSM8K_DIR, else the hub"),
    "ray_address": (str, "an existing Ray cluster (auto or ray://host:port); unset: embedded local Ray"),
    "experiment": (str, "the MLflow experiment's name, also trainer.project_name (default: the experiment file's "
                        "name field)"),
    "sft_overrides": ("list", "sft_trainer.yaml overrides for the sft stage (they win over the experiment's)"),
    "ppo_overrides": ("list", "ppo_trainer.yaml overrides for every ppo_segment (they win)"),
    "eval_overrides": ("list", "evaluation.yaml overrides for the evaluate stage (they win)"),
    "skip_sft": ("flag", "skip the sft stage (PPO starts from the base model)"),
    "skip_evaluate": ("flag", "skip the evaluate stage"),
    "baseline": (str, "regression gate: a run id, flow run id or 'previous-successful' to compare the evaluation with "
                      "(regression_gate.baseline)"),
    "max_regression": (float, "regression gate: the largest allowed drop of the mean score (regression_gate.max_regression)"),
    "resume": (str, "continue a run that did not finish (killed, crashed): RUN = its flow run id or name; no RUN = the "
                    "newest unfinished run of the same experiment and settings (none: a new run). Finished stages "
                    "come from the cache, PPO resumes from its latest complete checkpoint (flows/resume.py)"),
}


def pipeline_parser() -> argparse.ArgumentParser:
    """The ``rlhf pipeline`` parser: one ``--option`` per flow parameter (:data:`PIPELINE_OPTIONS`)."""
    parser = argparse.ArgumentParser(prog="rlhf pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="also: python -m flows.rlhf [options]; an option left out takes its "
                                            "value from the experiment file")
    parser.add_argument("--dry-run", action="store_true", default=None,
                        help="check the experiment (every stage config, every row of every RL data file, the "
                             "model, the reward function, the suites), print one line per check; trains nothing")
    for name, (kind, help_) in PIPELINE_OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        if name == "experiment":  # --experiment FILE (a .yaml or existing file) or NAME: main() tells them apart
            parser.add_argument("--experiment", dest="experiment_or_file", metavar="FILE|NAME",
                                help="a value ending in .yaml/.yml, or an existing file: the experiment file (as "
                                     "--experiment-file); anything else: the MLflow experiment's name (as "
                                     "--experiment-name)")
            parser.add_argument("--experiment-name", dest=name, metavar="NAME", help=help_)
        elif name == "resume":  # --resume alone: the newest unfinished run (flows.resume.LAST)
            parser.add_argument(flag, nargs="?", const=resume_run.LAST, metavar="RUN", help=help_)
        elif kind == "flag":
            parser.add_argument(flag, action="store_true", default=None, help=help_)
        elif kind == "list":
            parser.add_argument(flag, nargs="*", metavar="KEY=VALUE", help=help_)
        else:
            parser.add_argument(flag, type=kind, metavar=name.split("_")[-1].upper(), help=help_)
    return parser


def pipeline_params(argv: list[str]) -> dict[str, Any]:
    """The flow parameters (and ``dry_run``) an ``rlhf pipeline`` command line gives, the options left out omitted.
    ``--experiment X`` is the experiment file when ``X`` ends in ``.yaml``/``.yml`` or names an existing file, an
    error when it holds a ``/`` otherwise (a mistyped path), else the MLflow experiment's name; ``--experiment-name
    X`` is always the name.

    Raises:
        SystemExit: argparse's usage error (exit 2) or ``--help`` (exit 0).
    """
    params = {k: v for k, v in vars(pipeline_parser().parse_args(argv)).items() if v is not None}
    given = params.pop("experiment_or_file", None)
    if given and (given.endswith((".yaml", ".yml")) or Path(given).is_file()):  # --experiment FILE
        params["experiment_file"] = given
    elif given and "/" in given:  # a mistyped path would otherwise run the default experiment under that name
        pipeline_parser().error(f"--experiment {given}: no such file (an experiment file ends in .yaml or exists; "
                                f"for an MLflow experiment name with a '/', use --experiment-name)")
    elif given:  # --experiment NAME: the MLflow experiment (as --experiment-name)
        params["experiment"] = given
    return params


def main(argv: list[str] | None = None) -> int:
    """``rlhf pipeline [--option value ...]`` (or ``python -m flows.rlhf``): run the flow locally and say where
    the results are; returns the exit code (input errors one line, exit 1; see :mod:`rlhf_core.cli`)."""
    def command(args: list[str]) -> int:
        params = pipeline_params(args)
        if params.pop("dry_run", None):
            with config_notes(say=print):  # each config notice once, as a "note" line (not a raw warning per load)
                s = resolve_settings(params)
                n = run_checks(s, say=print)
            print(f"dry run: {n} checks passed for {s.experiment_file} (sha256 {s.experiment_sha256[:12]}); "
                  "nothing was trained")
            return 0
        error = check_parameters(params)
        if error:  # before Prefect starts its server: the message naming the parameter, exit 2 (a usage error)
            print(f"rlhf pipeline: error: {error}", file=sys.stderr)
            return 2
        start_ephemeral_prefect()
        quiet_input_error_tracebacks()  # a bad row or key: Prefect's log line without its 60-line traceback
        try:
            out = rlhf(**params)
        except KeyboardInterrupt:  # Ctrl-C: the flow run is Crashed; stop Ray and the server, exit 130
            interrupt.stop()
        home = Path(out["home"])
        print(f"\nResults under {home}")
        print(f"  MLflow: {os.environ.get('MLFLOW_TRACKING_URI')}  (parent run {out['parent_run_id']})")
        for line in mlflow_ui_lines(out["parent_run_id"]):
            print(f"          {line}")
        print(f"  DuckDB: {home / 'results.duckdb'}  (views samples, metrics, runs)")
        print(f"  Try:    {rlhf_command()} results sql \"{report.example_query(out['flow_run_id'])}\"")
        print(f"  Compare with the run before (from a second run on): {rlhf_command()} results compare previous "
              f"{out['flow_run_id']}")
        return 0

    return run_command("rlhf pipeline", command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
