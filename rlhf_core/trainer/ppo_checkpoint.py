"""Checkpoint save and resume of the PPO driver (``RayPPOTrainer.save_checkpoint`` / ``_load_checkpoint``).

Layout ``<default_local_dir>/global_step_N/{actor,critic,data.pt}`` (verl's), retention and the tracker file are
``rlhf_core.trainer.checkpoint_manager``'s; this module is the glue between the trainer's worker groups,
dataloader and KL controller and that manager.

Exact resume (docs/RESUME.md): ``trainer_state.pt`` also holds the driver's global RNG states (python, numpy,
torch CPU), which reward functions, samplers or datasets on the driver may draw from; a fresh run seeds them from
the train dataloader's seed (``data.seed``), a resumed run restores them. The data position is the dataloader's
state in ``data.pt``; without that file it is derived from the global step.

Before any worker starts, :func:`prepare_resume` locks ``default_local_dir`` for this run
(:mod:`rlhf_core.trainer.checkpoint_lock`) and picks a complete checkpoint to resume from
(:meth:`~rlhf_core.trainer.checkpoint_manager.CheckpointManager.resolve_resume`), so a second run on the same
folder, or an incomplete checkpoint, is refused before a model loads.
"""
from __future__ import annotations

import logging
import os
import re
from contextlib import contextmanager
from typing import Any, Iterator

from rlhf_core.config.validate import use_critic
from rlhf_core.trainer.checkpoint_manager import parse_global_step
from rlhf_core.trainer.metrics_file import prepare_metrics_file
from rlhf_core.workers.checkpoint import rng_state, seed_all, set_rng_state

logger = logging.getLogger(__name__)
_EXTRA_RANK0 = re.compile(r"^extra_state_world_size_(\d+)_rank_0\.pt$")


@contextmanager
def driver_rng_fork() -> Iterator[None]:
    """Run the block with the driver's global RNGs (python, numpy, torch CPU) restored afterwards.

    ``val_before_train`` runs in it: a resumed run validates again at its first step, and the reward functions it
    calls must not shift the RNG stream the training steps draw from."""
    state = rng_state(cuda=False)
    try:
        yield
    finally:
        set_rng_state(state)


def async_save(trainer: Any) -> bool:
    """Whether ``actor_rollout_ref.actor.checkpoint.async_save`` (or the critic's, with a critic) is on."""
    actor_async = bool(trainer.config.actor_rollout_ref.actor.checkpoint.async_save)
    return actor_async or (trainer.use_critic and bool(trainer.config.critic.checkpoint.async_save))


def save_ppo_checkpoint(trainer: Any) -> str:
    """[save_checkpoint] ``global_step_N/{actor,critic,data.pt}`` then the tracker; applies retention; then the
    ``trainer.checkpoint_callback_class`` hook (``trainer.checkpoint_callback``). Returns the checkpoint folder (also
    kept as ``trainer.last_checkpoint_dir``)."""
    step = trainer.global_steps
    fns = {"actor": lambda p: trainer.actor_wg.execute_all("save_checkpoint", p, None, step)}
    if trainer.use_critic:
        fns["critic"] = lambda p: trainer.wgs["critic"].execute_all("save_checkpoint", p, None, step)
    trainer_state = {"driver_rng": rng_state(cuda=False)}
    if trainer.kl_ctrl is not None:
        trainer_state["kl_ctrl_value"] = trainer.kl_ctrl.value
    waits = None
    if async_save(trainer):  # checkpoint.async_save: the tracker follows once every worker's files are written
        waits = [lambda wg=wg: wg.execute_all("wait_checkpoint")
                 for wg in [trainer.actor_wg] + ([trainer.wgs["critic"]] if trainer.use_critic else [])]
    trainer.last_checkpoint_dir = trainer.checkpoints.save(step, fns, trainer.loader_state(),
                                                           trainer_state, wait_fns=waits)
    if trainer.checkpoint_callback is not None:  # trainer.checkpoint_callback_class, after the save completed
        trainer.checkpoint_callback.on_save(trainer=trainer, global_step=step,
                                            checkpoint_dir=trainer.last_checkpoint_dir, async_save=waits is not None)
    return trainer.last_checkpoint_dir


def saved_world_size(component_dir: str) -> int | None:
    """The world size a worker checkpoint (``global_step_N/actor``) was saved with, from its
    ``extra_state_world_size_<W>_rank_0.pt``; ``None`` without extra state."""
    for name in sorted(os.listdir(component_dir)) if os.path.isdir(component_dir) else []:
        match = _EXTRA_RANK0.match(name)
        if match:
            return int(match.group(1))
    return None


def note_elastic_resume(component_dir: str, world_size: int) -> bool:
    """Log (warning) and return True when ``component_dir`` was saved with another world size than ``world_size``."""
    saved = saved_world_size(component_dir)
    if saved is None or saved == world_size:
        return False
    logger.warning("elastic resume: %s was saved with %d ranks and resumes with %d: model and optimizer are resharded "
                   "by DCP, the data position continues from the checkpoint, each rank's RNG is re-derived from the "
                   "seed and the global step; the run is not bit-identical to one that kept %d ranks",
                   component_dir, saved, world_size, saved)
    return True


def resume_components(config: Any) -> tuple[str, ...]:
    """The component folders a PPO run with ``config`` loads: ``("actor",)``, plus ``"critic"`` with a critic."""
    return ("actor", "critic") if use_critic(config) else ("actor",)


def prepare_resume(trainer: Any) -> str | None:
    """Lock ``trainer.default_local_dir`` for this run and return the complete checkpoint to resume from (or
    None): called before any worker starts. When the trainer's tracker is not built yet, its metrics file is made
    ready for this start (:func:`rlhf_core.trainer.metrics_file.prepare_metrics_file`: resumed at step N, the lines of
    steps after N go; from scratch, an earlier run's file is moved aside).

    Raises:
        CheckpointError: another live run holds the folder (naming its PID and host), or the checkpoint to resume
            from is incomplete (naming the missing files).
        ValueError: a bad ``resume_mode`` / ``resume_from_path``.
    """
    trainer.checkpoints.lock.acquire()
    t = trainer.config.trainer
    path = trainer.checkpoints.resolve_resume(t.resume_mode, t.resume_from_path, resume_components(trainer.config))
    if getattr(trainer, "tracker", None) is None:  # a tracker given to the trainer has its file open already
        prepare_metrics_file(trainer.config, None if path is None else parse_global_step(path), bool(t.val_only))
    return path


def load_ppo_checkpoint(trainer: Any, path: str | None) -> None:
    """Resume from ``path`` (:func:`prepare_resume`'s choice; None: a fresh run): worker states, dataloader
    position, ``global_steps``, KL coefficient."""
    if path is None:
        seed = int(trainer.train_dataloader.seed)
        seed_all(seed)
        logger.info("training from scratch; driver RNGs (python, numpy, torch) seeded with %d", seed)
        return
    trainer.global_steps = parse_global_step(path)
    logger.info("resuming from %s (global step %d)", path, trainer.global_steps)
    note_elastic_resume(f"{path}/actor", int(trainer.actor_wg.world_size))
    trainer.actor_wg.execute_all("load_checkpoint", f"{path}/actor")
    if trainer.use_critic:
        trainer.wgs["critic"].execute_all("load_checkpoint", f"{path}/critic")
    state = trainer.checkpoints.load_dataloader_state(path)
    loader = trainer.train_dataloader
    if state is not None:
        loader.load_state_dict(state)
    else:  # no data.pt: the position follows from the global step (every epoch has len(loader) steps)
        if trainer.config.algorithm.filter_groups.enable:
            raise ValueError(f"{path} has no data.pt: with algorithm.filter_groups.enable a step uses a varying "
                             f"number of batches, so the data position cannot be derived from the global step")
        loader.epoch, loader.batches_done = divmod(trainer.global_steps, len(loader))
        logger.warning("%s has no data.pt: data position derived from global step %d (epoch %d, batch %d)",
                       path, trainer.global_steps, loader.epoch, loader.batches_done)
    trainer_state = trainer.checkpoints.load_trainer_state(path) or {}
    if "driver_rng" in trainer_state:
        set_rng_state(trainer_state["driver_rng"])
    if trainer.kl_ctrl is not None and "kl_ctrl_value" in trainer_state:
        trainer.kl_ctrl.value = float(trainer_state["kl_ctrl_value"])
    trainer.last_checkpoint_dir = path
    trainer.checkpoints.after_load(path)
