"""Checkpoint save and resume of the PPO driver (``RayPPOTrainer.save_checkpoint`` / ``_load_checkpoint``).

Layout ``<default_local_dir>/global_step_N/{actor,critic,data.pt}`` (verl's), retention and the tracker file are
``rlhf_core.trainer.checkpoint_manager``'s; this module is the glue between the trainer's worker groups,
dataloader and KL controller and that manager.
"""
from __future__ import annotations

import logging
from typing import Any

from rlhf_core.trainer.checkpoint_manager import parse_global_step

logger = logging.getLogger(__name__)


def async_save(trainer: Any) -> bool:
    """Whether ``actor_rollout_ref.actor.checkpoint.async_save`` (or the critic's, with a critic) is on."""
    actor_async = bool(trainer.config.actor_rollout_ref.actor.checkpoint.async_save)
    return actor_async or (trainer.use_critic and bool(trainer.config.critic.checkpoint.async_save))


def save_ppo_checkpoint(trainer: Any) -> str:
    """[save_checkpoint] ``global_step_N/{actor,critic,data.pt}`` then the tracker; applies retention. Returns the
    checkpoint folder (also kept as ``trainer.last_checkpoint_dir``)."""
    step = trainer.global_steps
    fns = {"actor": lambda p: trainer.actor_wg.execute_all("save_checkpoint", p, None, step)}
    if trainer.use_critic:
        fns["critic"] = lambda p: trainer.wgs["critic"].execute_all("save_checkpoint", p, None, step)
    trainer_state = {"kl_ctrl_value": trainer.kl_ctrl.value} if trainer.kl_ctrl is not None else None
    waits = None
    if async_save(trainer):  # checkpoint.async_save: the tracker follows once every worker's files are written
        waits = [lambda wg=wg: wg.execute_all("wait_checkpoint")
                 for wg in [trainer.actor_wg] + ([trainer.wgs["critic"]] if trainer.use_critic else [])]
    trainer.last_checkpoint_dir = trainer.checkpoints.save(step, fns, trainer.train_dataloader.state_dict(),
                                                           trainer_state, wait_fns=waits)
    return trainer.last_checkpoint_dir


def load_ppo_checkpoint(trainer: Any) -> None:
    """Resume per ``trainer.resume_mode``: worker states, dataloader position, ``global_steps``, KL coefficient."""
    t = trainer.config.trainer
    path = trainer.checkpoints.resolve_resume(t.resume_mode, t.resume_from_path)
    if path is None:
        logger.info("training from scratch")
        return
    trainer.global_steps = parse_global_step(path)
    logger.info("resuming from %s (global step %d)", path, trainer.global_steps)
    trainer.actor_wg.execute_all("load_checkpoint", f"{path}/actor")
    if trainer.use_critic:
        trainer.wgs["critic"].execute_all("load_checkpoint", f"{path}/critic")
    state = trainer.checkpoints.load_dataloader_state(path)
    if state is not None:
        trainer.train_dataloader.load_state_dict(state)
    trainer_state = trainer.checkpoints.load_trainer_state(path) or {}
    if trainer.kl_ctrl is not None and "kl_ctrl_value" in trainer_state:
        trainer.kl_ctrl.value = float(trainer_state["kl_ctrl_value"])
    trainer.last_checkpoint_dir = path
    trainer.checkpoints.after_load(path)
