"""Driver side of ``global_profiler`` (verl ``RayPPOTrainer._start_profiling`` / ``_stop_profiling``).

With ``global_profiler.tool: torch`` and ``global_profiler.steps`` a list of global steps, every worker group is
told ``start_profile(step)`` before each listed step and ``stop_profile()`` after it; each worker records only
when its role's ``profiler`` block enables it (:mod:`rlhf_core.workers.profiler`). With
``global_profiler.profile_continuous_steps: True`` a run of consecutive listed steps is one trace: start before
its first step, stop after its last (or after the run's last step, when training stops inside the run).
The stop after the last listed step (or at the run's last step) tells the workers to run their
``finish_hook_cmd`` (verl runs it once, after the last profiled step).
Other tools (nsys, npu, torch_memory) are refused by the config schema before anything starts.
"""
from __future__ import annotations

from typing import Any


class StepProfiler:
    """Decides, per global step, when to start and stop the worker groups' profilers.

    Args:
        global_profiler: the ``global_profiler`` config block (reads ``tool``, ``steps``,
            ``profile_continuous_steps``). wgs: ``{name: worker group}`` (anything with ``execute_all``).
    """

    def __init__(self, global_profiler: Any, wgs: dict[str, Any]) -> None:
        steps = global_profiler.steps if global_profiler.tool == "torch" else None
        self.steps = {int(s) for s in (steps or [])}
        self.continuous = bool(global_profiler.profile_continuous_steps)
        self.wgs = wgs
        self.running = False
        self.hook_due = False  # traces written since the last finish hook

    def begin(self, step: int) -> None:
        """Before global step ``step``: start the profilers when it is listed (and not already running)."""
        if step in self.steps and not self.running:
            for wg in self.wgs.values():
                wg.execute_all("start_profile", step)
            self.running = True

    def end(self, step: int, last: bool = False) -> None:
        """After global step ``step``: stop (writing the traces) unless a continuous run goes on to ``step + 1``
        and ``step`` is not the ``last`` step of training. The stop after the last listed step, or the ``last``
        step of training when a listed step was left for later, also runs the workers' finish hooks."""
        if not self.running:
            if last and self.hook_due:  # the run ends before a later listed step: the hook runs now
                for wg in self.wgs.values():
                    wg.execute_all("stop_profile", True)
                self.hook_due = False
            return
        if self.continuous and step + 1 in self.steps and not last:
            return
        final = last or not any(s > step for s in self.steps)
        for wg in self.wgs.values():
            wg.execute_all("stop_profile", final)
        self.running, self.hook_due = False, not final
