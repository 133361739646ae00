"""Rules of ``async_training.mode=one_step_off_policy`` / ``fully_async`` across sections (what those drivers cannot
run), checked when the config loads (:func:`rlhf_core.config.validate.ppo_static_errors`), so ``rlhf config check`` and
``rlhf ppo`` refuse them before anything starts. Torch-free."""
from __future__ import annotations

import warnings
from typing import Any

from omegaconf import OmegaConf


def one_step_config_errors(config: Any, mode: str = "one_step_off_policy") -> list[str]:
    """What the one-step driver (and the fully async one, which shares its rollout group: ``mode``) cannot run,
    one line per key (empty: runnable); read before any worker starts."""
    arr, algo = config.actor_rollout_ref, config.algorithm
    errors = []
    if algo.adv_estimator == "remax":
        errors.append("algorithm.adv_estimator=remax: its greedy baseline rollout runs on the actor's colocated "
                      f"engine, which async_training.mode={mode} does not have")
    if config.skip.rollout.enable:
        errors.append("skip.rollout.enable=True: replaying dumps per step is not supported "
                      f"with async_training.mode={mode}")
    if arr.rollout.name != "hf":
        errors.append(f"actor_rollout_ref.rollout.name={arr.rollout.name!r}: the standalone rollout group of "
                      f"async_training.mode={mode} runs rollout.name=hf only")
    if algo.filter_groups.enable:
        errors.append("algorithm.filter_groups.enable=True: dynamic sampling draws further batches inside a step, "
                      f"async_training.mode={mode} generates ahead of the step")
    if arr.actor.use_kl_loss and arr.actor.kl_loss_type == "full":
        errors.append("actor_rollout_ref.actor.kl_loss_type=full needs the reference model in the actor's worker; "
                      f"async_training.mode={mode} keeps the reference in its own group")
    rollout_world = int(config.rollout.nnodes) * int(config.rollout.n_gpus_per_node)
    rows = int(config.data.train_batch_size) * int(arr.rollout.n)
    if rows % rollout_world:
        errors.append(f"data.train_batch_size × actor_rollout_ref.rollout.n = {rows} responses do not split over "
                      f"rollout.nnodes × rollout.n_gpus_per_node = {rollout_world} rollout ranks")
    return errors


def fully_async_only_errors(config: Any) -> list[str]:
    """Keys read by the fully async driver alone (``async_training.use_trainer_do_validate``,
    ``skip.async_rollout.enable``) set under another ``async_training.mode``, one line each (verl ignores them there;
    here they would do nothing, so they are refused)."""
    mode = config.async_training.mode
    if mode == "fully_async":
        return []
    errors = []  # OmegaConf.select: a check, not a read (rlhf_core/config/reads.py; the fully async driver reads them)
    if OmegaConf.select(config, "async_training.use_trainer_do_validate") is True:
        errors.append(f"async_training.use_trainer_do_validate=True moves the fully asynchronous trainer's validation "
                      f"from its rollout group to its actor group, but async_training.mode={mode}: set "
                      f"async_training.mode=fully_async or leave it False.")
    if OmegaConf.select(config, "skip.async_rollout.enable") is True:
        errors.append(f"skip.async_rollout.enable=True dumps/replays the fully asynchronous rollouter's prompts, but "
                      f"async_training.mode={mode}: set async_training.mode=fully_async, or use skip.rollout.")
    return errors


class FullyAsyncBatchNotice(UserWarning):
    """``data.train_batch_size`` unset (0 or null) in a fully async run was read as the trainer's step size."""


def derive_fully_async_batch(cfg: Any) -> None:
    """verl 0.9's fully async scripts set ``data.train_batch_size=0`` (its rollouter draws prompts one by one and
    ignores the key). Here the rollouter draws loader batches of ``data.train_batch_size`` prompts, one trainer
    step each, so with ``async_training.mode=fully_async`` a value of 0 or null is set, before interpolations are
    resolved (``data.gen_batch_size`` follows it), to ``actor_rollout_ref.actor.ppo_mini_batch_size ×
    async_training.require_batches``, with one :class:`FullyAsyncBatchNotice`. ``cfg``: the unresolved
    ``ppo_trainer`` DictConfig, changed in place; other modes and positive values are left alone."""
    if cfg.async_training.mode != "fully_async":
        return
    tbs = cfg.data.train_batch_size
    if tbs is not None and int(tbs) > 0:
        return
    mini, batches = cfg.actor_rollout_ref.actor.ppo_mini_batch_size, cfg.async_training.require_batches
    if not (isinstance(mini, int) and isinstance(batches, int)) or mini < 1 or batches < 1:
        return  # the schema and fully_async_config_errors name those keys
    cfg.data.train_batch_size = mini * batches
    warnings.warn(FullyAsyncBatchNotice(
        f"data.train_batch_size={tbs} with async_training.mode=fully_async (verl ignores it there) is read as "
        f"actor_rollout_ref.actor.ppo_mini_batch_size × async_training.require_batches = {mini} × {batches} = "
        f"{mini * batches}: the prompts the rollouter draws per trainer step"), stacklevel=3)


def fully_async_config_errors(config: Any) -> list[str]:
    """What the fully async driver (``rlhf_core.trainer.fully_async``) cannot run: the one-step driver's limits
    (the same rollout group) and its own, one line per key (empty: runnable); read before any worker starts."""
    at, actor = config.async_training, config.actor_rollout_ref.actor
    errors = one_step_config_errors(config, "fully_async")
    if at.staleness_threshold < 0:
        errors.append(f"async_training.staleness_threshold={at.staleness_threshold} must be >= 0 (verl asserts it)")
    for name in ("trigger_parameter_sync_step", "require_batches", "concurrent_samples_per_replica"):
        if at[name] < 1:
            errors.append(f"async_training.{name}={at[name]} must be >= 1")
    for section in ("sampler", "datagen"):
        field = "class_path" if section == "sampler" else "path"
        if config.data[section][field] is not None:
            errors.append(f"data.{section}.{field}={config.data[section][field]}: the rollouter thread draws from the "
                          f"data loader while the trainer updates the {section} after each step; that is not "
                          f"synchronised here: unset it with async_training.mode=fully_async")
    required = int(actor.ppo_mini_batch_size) * int(at.require_batches)
    if int(config.rollout.total_rollout_steps) < required:
        errors.append(f"rollout.total_rollout_steps={config.rollout.total_rollout_steps} samples is fewer than one "
                      f"trainer step takes (ppo_mini_batch_size × require_batches = {required}): nothing would train")
    if int(config.data.train_batch_size) != required:
        errors.append(f"data.train_batch_size={config.data.train_batch_size}: with async_training.mode=fully_async "
                      f"a trainer step is one loader batch: the trainer takes "
                      f"actor_rollout_ref.actor.ppo_mini_batch_size × async_training.require_batches = "
                      f"{actor.ppo_mini_batch_size} × {at.require_batches} = {required} prompts per step; set "
                      f"data.train_batch_size={required}")
    return errors
