"""torch.profiler traces of chosen training steps (``global_profiler`` + each role's ``profiler`` block, tool torch).

verl 0.6 semantics, for ``global_profiler.tool: torch``: the driver starts profiling on every worker group at
the start of each step listed in ``global_profiler.steps`` and stops it at the end of that step (with
``global_profiler.profile_continuous_steps: True``, a run of consecutive listed steps is one trace). A worker
records only when its role's block says so — ``<role>.profiler.enable`` and this rank chosen by ``all_ranks``
or ``ranks`` (an empty list with ``all_ranks: False`` means rank 0) — and writes a Chrome trace (open it in
https://ui.perfetto.dev or chrome://tracing) to::

    <save_path>/step_<first step of the trace>/<role>_rank_<rank>.json

``save_path`` is the block's own (by default ``${global_profiler.save_path}``). Roles and their blocks:
``actor_rollout_ref.actor.profiler``, ``.rollout.profiler`` (by default it follows the actor's) and
``.ref.profiler`` — the actor/rollout/ref worker records when any block of a role it holds asks for it
(:func:`union_profiler_configs`) and names its trace ``actor`` (``ref`` for a reference-only worker) —,
``critic.profiler``, ``reward_model.profiler``. CPU activity
is always recorded, CUDA activity too when CUDA is available.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch
from omegaconf import OmegaConf

from rlhf_core.workers.fsdp_utils import rank

logger = logging.getLogger(__name__)


def union_profiler_configs(blocks: list[Any]) -> Any:
    """One block for a worker holding several roles (verl ``ProfilerConfig.union``): enabled when any is, all
    ranks when any says so, the union of ``ranks``; ``tool`` and ``save_path`` from the first block."""
    blocks = [b for b in blocks if b is not None]
    if not blocks:
        return None
    ranks = sorted({int(r) for b in blocks for r in (b.ranks or [])})
    return OmegaConf.create({"tool": blocks[0].tool, "save_path": blocks[0].save_path, "ranks": ranks,
                             "enable": any(bool(b.enable) for b in blocks),
                             "all_ranks": any(bool(b.all_ranks) for b in blocks)})


def profiles_this_rank(profiler_cfg: Any, rank: int) -> bool:
    """True when ``profiler_cfg`` (a role's ``profiler`` block) asks for torch traces on ``rank``."""
    if profiler_cfg is None or profiler_cfg.tool != "torch" or not profiler_cfg.enable:
        return False
    if profiler_cfg.all_ranks:
        return True
    ranks = list(profiler_cfg.ranks)
    return rank in ranks if ranks else rank == 0


class WorkerProfiler:
    """One worker's torch.profiler session, started and stopped by the driver around profiled steps.

    Args:
        profiler_cfg: the role's ``profiler`` block (reads ``tool``, ``enable``, ``all_ranks``, ``ranks``,
            ``save_path``). rank: this worker's rank. role: names the trace file (``actor``, ``critic``...).
    """

    def __init__(self, profiler_cfg: Any, rank: int, role: str) -> None:
        self.active = profiles_this_rank(profiler_cfg, rank)
        self.save_path = str(profiler_cfg.save_path) if self.active else None
        self.rank, self.role = rank, role
        self._prof: torch.profiler.profile | None = None
        self._step: int | None = None

    def start(self, step: int) -> None:
        """Begin recording (a no-op when this rank is not profiled or a trace is already open)."""
        if not self.active or self._prof is not None:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=activities, record_shapes=True)
        self._prof.start()
        self._step = int(step)

    def stop(self) -> str | None:
        """Stop recording and write the Chrome trace; returns its path (None when nothing was recorded)."""
        if self._prof is None:
            return None
        self._prof.stop()
        out_dir = os.path.join(self.save_path, f"step_{self._step}")
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"{self.role}_rank_{self.rank}.json")
        self._prof.export_chrome_trace(path)
        logger.info("torch profiler trace written to %s", path)
        self._prof, self._step = None, None
        return path


class ProfiledWorker:
    """Mixin giving a worker (with ``self.config``, the full config) ``start_profile(step)`` / ``stop_profile()``;
    the class sets ``profiler_role`` (trace file name) and ``profiler_key`` (its role's block)."""

    profiler_role = "worker"
    profiler_key = ""

    def profiler_config(self) -> Any:
        """The role's ``profiler`` block (``profiler_key`` in ``self.config``); None when the config has none."""
        return OmegaConf.select(self.config, self.profiler_key)

    def _worker_profiler(self) -> WorkerProfiler:
        if getattr(self, "_profiler", None) is None:
            self._profiler = WorkerProfiler(self.profiler_config(), rank(), self.profiler_role)
        return self._profiler

    def start_profile(self, step: int) -> None:
        self._worker_profiler().start(step)

    def stop_profile(self) -> str | None:
        return self._worker_profiler().stop()
