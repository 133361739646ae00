"""Agent-loop trajectories as MLflow traces (``actor_rollout_ref.rollout.trace.backend: mlflow``), as verl 0.9.1's
``verl/utils/rollout_trace.py`` does: one trace per trajectory, named ``agent_loop``, in the MLflow experiment
``trainer.project_name`` of the store ``MLFLOW_TRACKING_URI`` (verl's fallback: ``sqlite:////tmp/mlruns.db``),
tagged with the step, the sample index, whether it is a validation rollout and ``trainer.experiment_name``.

A trace's inputs are the prompt's token ids (and the raw chat messages when the batch has them), its outputs the
response's token ids and turn count; ``trace.token2text`` adds the decoded prompt and response text.
"""
from __future__ import annotations

import os
from typing import Any

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
    """

    def __init__(self, project_name: str, experiment_name: str, tokenizer, token2text: bool) -> None:
        import mlflow  # lazy: seconds to import, only runs that trace pay it

        self.mlflow = mlflow
        if "MLFLOW_TRACKING_URI" not in os.environ:  # else mlflow reads it itself; no process-wide override
            mlflow.set_tracking_uri(DEFAULT_TRACKING_URI)
        self.experiment_id = mlflow.set_experiment(str(project_name)).experiment_id
        self.experiment_name, self.tokenizer, self.token2text = str(experiment_name), tokenizer, bool(token2text)

    def log(self, out: Batch) -> list[str]:
        """One trace per row of the rollout batch ``out`` (``prompts``/``attention_mask``/``responses``/
        ``response_mask``; ``num_turns`` and ``raw_prompt`` when present; ``meta`` ``global_steps``/``validate``).
        Returns the trace ids, in row order."""
        mlflow = self.mlflow
        P = out["prompts"].shape[1]
        step, validate = out.meta.get("global_steps"), bool(out.meta.get("validate", False))
        ids = []
        for i in range(len(out)):
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
    """The tracer for ``actor_rollout_ref.rollout.trace`` (None when ``backend`` is null).

    Raises:
        ValueError: ``backend: weave`` (no weave client here), naming the key, before any rollout.
    """
    backend = trace_cfg.backend
    if backend is None:
        return None
    if backend != "mlflow":
        raise ValueError(f"actor_rollout_ref.rollout.trace.backend={backend!r} is not supported here (no weave "
                         "client); use 'mlflow' or null")
    return MlflowRolloutTracer(trainer_cfg.project_name, trainer_cfg.experiment_name, tokenizer,
                               trace_cfg.token2text)
