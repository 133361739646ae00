"""One torch.profiler Chrome trace, built from a role's ``profiler.tool_config.torch`` block; the finish hook.

What the keys do (verl semantics, ``verl/utils/profiler/torch_profile.py`` and ``profile.py``):

* ``contents`` — what is recorded: CPU activity always (stage labels and operator names are CPU-side events),
  CUDA activity when ``contents`` is empty or lists ``cuda`` (and CUDA is available), ``shapes`` →
  ``record_shapes`` (each operator's ``Input Dims`` in the trace), ``memory`` → ``profile_memory``, ``stack`` →
  ``with_stack``. ``cpu`` alone changes nothing (CPU is always on).
* ``schedule`` — a ``torch.profiler.schedule`` over the update mini-batches: the actor's and critic's update loop
  (:func:`rlhf_core.workers.update_loop.run_update`) calls :func:`mini_batch_done` after each mini-batch, which
  advances the scheduled trace of this process. Enabled when ``schedule.active > 0``: ``skip_first`` mini-batches
  are skipped, then ``repeat`` cycles of ``wait`` idle, ``warmup`` traced-but-dropped and ``active`` recorded
  mini-batches (``repeat: 0`` = one window for a whole-step trace, as verl; every window until the trace ends for
  a discrete update trace and for SFT, whose trace spans ``trainer.profile_interval`` and whose unit is one
  training step). Everything before the first active window (the step's earlier stages) is dropped with it, as in
  verl; a window the update ends inside is still written (a short window, not none), a window it ends right at
  the start of (no mini-batch in it) is not.
  Each window after the first goes to its own file, ``..._part<i>.json``. No ``ProfilerStep#`` rows are written
  (a step here is a mini-batch).
* ``step_start`` / ``step_end`` (verl 0.6's torch keys) — the same mini-batch selection written as a range: the
  mini-batches ``[step_start, step_end)`` of the profiled step (``step_end: null`` = to the end). Used when
  ``schedule.active`` is 0; a schedule with ``active > 0`` takes precedence.

The finish hook (``finish_hook_cmd``) is :func:`run_finish_hook`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

_SCHEDULED: "TorchTrace | None" = None  # the scheduled trace of this process that mini-batches advance
_SCHEDULE_KEYS = ("skip_first", "wait", "warmup", "active", "repeat")  # a schedule block's keys


@dataclass(frozen=True)
class TraceOptions:
    """What a trace records and which update mini-batches it keeps.

    Args:
        contents: the ``contents`` list (``cpu``, ``cuda``, ``memory``, ``shapes``, ``stack``).
        discrete: one trace per stage (per profiled worker call) instead of one per profiled step.
        schedule: ``torch.profiler.schedule`` keyword arguments, or None to record everything.
    """

    contents: tuple[str, ...] = ()
    discrete: bool = False
    schedule: dict[str, int] | None = None


def schedule_kwargs(schedule_cfg: Any, step_start: int = 0, step_end: int | None = None) -> dict[str, int] | None:
    """``torch.profiler.schedule`` kwargs from a ``schedule`` block (``skip_first``, ``wait``, ``warmup``,
    ``active``, ``repeat``; None: the block has none), else from the mini-batch range ``[step_start, step_end)``;
    None = record everything.

    Raises:
        ValueError: ``step_end <= step_start`` or a negative ``step_start``.
    """
    if schedule_cfg is not None and int(schedule_cfg["active"]) > 0:
        return {k: int(schedule_cfg[k]) for k in _SCHEDULE_KEYS}
    if step_start == 0 and step_end is None:
        return None
    if step_start < 0 or (step_end is not None and step_end <= step_start):
        raise ValueError(f"profiler.tool_config.torch: step_start={step_start}, step_end={step_end} is not a "
                         "range of mini-batches (0 <= step_start < step_end)")
    active = sys.maxsize if step_end is None else step_end - step_start
    return {"skip_first": step_start, "wait": 0, "warmup": 0, "active": active, "repeat": 1}


def torch_block(torch_cfg: Any) -> dict[str, Any]:
    """A ``tool_config.torch`` block as a plain dict of one shape for every role: ``contents`` (list of str),
    ``discrete`` (bool), ``schedule`` (its five ints, or None), ``step_start`` (int) and ``step_end`` (int or None).

    Which keys a block has is its schema class's (``OmegaConf.get_type``): the actor's, reference's and critic's
    (``TorchToolConfig``) have a ``schedule`` and verl 0.6's ``step_start``/``step_end``; SFT's
    (``SftTorchToolConfig``) a ``schedule``; the rollout's and the reward model's (``FollowerTorchToolConfig``; no
    update mini-batches) neither: ``schedule`` None and the whole range. A plain mapping is taken as a block this
    function made (``union_profiler_configs`` stores one) and copied.

    Raises:
        TypeError: a block of another schema class.
    """
    from omegaconf import OmegaConf

    from rlhf_core.config.schemas.ppo_common import FollowerTorchToolConfig, TorchToolConfig
    from rlhf_core.config.schemas.sft_engine import SftTorchToolConfig

    kind = OmegaConf.get_type(torch_cfg)
    if kind is dict:  # made here
        schedule = torch_cfg["schedule"]
        return {"contents": [str(c) for c in torch_cfg["contents"]], "discrete": bool(torch_cfg["discrete"]),
                "schedule": None if schedule is None else {k: int(schedule[k]) for k in _SCHEDULE_KEYS},
                "step_start": int(torch_cfg["step_start"]), "step_end": torch_cfg["step_end"]}
    if kind not in (TorchToolConfig, SftTorchToolConfig, FollowerTorchToolConfig):
        raise TypeError(f"profiler tool_config.torch: a block of schema {kind!r} is not a torch profiler block")
    out: dict[str, Any] = {"contents": [str(c) for c in torch_cfg.contents], "discrete": bool(torch_cfg.discrete),
                           "schedule": None, "step_start": 0, "step_end": None}
    if kind in (TorchToolConfig, SftTorchToolConfig):
        out["schedule"] = {k: int(torch_cfg.schedule[k]) for k in _SCHEDULE_KEYS}
    if kind is TorchToolConfig:
        end = torch_cfg.step_end
        out.update(step_start=int(torch_cfg.step_start), step_end=None if end is None else int(end))
    return out


def trace_options(torch_cfg: Any) -> TraceOptions:
    """:class:`TraceOptions` of a ``tool_config.torch`` block (any role's; :func:`torch_block` says which keys
    it has: only roles with update mini-batches have a ``schedule`` and a ``step_start``/``step_end`` range).

    Raises:
        ValueError: as :func:`schedule_kwargs`. TypeError: as :func:`torch_block`.
    """
    block = torch_block(torch_cfg)
    return TraceOptions(contents=tuple(block["contents"]), discrete=block["discrete"],
                        schedule=schedule_kwargs(block["schedule"], block["step_start"], block["step_end"]))


def profile_kwargs(contents: tuple[str, ...]) -> dict[str, Any]:
    """``torch.profiler.profile`` keyword arguments for ``contents`` (see the module docstring)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if (not contents or "cuda" in contents) and torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return {"activities": activities, "record_shapes": "shapes" in contents,
            "profile_memory": "memory" in contents, "with_stack": "stack" in contents}


class TorchTrace:
    """One ``torch.profiler.profile`` session writing Chrome trace(s) to ``path`` (``path_part<i>.json`` for each
    later schedule window).

    Args:
        path: the trace file (``.json``). options: :class:`TraceOptions` (``contents`` and ``schedule`` are read;
            with a schedule, :func:`mini_batch_done` advances this trace while it runs).
    """

    def __init__(self, path: str, options: TraceOptions, whole_step: bool = True) -> None:
        self.path = path
        self.paths: list[str] = []
        schedule = dict(options.schedule) if options.schedule else None
        if schedule and whole_step and schedule["repeat"] == 0:
            schedule["repeat"] = 1  # one window per profiled step unless more are asked for (verl)
        self.scheduled = schedule is not None
        # whether the open window holds recorded work: a whole-step trace's first window holds the stages before
        # the update; a later window (or a discrete update's) only the mini-batches recorded in it
        self._recorded, self._drop = whole_step, False
        kwargs = profile_kwargs(options.contents)
        if schedule:
            with warnings.catch_warnings():  # "won't be using warmup": warmup 0 is the default here, as in verl
                warnings.simplefilter("ignore", UserWarning)
                kwargs["schedule"] = torch.profiler.schedule(**schedule)
        self._prof = torch.profiler.profile(on_trace_ready=self._write, **kwargs)
        if schedule:
            self._prof.record_steps = False  # no ProfilerStep#<n> rows: a step here is a mini-batch

    def _write(self, prof: torch.profiler.profile) -> None:
        if self._drop:  # a window the update ended at its very start: no mini-batch in it
            return
        stem, ext = os.path.splitext(self.path)
        path = self.path if not self.paths else f"{stem}_part{len(self.paths)}{ext}"
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        prof.export_chrome_trace(path)
        self.paths.append(path)
        logger.info("torch profiler trace written to %s", path)

    def start(self) -> None:
        """Start recording; a scheduled trace becomes the one :func:`mini_batch_done` advances."""
        global _SCHEDULED
        self._prof.start()
        if self.scheduled:
            _SCHEDULED = self

    def step(self) -> None:
        """One mini-batch done: advance the schedule."""
        recording = (torch.profiler.ProfilerAction.RECORD, torch.profiler.ProfilerAction.RECORD_AND_SAVE)
        self._recorded = self._recorded or self._prof.current_action in recording
        written = len(self.paths)
        self._prof.step()
        if len(self.paths) > written:  # a window was saved: the next one starts empty
            self._recorded = False

    def stop(self) -> list[str]:
        """Stop and write what is pending (torch also writes a schedule window the update ended inside); returns the
        files this trace wrote."""
        global _SCHEDULED
        if _SCHEDULED is self:
            _SCHEDULED = None
        self._drop = self.scheduled and not self._recorded
        self._prof.stop()
        return list(self.paths)


def mini_batch_done() -> None:
    """Called by the update loop after each mini-batch: advances this process's scheduled trace, if one runs."""
    if _SCHEDULED is not None:
        _SCHEDULED.step()


FINISH_HOOK_TIMEOUT_S = 900.0  # seconds a finish hook may run (verl has no key for it; docs/SEMANTICS.md)


def run_finish_hook(cmd: str, save_path: str, tool: str, rank: int, role: str, traces: list[str],
                    timeout_s: float | None = None) -> bool:
    """Run ``cmd`` in ``/bin/sh`` once, after the last profiled step (verl's ``finish_hook_cmd``), with verl's
    environment: ``VERL_PROFILE_SAVE_PATH``, ``VERL_PROFILE_TOOL``, ``VERL_PROFILE_RANK``, ``VERL_PROFILE_PID``,
    ``VERL_PROFILE_ROLE``; and ours, ``VERL_PROFILE_TRACES``: this worker's trace files, one per line. Traces are
    never touched here.

    A profiler hook never stops or hangs the run: as in verl, a command that cannot be started or exits with a
    non-zero status is a WARNING (naming the command, the rank, the status and its output's tail) and training
    goes on. Ours: the command runs in a session (process group) of its own and is bounded by ``timeout_s``
    seconds (None: :data:`FINISH_HOOK_TIMEOUT_S`, 900 s; verl waits without bound and has no key for it); past
    it the whole group (the shell and whatever it started) is killed with SIGKILL, a WARNING says so, and
    training goes on.

    Returns:
        True when the command exited with status 0 in time, else False.
    """
    limit = FINISH_HOOK_TIMEOUT_S if timeout_s is None else float(timeout_s)
    env = {**os.environ, "VERL_PROFILE_SAVE_PATH": str(save_path), "VERL_PROFILE_TOOL": str(tool),
           "VERL_PROFILE_RANK": str(rank), "VERL_PROFILE_PID": str(os.getpid()), "VERL_PROFILE_ROLE": role,
           "VERL_PROFILE_TRACES": "\n".join(traces)}
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
    except OSError as exc:
        logger.warning("profiler finish_hook_cmd=%r could not be started on rank %d: %s", cmd, rank, exc)
        return False
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        out = _kill_group(proc)
        logger.warning("profiler finish_hook_cmd=%r still ran after %g s on rank %d: killed its process group "
                       "(the traces are kept under %s; training goes on); its output ends: %r", cmd, limit, rank,
                       save_path, out[-2000:])
        return False
    if out:
        logger.info("profiler finish hook (rank %d): %s", rank, out.rstrip())
    if proc.returncode != 0:
        logger.warning("profiler finish_hook_cmd=%r exited with status %d on rank %d (the traces are kept under %s; "
                       "training goes on); its output ends: %r", cmd, proc.returncode, rank, save_path, out[-2000:])
        return False
    return True


def _kill_group(proc: subprocess.Popen) -> str:
    """SIGKILL the process group of ``proc`` (its own session), reap it; the output read so far (best effort)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:  # the group is gone, so the pipe closes; a descendant that left the group could hold it open
        out, _ = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        out = ""
    return out or ""
