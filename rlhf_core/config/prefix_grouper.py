"""Rules of ``actor_rollout_ref.actor.use_prefix_grouper`` across sections, checked when the config loads
(:func:`rlhf_core.config.validate.ppo_resource_errors`), so ``rlhf config check`` and ``rlhf ppo`` refuse them before
any model loads. Torch-free.

The prefix-grouped forward (``rlhf_core/kernels/prefix_grouper.py``) shares a prompt among the consecutive rows of
one ``uid`` in a micro-batch. verl 0.9 takes it only without ``use_remove_padding``, ``use_dynamic_bsz``, fused
kernels and Ulysses sequence parallelism (``DataParallelPPOActor._forward_micro_batch`` falls back to the plain
forward otherwise, silently); here those settings are refused by name instead (fused kernels and Ulysses are
refused for every run already). A group split across micro-batches, mini-batches or ranks would still be exact
but would run its prompt once per piece: the sizes must keep whole groups of ``rollout.n`` rows together, and the
row order must keep a group's rows consecutive (``actor.shuffle`` permutes rows; ``trainer.balance_batch`` then
moves whole groups, as verl's ``get_group_balanced_partitions`` does).
"""
from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

A = "actor_rollout_ref"


def _get(cfg: Any, path: str) -> Any:
    return OmegaConf.select(cfg, path, default=None)


def _per_rank(cfg: Any, section: str, per_gpu: str, old: str, world: int) -> tuple[str, int | None]:
    """``(key, micro-batch rows per rank)`` of a section: ``*_per_gpu``, or the deprecated global key ÷ world."""
    value = _get(cfg, f"{section}.{per_gpu}")
    if value is None and _get(cfg, f"{section}.{old}") is not None:
        return f"{section}.{old}", int(_get(cfg, f"{section}.{old}")) // max(world, 1)
    return f"{section}.{per_gpu}", value


def prefix_grouper_errors(cfg: Any, world: int, need_ref: bool) -> list[str]:
    """What ``use_prefix_grouper=True`` cannot run with, one line per key (empty when off or runnable).

    Args:
        cfg: the resolved PPO config.
        world: the training world size (``trainer.nnodes × trainer.n_gpus_per_node``).
        need_ref: whether the run has a reference policy (its log-prob pass takes the grouped forward too).
    """
    if not _get(cfg, f"{A}.actor.use_prefix_grouper"):
        return []
    pg, n = f"{A}.actor.use_prefix_grouper=True", _get(cfg, f"{A}.rollout.n")
    errors = []
    if _get(cfg, f"{A}.model.use_remove_padding"):
        errors.append(f"{pg} with {A}.model.use_remove_padding=True: the grouped forward runs the padded layout "
                      "(verl falls back to the plain forward then); set use_remove_padding=False")
    dynamic = [f"{A}.actor.use_dynamic_bsz", f"{A}.rollout.log_prob_use_dynamic_bsz"]
    dynamic += [f"{A}.ref.log_prob_use_dynamic_bsz"] if need_ref else []
    for key in dynamic:
        if _get(cfg, key):
            errors.append(f"{pg} with {key}=True: token-budget micro-batches cut groups anywhere (verl falls back to "
                          "the plain forward then); use a micro-batch size that is a multiple of "
                          f"{A}.rollout.n={n}")
    if _get(cfg, f"{A}.actor.shuffle"):
        errors.append(f"{pg} with {A}.actor.shuffle=True: the mini-batch shuffle permutes rows and separates the "
                      "responses of a prompt; set shuffle=False")
    micro = [(f"{A}.actor", "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size", f"{A}.actor.use_dynamic_bsz"),
             (f"{A}.rollout", "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size",
              f"{A}.rollout.log_prob_use_dynamic_bsz")]
    if need_ref:
        micro.append((f"{A}.ref", "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size",
                      f"{A}.ref.log_prob_use_dynamic_bsz"))
    for section, per_gpu, old, dyn in micro:
        key, rows = _per_rank(cfg, section, per_gpu, old, world)
        if rows and not _get(cfg, dyn) and isinstance(n, int) and n > 0 and rows % n:
            errors.append(f"{pg}: {key} gives {rows} rows per micro-batch, not a multiple of {A}.rollout.n={n}: a "
                          "group's responses must share a micro-batch")
    for key in ("data.train_batch_size", f"{A}.actor.ppo_mini_batch_size"):
        value = _get(cfg, key)
        if isinstance(value, int) and value > 0 and world > 1 and value % world:
            errors.append(f"{pg}: {key}={value} prompts do not split into whole groups over world size {world}: "
                          "each rank must get whole groups of rollout.n responses")
    return errors
