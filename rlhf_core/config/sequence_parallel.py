"""verl's Ulysses sequence-parallel rules, checked when a PPO config loads (``validate.ppo_resource_errors``)."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

A = "actor_rollout_ref"
_SP_ROLES = ((f"{A}.actor", "fsdp_config", f"{A}.model.use_remove_padding", "actor"),
             (f"{A}.ref", "fsdp_config", f"{A}.model.use_remove_padding", "ref"),
             ("critic", "fsdp", "critic.model.use_remove_padding", "critic"))


def sequence_parallel_errors(cfg: DictConfig, world: int, critic: bool, ref: bool) -> list[str]:
    """verl's Ulysses rules for each role in use with ``ulysses_sequence_parallel_size`` (or its fsdp copy) above 1:
    it divides the world size and ``use_remove_padding`` is on (the sequence is split as one packed row). The head
    counts are checked against the model when the workers load it (``workers/ulysses.py``). ``critic`` / ``ref``:
    whether the run builds that role (``validate.use_critic`` / ``validate.need_ref``)."""
    errors = []
    for section, fsdp, rmpad_key, role in _SP_ROLES:
        if (role == "critic" and not critic) or (role == "ref" and not ref):
            continue
        for key in (f"{section}.ulysses_sequence_parallel_size", f"{section}.{fsdp}.ulysses_sequence_parallel_size"):
            size = OmegaConf.select(cfg, key)
            if not isinstance(size, int) or size <= 1:
                continue
            if world % size:
                errors.append(f"{key}={size} does not divide world size {world} "
                              "(trainer.nnodes x trainer.n_gpus_per_node).")
            if not OmegaConf.select(cfg, rmpad_key):
                errors.append(f"{key}={size} needs {rmpad_key}=True (Ulysses splits the packed sequence).")
    return errors
