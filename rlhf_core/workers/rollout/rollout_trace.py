"""Agent-loop trajectories as MLflow traces (``actor_rollout_ref.rollout.trace.backend: mlflow``), as verl 0.9.1's
``verl/utils/rollout_trace.py`` does: one trace per trajectory, named ``agent_loop``, in the MLflow experiment
``rollout.trace.project_name`` (default: ``trainer.project_name``) of the store ``MLFLOW_TRACKING_URI`` (verl's
fallback: ``sqlite:////tmp/mlruns.db``), tagged with the step, the sample index, whether it is a validation rollout
and ``rollout.trace.experiment_name`` (default: ``trainer.experiment_name``). ``trace.max_samples_per_step_per_worker``
traces only that many prompts (all their ``rollout.n`` responses) per call of each worker, as verl's agent loop.

A trace's inputs are the prompt's token ids (and the raw chat messages when the batch has them), its outputs the
response's token ids and turn count; ``trace.token2text`` adds the decoded prompt and response text.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from rlhf_core.protocol import Batch

DEFAULT_TRACKING_URI = "sqlite:////tmp/mlruns.db"  # verl's, when MLFLOW_TRACKING_URI is unset


def _jsonable(value: Any) -> Any:
    """A numpy / tensor cell as plain lists and scalars (MLflow stores span inputs and outputs as JSON)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class MlflowRolloutTracer:
    """Logs each generated trajectory of a rollout batch as one MLflow trace.

    Args:
        project_name: the MLflow experiment (``trainer.project_name``); created when missing.
        experiment_name: tag ``experiment_name`` of every trace (``trainer.experiment_name``).
        tokenizer: decodes the ids when ``token2text``.
        token2text: ``rollout.trace.token2text``.
        max_samples: ``rollout.trace.max_samples_per_step_per_worker``: prompts traced per :meth:`log` (None: all).
    """

    def __init__(self, project_name: str, experiment_name: str, tokenizer, token2text: bool,
                 max_samples: int | None = None) -> None:
        import mlflow  # lazy: seconds to import, only runs that trace pay it

        self.mlflow = mlflow
        if "MLFLOW_TRACKING_URI" not in os.environ:  # else mlflow reads it itself; no process-wide override
            mlflow.set_tracking_uri(DEFAULT_TRACKING_URI)
        self.experiment_id = mlflow.set_experiment(str(project_name)).experiment_id
        self.experiment_name, self.tokenizer, self.token2text = str(experiment_name), tokenizer, bool(token2text)
        self.max_samples = None if max_samples is None else int(max_samples)

    def traced_rows(self, out: Batch) -> list[int]:
        """The rows to trace: all, or with ``max_samples`` the rows of that many prompts drawn at random (the
        ``index`` column names a row's prompt, else every row is its own; rows of one prompt go together, as
        verl's agent loop picks samples, seeded by the step here so a rerun traces the same rows)."""
        index = np.asarray(out["index"]) if "index" in out else np.arange(len(out))
        prompts = np.unique(index)
        if self.max_samples is None or self.max_samples >= len(prompts):
            return list(range(len(out)))
        step = out.meta.get("global_steps")
        rng = np.random.default_rng(int(step) if isinstance(step, (int, np.integer)) else 0)
        chosen = set(rng.choice(prompts, self.max_samples, replace=False).tolist())
        return [i for i, p in enumerate(index.tolist()) if p in chosen]

    def log(self, out: Batch) -> list[str]:
        """One trace per row of the rollout batch ``out`` (``prompts``/``attention_mask``/``responses``/
        ``response_mask``; ``num_turns``, ``raw_prompt`` and ``index`` when present; ``meta``
        ``global_steps``/``validate``), or of the rows :meth:`traced_rows` picks. Returns the trace ids, in row
        order."""
        mlflow = self.mlflow
        P = out["prompts"].shape[1]
        step, validate = out.meta.get("global_steps"), bool(out.meta.get("validate", False))
        ids = []
        for i in self.traced_rows(out):
            prompt = out["prompts"][i][out["attention_mask"][i, :P].bool()].tolist()
            response = out["responses"][i][out["response_mask"][i].bool()].tolist()
            inputs: dict[str, Any] = {"prompt_ids": prompt}
            if "raw_prompt" in out:
                inputs["raw_prompt"] = _jsonable(out["raw_prompt"][i])
            outputs: dict[str, Any] = {"response_ids": response}
            if "num_turns" in out:
                outputs["num_turns"] = int(out["num_turns"][i])
            if self.token2text:
                inputs["prompt_text"] = self.tokenizer.decode(prompt)
                outputs["response_text"] = self.tokenizer.decode(response)
            with mlflow.start_span(name="agent_loop") as span:
                span.set_inputs(inputs)
                mlflow.update_current_trace(tags={"step": str(step), "sample_index": str(i),
                                                  "validate": str(validate), "experiment_name": self.experiment_name})
                span.set_outputs(outputs)
                ids.append(span.trace_id)
        mlflow.flush_trace_async_logging()  # mlflow exports traces in the background: in the store on return
        return ids


def rollout_tracer(trace_cfg, trainer_cfg, tokenizer) -> MlflowRolloutTracer | None:
    """The tracer for ``actor_rollout_ref.rollout.trace`` (None when ``backend`` is null): ``project_name``,
    ``experiment_name`` (null: ``trainer_cfg``'s), ``token2text``, ``max_samples_per_step_per_worker``.

    Raises:
        ValueError: ``backend: weave`` (no weave client here), or ``max_samples_per_step_per_worker`` < 1, naming
        the key, before any rollout.
    """
    backend = trace_cfg.backend
    if backend is None:
        return None
    if backend != "mlflow":
        raise ValueError(f"actor_rollout_ref.rollout.trace.backend={backend!r} is not supported here (no weave "
                         "client); use 'mlflow' or null")
    # trace.project_name / experiment_name follow trainer's (${oc.select:trainer...}); a rollout section read alone
    # resolves them to null, which means the trainer's too
    project = trainer_cfg.project_name if trace_cfg.project_name is None else trace_cfg.project_name
    experiment = trainer_cfg.experiment_name if trace_cfg.experiment_name is None else trace_cfg.experiment_name
    limit = trace_cfg.max_samples_per_step_per_worker
    if limit is not None and int(limit) < 1:
        raise ValueError(f"actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker={limit} must be >= 1 "
                         "or null (all)")
    return MlflowRolloutTracer(project, experiment, tokenizer, trace_cfg.token2text, limit)
