"""Rules of ``actor_rollout_ref.actor.use_prefix_grouper`` across sections, checked when the config loads
(:func:`rlhf_core.config.validate.ppo_resource_errors`), so ``rlhf config check`` and ``rlhf ppo`` refuse them before
any model loads. Torch-free.

The prefix-grouped forward (``rlhf_core/kernels/prefix_grouper.py``) groups the rows of one ``uid`` wherever they
sit in a micro-batch and returns them in the micro-batch's order, so a group cut over micro-batches, mini-batches or
ranks is still exact (two smaller groups, each running its prompt once): dynamic batch sizes (verl's own example,
``examples/prefix_grouper/run_qwen3_8b_fsdp.sh``, sets all three), ``actor.shuffle``, micro-batch sizes that are not
a multiple of ``rollout.n`` and batch sizes that do not split into whole groups per rank are accepted; they only
lower the saving. The token-budget micro-batches avoid cutting a ``uid`` run where the budget allows
(``workers/batching.py``) and ``trainer.balance_batch`` moves whole groups where they fill the ranks' equal shares
(``trainer/driver_utils.py``; verl raises instead).

Refused: ``model.use_remove_padding``, because the grouped forward runs the padded layout and a packed (varlen)
grouped forward does not exist here (verl runs the plain forward then, silently: its legacy ``dp_actor`` fell back
to it, and verl 0.9.0 reads the key only in the trainer's ``balance_batch``); and Ulysses sequence parallelism
(``ulysses_sequence_parallel_size`` > 1 for the actor, or for the reference when the run builds one), which splits
the packed forward only (``rlhf_core/workers/ulysses.py``), so a grouped forward would run whole on every rank of
the SP group. Fused kernels are refused for every run already.
"""
from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from .sequence_parallel import section_sp_size

A = "actor_rollout_ref"


def _get(cfg: Any, path: str) -> Any:
    return OmegaConf.select(cfg, path, default=None)


def prefix_grouper_errors(cfg: Any, ref: bool) -> list[str]:
    """What ``use_prefix_grouper=True`` cannot run with in the resolved PPO config ``cfg``, one line per key (empty
    when off or runnable). ``ref``: whether the run builds the reference (``validate.need_ref``): it runs the
    actor's forward path, so its Ulysses size counts too."""
    if not _get(cfg, f"{A}.actor.use_prefix_grouper"):
        return []
    pg = f"{A}.actor.use_prefix_grouper=True"
    errors = []
    if _get(cfg, f"{A}.model.use_remove_padding"):
        errors.append(f"{pg} with {A}.model.use_remove_padding=True: the grouped forward runs the padded layout, and "
                      "a packed grouped forward does not exist here (verl runs the plain forward then); set "
                      "use_remove_padding=False")
    for section in (f"{A}.actor", f"{A}.ref")[:2 if ref else 1]:
        try:
            sp = section_sp_size(cfg, section, "fsdp_config")
        except ValueError:  # the two size keys disagree: sequence_parallel_errors names them
            continue
        if sp > 1:
            errors.append(f"{pg} with {section}.ulysses_sequence_parallel_size={sp} (or its fsdp_config copy): the "
                          "grouped forward is not split over the SP group; set one of them off")
    return errors
