"""Runs started by hand (``rlhf ppo``, ``rlhf eval``) in the same results store and MLflow home.

When ``RLHF_HOME`` is set, ``rlhf ppo ...`` / ``rlhf eval ...`` go through :func:`ppo_main` /
:func:`eval_main`: the MLflow tracking store is ``$RLHF_HOME``'s (unless ``MLFLOW_TRACKING_URI``
is set), an MLflow run is created first and the core logs into it (``MLFLOW_RUN_ID``), and
when the core returns its samples, metrics and run row are registered in the DuckDB store,
under that MLflow run id (:mod:`infra.run_folders`). Application code: it runs the trainer, so it lives in
the CLI layer, above ``infra`` (it was ``infra/manual_runs.py``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from infra import lineage
from infra.home import configure_environment, rlhf_home
from infra.results import ResultsStore
from infra.run_folders import checkpoints_by_step, evaluation_metrics_of, metric_rows, sample_files


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _tracked(config_name: str, argv: list[str], run_folder_key: str, experiment_key: str,
             run_core) -> int:
    """Shared body of :func:`ppo_main` / :func:`eval_main`."""
    from rlhf_core.config import load_config
    from rlhf_core.trainer.tracking import mlflow_params, sanitize_mlflow_name

    configure_environment()  # MLFLOW_TRACKING_URI under $RLHF_HOME unless the user set one
    config = load_config(config_name, argv)  # a bad key fails here, before any run is created
    experiment = str(_select(config, experiment_key)) if experiment_key else "rlhf-eval"
    run_id = lineage.start_run(experiment, f"manual {config_name}", tags={lineage.STAGE_TAG: config_name})
    folder = rlhf_home() / "runs" / f"manual-{run_id}"
    extra: list[str] = []
    if _select(config, run_folder_key) is None:  # keep the samples where the store can find them
        extra.append(f"{run_folder_key}={folder / 'samples'}")
        config = load_config(config_name, argv + extra)
    samples_dir = Path(str(_select(config, run_folder_key)))
    store = ResultsStore(rlhf_home())
    stage = "ppo" if config_name == "ppo_trainer" else "evaluate"
    started = _now()
    params_json = json.dumps(mlflow_params(config), sort_keys=True)
    store.index_run(run_id, None, stage, "RUNNING", started, None, params_json, name=f"manual {stage}")
    env = {**lineage.stage_env(run_id), "RLHF_METRICS_FILE": str(folder / "metrics.jsonl")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    status, code, returned = "FAILED", 1, False
    try:
        code = int(run_core(argv + extra) or 0)
        returned = True  # an exit code, not a crash (a traceback is recorded FAILED)
        status = "FINISHED" if code == 0 else "FAILED"
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        store.register_samples([str(f) for f in sample_files(samples_dir)] if samples_dir.exists() else [],
                               run_id, stage, checkpoint=_ckpts(config, config_name))
        rows = metric_rows(folder) if folder.exists() else []
        if stage == "evaluate" and samples_dir.exists() and sample_files(samples_dir):
            metrics = evaluation_metrics_of(sample_files(samples_dir))
            rows = [{"step": 0, **metrics}]
            lineage.log_metrics(run_id, {sanitize_mlflow_name(k): v for k, v in metrics.items()})
        if rows:
            store.register_metrics(rows, run_id, stage)
        ckpts = _ckpts(config, config_name)
        if returned and code == 1 and _refused_for_input() and not rows and not sample_files(samples_dir) \
                and not ckpts:
            # refused for its input before any work (rlhf_core.cli: an input error, its line printed): nothing to
            # keep. A storage error (a full disk) is not a refusal: its FAILED record stays
            lineage.client().delete_run(run_id)
            store.forget_run(run_id)
            print(f"nothing registered: the run was refused before it started (results store {store.db_path})")
        else:
            lineage.end_run(run_id, status)
            store.index_run(run_id, None, stage, status, started, _now(), params_json, name=f"manual {stage}")
            print(f"registered run {run_id} ({stage}, {status}) in {store.db_path}")
    return code


def _refused_for_input() -> bool:
    """True when the core's last command returned 1 for an input error (not a storage error: a full disk)."""
    from rlhf_core.cli import INPUT_ERRORS, last_user_error
    from rlhf_core.storage import storage_cause

    return any(isinstance(e, INPUT_ERRORS) and storage_cause(e) is None for e in last_user_error)


def _ckpts(config: Any, config_name: str) -> dict[int, str] | None:
    if config_name != "ppo_trainer":
        return None
    root = Path(str(config.trainer.default_local_dir))
    return checkpoints_by_step(root) if root.exists() else None


def _select(config: Any, dotted: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, dotted)


def ppo_main(argv: list[str]) -> int:
    """``rlhf ppo`` with ``RLHF_HOME`` set: the core's run, tracked and registered (module docstring)."""
    from rlhf_core.trainer.main_ppo import main

    if any(a in ("-h", "--help") for a in argv):  # help: nothing to track
        return main(argv)
    return _tracked("ppo_trainer", list(argv), "trainer.validation_data_dir", "trainer.project_name", main)


def eval_main(argv: list[str]) -> int:
    """``rlhf eval`` with ``RLHF_HOME`` set: the core's evaluation, tracked and registered."""
    from rlhf_core.trainer.main_eval import main

    if any(a in ("-h", "--help") for a in argv):  # help: nothing to track
        return main(argv)
    return _tracked("evaluation", list(argv), "output.samples_dir", "", main)
