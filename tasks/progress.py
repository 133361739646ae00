"""PPO progress while a segment runs: a Prefect progress artifact and one line per step.

The core's ``file`` metrics sink appends every step's metrics to ``RLHF_METRICS_FILE``;
:class:`StepProgress` reads that file while the segment runs on Ray (``run_on_ray``'s
``on_poll``), logs one short line per new step on the task run's logger (``tasks.runlog.log_line``; the
full metrics go to MLflow) and moves the flow run's progress artifact to ``step / total_steps``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from infra.run_folders import read_jsonl
from tasks.runlog import log_line

logger = logging.getLogger(__name__)
SCORE_KEY = "critic/score/mean"
LENGTH_KEY = "response_length/mean"
STEP_SECONDS_KEY = "timing_s/step"


def create_ppo_progress(total_steps: int) -> str | None:
    """A progress artifact (key ``ppo-progress``) at 0 % for this flow run; its id, or None
    outside a Prefect run context."""
    try:
        return str(create_progress_artifact(0.0, key="ppo-progress",
                                            description=f"PPO step 0 of {total_steps}"))
    except Exception as exc:  # noqa: BLE001 - no Prefect run context (a task called as .fn)
        logger.debug("no progress artifact: %s", exc)
        return None


def step_line(step: int, total: int, metrics: dict[str, float], budget_s: float | None = None,
              elapsed_s: float = 0.0) -> str:
    """``ppo step 3/20: score 0.412, response length 57.3, 4.1 s`` (missing figures left out). Under a wall-clock
    budget (``budget_s``, ``trainer.total_training_seconds``) the step count is not the goal, the seconds are:
    ``ppo: 32 steps, 210/480 s: score ...`` with ``elapsed_s`` the training seconds spent (whole seconds)."""
    parts = [f"ppo step {step}/{total}:" if budget_s is None else
             f"ppo: {step} steps, {elapsed_s:.0f}/{float(budget_s):.0f} s:"]
    if SCORE_KEY in metrics:
        parts.append(f"score {metrics[SCORE_KEY]:.3f},")
    if LENGTH_KEY in metrics:
        parts.append(f"response length {metrics[LENGTH_KEY]:.1f},")
    if STEP_SECONDS_KEY in metrics:
        parts.append(f"{metrics[STEP_SECONDS_KEY]:.1f} s")
    return " ".join(parts).rstrip(",")


class StepProgress:
    """Follows a metrics jsonl file; see the module docstring.

    Args:
        metrics_file: the segment's ``RLHF_METRICS_FILE``.
        total_steps: the run's ``trainer.total_training_steps`` (100 % at that step).
        artifact_id: the progress artifact to update (None: print only).
        budget_s: ``trainer.total_training_seconds`` (None: no budget). With a budget, lines and the artifact count
            seconds: the training seconds spent are the sum of the ``timing_s/step`` of the steps seen (the
            trainer's budget clock also starts at the first step of the segment), and 100 % is the budget.
    """

    def __init__(self, metrics_file: str | Path, total_steps: int, artifact_id: str | None,
                 budget_s: float | None = None):
        self.metrics_file = Path(metrics_file)
        self.total = int(total_steps)
        self.artifact_id = artifact_id
        self.budget_s = None if budget_s is None else float(budget_s)
        self.elapsed_s = 0.0
        self.seen: set[int] = set()

    def _line(self, step: int, metrics: dict[str, float]) -> str:
        """The step's line (:func:`step_line`), after adding its seconds to :attr:`elapsed_s`."""
        self.elapsed_s += float(metrics.get(STEP_SECONDS_KEY, 0.0))
        return step_line(step, self.total, metrics, self.budget_s, self.elapsed_s)

    def steps(self) -> dict[int, dict[str, float]]:
        """``{step: {metric: value}}`` logged so far (long rows of the core's file sink)."""
        out: dict[int, dict[str, float]] = {}
        for row in read_jsonl(self.metrics_file):
            if "step" in row and "name" in row:
                out.setdefault(int(row["step"]), {})[str(row["name"])] = row["value"]
        return out

    def poll(self) -> None:
        """Log and publish the steps that are complete (a step is complete once a later one
        started, or once it has its ``timing_s/step``)."""
        steps = self.steps()
        for step in sorted(steps):
            done = STEP_SECONDS_KEY in steps[step] or any(s > step for s in steps)
            if step in self.seen or not done:
                continue
            self.seen.add(step)
            log_line(self._line(step, steps[step]))
            self._publish(step, steps[step])

    def finish(self) -> None:
        """Publish every remaining step (the segment has returned)."""
        steps = self.steps()
        for step in sorted(set(steps) - self.seen):
            self.seen.add(step)
            log_line(self._line(step, steps[step]))
            self._publish(step, steps[step])

    def _publish(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.artifact_id:
            return
        score = f", {SCORE_KEY} {metrics[SCORE_KEY]:.4f}" if SCORE_KEY in metrics else ""
        if self.budget_s is None:
            percent, what = 100.0 * step / max(self.total, 1), f"PPO step {step} of {self.total}"
        else:
            percent = 100.0 * self.elapsed_s / max(self.budget_s, 1e-9)
            what = f"PPO: {step} steps, {self.elapsed_s:.0f} of {self.budget_s:.0f} s"
        try:
            update_progress_artifact(self.artifact_id, min(100.0, percent), description=what + score)
        except Exception as exc:  # noqa: BLE001 - progress display must never fail training
            logger.warning("progress artifact not updated: %s", exc)
