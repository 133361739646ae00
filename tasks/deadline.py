"""A stage's time limit (``tasks.<stage>.timeout_seconds`` of the experiment file), enforced where its work runs.

Prefect runs a sync task in a worker thread, where its own ``timeout_seconds`` cannot interrupt a blocking
call (a Ray ``get``, a file read): Prefect warns once per task run and the timeout only fires after the call
returns. So the pipeline does not hand ``timeout_seconds`` to Prefect: each task reads its limit from the flow
context (``ctx["timeouts"]``) and gives the time left to :func:`infra.ray_cluster.run_on_ray`, which waits for
the stage's Ray job at most that long, then cancels it (its worker process is killed) and raises. The stage
fails with :class:`StageTimeoutError` and Prefect retries it as configured.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping


class StageTimeoutError(TimeoutError):
    """A stage ran past its ``timeout_seconds``; the message names the stage, the limit and the key."""


def split_task_options(task_options: Mapping[str, Mapping[str, float]]
                       ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The experiment's ``tasks:`` (``{stage: {retries, retry_delay_seconds, timeout_seconds}}``) split into the
    options Prefect applies (``Task.with_options``) and the time limits the stages enforce themselves.

    Returns:
        ``({stage: options without timeout_seconds}, {stage: timeout_seconds})`` (a stage without a
        ``timeout_seconds`` has no limit and no entry).
    """
    prefect_options = {name: {k: v for k, v in opts.items() if k != "timeout_seconds"}
                       for name, opts in task_options.items()}
    timeouts = {name: float(opts["timeout_seconds"]) for name, opts in task_options.items()
                if opts.get("timeout_seconds") is not None}
    return prefect_options, timeouts


class StageDeadline:
    """The time limit of one attempt of a stage, counted from construction (monotonic clock).

    Args:
        stage: the task's name in the experiment's ``tasks:`` (``sft``, ``ppo_segment``, ...).
        seconds: the limit in seconds; None = no limit.
    """

    def __init__(self, stage: str, seconds: float | None):
        self.stage, self.seconds = stage, seconds
        self.end = None if seconds is None else time.monotonic() + float(seconds)

    @classmethod
    def of(cls, stage: str, ctx: Mapping[str, Any]) -> "StageDeadline":
        """The deadline of ``stage`` from the flow context's ``timeouts`` (``tasks.common.make_context``); a stage
        with no entry there (a task run outside the flow) has no limit."""
        return cls(stage, ctx["timeouts"].get(stage))

    def message(self, cancelled: bool = False) -> str:
        """``stage sft: timed out after 21600 s (the experiment's tasks.sft.timeout_seconds)``, plus ``; its Ray
        job was cancelled`` when ``cancelled``."""
        return (f"stage {self.stage}: timed out after {self.seconds:g} s (the experiment's "
                f"tasks.{self.stage}.timeout_seconds)" + ("; its Ray job was cancelled" if cancelled else ""))

    def left(self) -> float | None:
        """Seconds left (None: no limit).

        Raises:
            StageTimeoutError: none is left.
        """
        if self.end is None:
            return None
        left = self.end - time.monotonic()
        if left <= 0:
            raise StageTimeoutError(self.message())
        return left

    def run_on_ray(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:func:`infra.ray_cluster.run_on_ray` waiting at most the time left; at the deadline the Ray task is
        cancelled (force: its worker process is killed, with the actors and placement groups it made).

        Raises:
            StageTimeoutError: the deadline passed (before the call, or while waiting).
            ray.exceptions.RayTaskError: ``fn`` raised (as ``run_on_ray``).
        """
        import ray

        from infra.ray_cluster import run_on_ray

        try:
            return run_on_ray(fn, *args, timeout_s=self.left(), **kwargs)
        except ray.exceptions.GetTimeoutError as exc:
            raise StageTimeoutError(self.message(cancelled=True)) from exc


__all__ = ["StageDeadline", "StageTimeoutError", "split_task_options"]
