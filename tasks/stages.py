"""The pipeline's Prefect tasks: prepare_data, filter_prompts, build_model, sft, ppo_segment, validate, evaluate.

Each task opens its MLflow nested run (``tasks.common.stage``), dispatches the heavy work to
Ray (``infra.ray_cluster.run_on_ray``) and registers produced samples / metrics in the
DuckDB results store. Stages whose output is a pure function of their inputs carry a cache
key over their input files' digests and write into a folder named by that key, so a cache
hit points at an existing output. Each task enforces its ``tasks.<stage>.timeout_seconds`` where
its work runs (``tasks.deadline``, not Prefect's thread timeout) and names its run after what it
does (``tasks.runlog``: ``sft · 64 rows, 1 epoch``). The decorators set no retries: the one place for a stage's
retries is the experiment's ``tasks.<stage>`` (defaults in ``flows/experiment.py``), applied by the flow
(``flows.pipeline_steps.configured_tasks``).

The tasks live by kind: :mod:`tasks.data_stages` (prepare_data, filter_prompts, build_model),
:mod:`tasks.train_stages` (sft, ppo_segment, validate) and :mod:`tasks.eval_stage` (evaluate); this module is the
one import of them all (the flow's, the tests', the docs'), with their retry condition
(:func:`tasks.retry.retry_unless_bad_input`, which tests read here).
"""

from __future__ import annotations

from tasks.data_stages import build_model, filter_prompts, prepare_data
from tasks.eval_stage import evaluate
from tasks.retry import retry_unless_bad_input
from tasks.train_stages import ppo_segment, sft, validate

__all__ = ["prepare_data", "filter_prompts", "build_model", "sft", "ppo_segment", "validate", "evaluate",
           "retry_unless_bad_input"]
