"""verl's Ulysses sequence-parallel rules, checked when a PPO config loads (``validate.ppo_resource_errors``), and
the size rule the workers build their groups with (:func:`role_sp_size`). Torch-free."""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

A = "actor_rollout_ref"
_SP_ROLES = ((f"{A}.actor", "fsdp_config", f"{A}.model.use_remove_padding", "actor"),
             (f"{A}.ref", "fsdp_config", f"{A}.model.use_remove_padding", "ref"),
             ("critic", "fsdp", "critic.model.use_remove_padding", "critic"))


def role_sp_size(role_cfg: Any, fsdp_key: str, role_key: str) -> int:
    """A role's Ulysses size: ``<role>.ulysses_sequence_parallel_size`` (verl's legacy workers read it) when above
    1, else its ``<role>.<fsdp_key>.ulysses_sequence_parallel_size`` copy (verl 0.9's engine reads that one).
    ``role_cfg``: the role's section of the typed config; ``role_key``: its dotted path, for the error.

    Raises:
        ValueError: both set above 1 to different values, naming both keys and values.
    """
    own = int(role_cfg.ulysses_sequence_parallel_size)
    copy = int(role_cfg[fsdp_key].ulysses_sequence_parallel_size)
    if own > 1 and copy > 1 and own != copy:
        raise ValueError(f"{role_key}.ulysses_sequence_parallel_size={own} and "
                         f"{role_key}.{fsdp_key}.ulysses_sequence_parallel_size={copy} differ; set one of them")
    return own if own > 1 else copy


def section_sp_size(cfg: DictConfig, section: str, fsdp_key: str) -> int:
    """:func:`role_sp_size` of the role at dotted ``section`` of the resolved PPO config ``cfg``.

    Raises:
        ValueError: from :func:`role_sp_size`."""
    return role_sp_size(OmegaConf.select(cfg, section), fsdp_key, section)


def sequence_parallel_errors(cfg: DictConfig, world: int, critic: bool, ref: bool) -> list[str]:
    """verl's Ulysses rules for each role in use: its two size keys agree (:func:`role_sp_size`), and a size above 1
    divides the world size and has ``use_remove_padding`` on (the sequence is split as one packed row). The head
    counts are checked against the model when the workers load it (``workers/ulysses.py``). ``critic`` / ``ref``:
    whether the run builds that role (``validate.use_critic`` / ``validate.need_ref``)."""
    errors = []
    for section, fsdp, rmpad_key, role in _SP_ROLES:
        if (role == "critic" and not critic) or (role == "ref" and not ref):
            continue
        try:
            size = section_sp_size(cfg, section, fsdp)
        except ValueError as exc:
            errors.append(f"{exc}.")
            continue
        if size <= 1:
            continue
        key = f"{section}.ulysses_sequence_parallel_size"
        if OmegaConf.select(cfg, key) != size:  # the size came from the fsdp copy
            key = f"{section}.{fsdp}.ulysses_sequence_parallel_size"
        if world % size:
            errors.append(f"{key}={size} does not divide world size {world} "
                          "(trainer.nnodes x trainer.n_gpus_per_node).")
        if not OmegaConf.select(cfg, rmpad_key):
            errors.append(f"{key}={size} needs {rmpad_key}=True (Ulysses splits the packed sequence).")
    return errors
