"""Rules of ``async_training.mode=one_step_off_policy`` across sections (what that driver cannot run), checked
when the config loads (:func:`rlhf_core.config.validate.ppo_static_errors`), so ``rlhf config check`` and
``rlhf ppo`` refuse them before anything starts. Torch-free."""
from __future__ import annotations

from typing import Any


def one_step_config_errors(config: Any) -> list[str]:
    """What this driver cannot run, one line per key (empty: runnable); read before any worker starts."""
    arr, algo = config.actor_rollout_ref, config.algorithm
    errors = []
    if algo.adv_estimator == "remax":
        errors.append("algorithm.adv_estimator=remax: its greedy baseline rollout runs on the actor's colocated "
                      "engine, which async_training.mode=one_step_off_policy does not have")
    if config.skip.rollout.enable:
        errors.append("skip.rollout.enable=True: replaying dumps per step is not supported "
                      "with async_training.mode=one_step_off_policy")
    if arr.rollout.name != "hf":
        errors.append(f"actor_rollout_ref.rollout.name={arr.rollout.name!r}: the standalone rollout group of "
                      "async_training.mode=one_step_off_policy runs rollout.name=hf only")
    if arr.rollout.mode != "sync" or arr.rollout.multi_turn.enable:
        errors.append("actor_rollout_ref.rollout.mode=async / multi_turn.enable: agent loops are not supported with "
                      "async_training.mode=one_step_off_policy")
    if algo.filter_groups.enable:
        errors.append("algorithm.filter_groups.enable=True: dynamic sampling draws further batches inside a step, "
                      "async_training.mode=one_step_off_policy generates exactly one batch ahead")
    if arr.actor.use_kl_loss and arr.actor.kl_loss_type == "full":
        errors.append("actor_rollout_ref.actor.kl_loss_type=full needs the reference model in the actor's worker; "
                      "async_training.mode=one_step_off_policy keeps the reference in its own group")
    rollout_world = int(config.rollout.nnodes) * int(config.rollout.n_gpus_per_node)
    rows = int(config.data.train_batch_size) * int(arr.rollout.n)
    if rows % rollout_world:
        errors.append(f"data.train_batch_size × actor_rollout_ref.rollout.n = {rows} responses do not split over "
                      f"rollout.nnodes × rollout.n_gpus_per_node = {rollout_world} rollout ranks")
    return errors
