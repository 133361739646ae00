"""torch.profiler traces of chosen training steps (``global_profiler`` + each role's ``profiler`` block, tool torch).

verl semantics, for ``global_profiler.tool: torch``: the driver starts profiling on every worker group at
the start of each step listed in ``global_profiler.steps`` and stops it at the end of that step (with
``global_profiler.profile_continuous_steps: True``, a run of consecutive listed steps is one trace). A worker
records only when its role's block says so — ``<role>.profiler.enable`` and this rank chosen by ``all_ranks``
or ``ranks`` (an empty list with ``all_ranks: False`` means rank 0) — and writes a Chrome trace (open it in
https://ui.perfetto.dev or chrome://tracing) to::

    <save_path>/step_<first step of the trace>/<role>_rank_<rank>.json

and, with ``tool_config.torch.discrete: True``, one trace per stage (each profiled worker call:
``generate_sequences``, ``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor``, ``compute_values``,
``update_critic``, ``compute_rm_score``) instead: ``<role>_<stage>_rank_<rank>.json`` (``<stage>_<i>`` for the
i-th further call of a stage in the step). In a whole-step trace each stage is a ``record_function`` range named
after it. ``contents``, ``schedule`` and ``step_start``/``step_end``: :mod:`rlhf_core.workers.torch_trace`.

``relocate_results: True`` moves each trace, when its step ends, out of the step folder into ``save_path``
itself as ``step_<n>_<file>`` (verl writes every trace flat in ``save_path``, pulling in those written in
sub-folders, so a tool that does not walk sub-folders sees them all). ``finish_hook_cmd`` runs once per worker
after the last profiled step (:func:`~rlhf_core.workers.torch_trace.run_finish_hook`) on the ranks
``finish_hook_all_ranks`` / ``finish_hook_ranks`` choose (neither set: the profiled ranks).

``save_path`` is the block's own (by default ``${global_profiler.save_path}``). Roles and their blocks:
``actor_rollout_ref.actor.profiler``, ``.rollout.profiler`` (by default it follows the actor's) and
``.ref.profiler`` — the actor/rollout/ref worker records when any block of a role it holds asks for it
(:func:`union_profiler_configs`) and names its trace ``actor`` (``ref`` for a reference-only worker) —,
``critic.profiler``, ``reward_model.profiler``; SFT's ``profiler`` (:mod:`rlhf_core.trainer.sft_worker`).
torch.profiler is one per process: when workers share a process, the first to start records the others' calls.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import Any, Callable, Iterator

import torch
from omegaconf import OmegaConf

from rlhf_core.workers import torch_trace
from rlhf_core.workers.fsdp_utils import rank
from rlhf_core.workers.torch_trace import TorchTrace, TraceOptions

logger = logging.getLogger(__name__)
_OPEN: list["WorkerProfiler"] = []  # the profiler whose trace is open in this process (torch allows one)


def union_profiler_configs(blocks: list[Any]) -> Any:
    """One block for a worker holding several roles (verl ``ProfilerConfig.union``): enabled when any is, all
    ranks when any says so, the union of ``ranks`` and ``finish_hook_ranks``, ``relocate_results`` and
    ``finish_hook_all_ranks`` when any says so; ``tool``, ``save_path``, ``tool_config.torch`` and the first set
    ``finish_hook_cmd`` from the blocks in order (the first block's, mostly)."""
    blocks = [b for b in blocks if b is not None]
    if not blocks:
        return None
    ranks = sorted({int(r) for b in blocks for r in (b.ranks or [])})
    hook_ranks = sorted({int(r) for b in blocks for r in (b.finish_hook_ranks or [])})
    cmd = next((b.finish_hook_cmd for b in blocks if b.finish_hook_cmd), None)
    return OmegaConf.create({"tool": blocks[0].tool, "save_path": blocks[0].save_path, "ranks": ranks,
                             "enable": any(bool(b.enable) for b in blocks),
                             "all_ranks": any(bool(b.all_ranks) for b in blocks),
                             "relocate_results": any(bool(b.relocate_results) for b in blocks),
                             "finish_hook_cmd": cmd, "finish_hook_ranks": hook_ranks,
                             "finish_hook_all_ranks": any(bool(b.finish_hook_all_ranks) for b in blocks),
                             "tool_config": {"torch": torch_trace.torch_block(blocks[0].tool_config.torch)}})


def profiles_this_rank(profiler_cfg: Any, rank: int) -> bool:
    """True when ``profiler_cfg`` (a role's ``profiler`` block) asks for torch traces on ``rank``."""
    if profiler_cfg is None or profiler_cfg.tool != "torch" or not profiler_cfg.enable:
        return False
    if profiler_cfg.all_ranks:
        return True
    ranks = list(profiler_cfg.ranks)
    return rank in ranks if ranks else rank == 0


def _hook_this_rank(profiler_cfg: Any, rank: int, profiled: bool) -> bool:
    if profiler_cfg.finish_hook_all_ranks:
        return True
    hook_ranks = [int(r) for r in profiler_cfg.finish_hook_ranks]
    return rank in hook_ranks if hook_ranks else profiled


class WorkerProfiler:
    """One worker's torch.profiler sessions, started and stopped by the driver around profiled steps.

    Args:
        profiler_cfg: the role's ``profiler`` block (reads ``tool``, ``enable``, ``all_ranks``, ``ranks``,
            ``save_path``, ``relocate_results``, ``finish_hook_*`` and ``tool_config.torch``). rank: this worker's
            rank. role: names the trace files (``actor``, ``critic``...). single_window: a schedule with
            ``repeat: 0`` keeps one window per whole trace (PPO: a trace is a step); False: every window until the
            trace ends (SFT: a trace spans ``trainer.profile_interval``, and a training step advances it).

    Raises:
        ValueError: a ``step_start``/``step_end`` that is not a range (when the block enables profiling).
    """

    def __init__(self, profiler_cfg: Any, rank: int, role: str, single_window: bool = True) -> None:
        self.active = profiles_this_rank(profiler_cfg, rank)
        enabled = profiler_cfg is not None and profiler_cfg.tool == "torch" and bool(profiler_cfg.enable)
        self.rank, self.role, self.single_window = rank, role, single_window
        self.save_path = str(profiler_cfg.save_path) if enabled else None
        self.options = (torch_trace.trace_options(profiler_cfg.tool_config.torch) if self.active
                        else TraceOptions())
        self.relocate = bool(profiler_cfg.relocate_results) if self.active else False
        self.hook_cmd = profiler_cfg.finish_hook_cmd if enabled else None
        self.hook_here = enabled and _hook_this_rank(profiler_cfg, rank, self.active)
        self.traces: list[str] = []  # every trace file this worker wrote (after relocation)
        self._trace: TorchTrace | None = None
        self._step: int | None = None
        self._stage_calls: dict[str, int] = {}
        self._files: list[str] = []  # the files written in the open step

    def _path(self, stage: str | None = None) -> str:
        name = self.role
        if stage is not None:
            calls = self._stage_calls.get(stage, 0)
            self._stage_calls[stage] = calls + 1
            name += f"_{stage}" + (f"_{calls}" if calls else "")
        return os.path.join(self.save_path, f"step_{self._step}", f"{name}_rank_{self.rank}.json")

    def _open(self, stage: str | None, options: TraceOptions, whole_step: bool) -> TorchTrace | None:
        """Start the trace of the step (``stage`` None) or of a stage; None when this process records already."""
        if _OPEN:  # a stage inside another (update_actor's own log-prob pass) is in the enclosing trace
            if _OPEN[0] is not self:
                logger.warning("profiler: %s's calls are recorded in %s's trace (one torch.profiler per process)",
                               self.role, _OPEN[0].role)
            return None
        trace = TorchTrace(self._path(stage), options, whole_step)
        trace.start()
        _OPEN.append(self)
        return trace

    def _close(self, trace: TorchTrace) -> list[str]:
        _OPEN.remove(self)
        return trace.stop()

    def start(self, step: int) -> None:
        """Begin profiled step ``step`` (a no-op when this rank is not profiled or a session is already open):
        open the whole-step trace, or, with ``discrete``, wait for the stages."""
        if not self.active or self._step is not None:
            return
        self._step, self._stage_calls, self._files = int(step), {}, []
        if not self.options.discrete:
            self._trace = self._open(None, self.options, whole_step=self.single_window)

    @contextlib.contextmanager
    def stage(self, name: str, scheduled: bool = False) -> Iterator[None]:
        """Around one worker call (a stage): a ``record_function`` range named ``name`` in the whole-step trace,
        or, with ``discrete``, a trace of its own (the ``schedule`` applies only to a ``scheduled`` stage: the
        update, whose mini-batches advance it)."""
        if self._step is None:
            yield
        elif not self.options.discrete:
            with torch.profiler.record_function(name):
                yield
        else:
            options = self.options if scheduled else TraceOptions(self.options.contents)
            trace = self._open(name, options, whole_step=False)
            try:
                with torch.profiler.record_function(name):
                    yield
            finally:
                if trace is not None:
                    self._files += self._close(trace)

    def stop(self, run_hook: bool = True) -> list[str]:
        """End the profiled step: write the open trace, move the step's traces with ``relocate_results``; then,
        when ``run_hook`` (the last profiled step), run ``finish_hook_cmd`` if this rank is chosen. Returns the
        trace files of this step (empty when nothing was recorded). A failing, unstartable or overlong hook is
        a WARNING, never an error (:func:`~rlhf_core.workers.torch_trace.run_finish_hook`).
        """
        files: list[str] = []
        if self._step is not None:
            if self._trace is not None:
                self._files += self._close(self._trace)
            files = [self._relocated(f) for f in self._files] if self.relocate else list(self._files)
            self.traces += files
            self._trace, self._step = None, None
        if run_hook and self.hook_cmd and self.hook_here:
            torch_trace.run_finish_hook(str(self.hook_cmd), self.save_path, "torch", self.rank, self.role,
                                        self.traces)
        return files

    def _relocated(self, path: str) -> str:
        folder, name = os.path.split(path)
        dst = os.path.join(os.path.dirname(folder), f"{os.path.basename(folder)}_{name}")
        if os.path.exists(dst):  # never overwrite a trace (an earlier run's): this one stays where it was written
            logger.warning("profiler: relocate_results: %s exists; %s is left in place", dst, path)
            return path
        os.replace(path, dst)
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only when empty: nothing else is removed
        return dst


def profiled_stage(name: str, scheduled: bool = False) -> Callable:
    """Decorator for a :class:`ProfiledWorker` method that is a stage (:meth:`WorkerProfiler.stage`)."""

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(self, *args: Any, **kwargs: Any) -> Any:
            profiler = getattr(self, "_profiler", None)  # made by the first start_profile: none, nothing to do
            if profiler is None:
                return fn(self, *args, **kwargs)
            with profiler.stage(name, scheduled):
                return fn(self, *args, **kwargs)

        return wrapper

    return decorator


class ProfiledWorker:
    """Mixin giving a worker (with ``self.config``, the full config) ``start_profile(step)`` /
    ``stop_profile(run_hook)``; the class sets ``profiler_role`` (trace file name) and ``profiler_key`` (its
    role's block)."""

    profiler_role = "worker"
    profiler_key = ""
    profiler_single_window = True  # see WorkerProfiler

    def profiler_config(self) -> Any:
        """The role's ``profiler`` block (``profiler_key`` in ``self.config``); None when the config has none."""
        return OmegaConf.select(self.config, self.profiler_key)

    def _worker_profiler(self) -> WorkerProfiler:
        if getattr(self, "_profiler", None) is None:
            self._profiler = WorkerProfiler(self.profiler_config(), rank(), self.profiler_role,
                                            self.profiler_single_window)
        return self._profiler

    def start_profile(self, step: int) -> None:
        self._worker_profiler().start(step)

    def stop_profile(self, run_hook: bool = True) -> list[str]:
        return self._worker_profiler().stop(run_hook)
