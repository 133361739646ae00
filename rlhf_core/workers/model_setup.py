"""Build an FSDP2 model (+ optimizer + LR schedule) from a verl model/fsdp config section."""
from __future__ import annotations

import logging
from typing import Any, Mapping

import torch
from torch import nn

from rlhf_core import kernels
from rlhf_core.config.structured import full_key, role_name
from rlhf_core.models.loading import enable_activation_checkpointing, load_causal_lm, load_value_model, to_torch_dtype
from rlhf_core.models.lora import check_lora_adapter, lora_from_config
from rlhf_core.models.tiled_mlp import tile_from_config
from rlhf_core.workers.fsdp_utils import apply_fsdp2, world_size
from rlhf_core.workers.lr_schedule import build_lr_scheduler
from rlhf_core.workers.optim import build_optimizer

logger = logging.getLogger(__name__)


def note_unsupported(model_cfg: Mapping[str, Any], use_torch_compile: bool, role: str) -> None:
    """Log, once per model, the settings this build accepts but runs differently (never silently): an actor's or
    critic's ``model`` section (the reward model's has no ``enable_activation_offload`` in verl's YAML: it has
    nothing to note).

    ``use_torch_compile`` is kept for callers; the actor logs its own CPU note (``actor.hot_functions``)."""
    if model_cfg.enable_activation_offload and not torch.cuda.is_available():
        logger.info("%s: enable_activation_offload=True is a no-op on CPU (activations already live in host memory)",
                    role)


def prepare_role_model(model: nn.Module, role: str, fsdp_cfg: Mapping[str, Any] | None,
                       packed_key: str | None = None) -> nn.Module:
    """The last steps of every role's model (actor, critic, reference, reward model, SFT, the rollout's engine
    copy), once it is loaded with its LoRA and checkpointing: the kernels (:func:`rlhf_core.kernels.prepare`:
    their install, float32 linears on oneDNN where faster, the refusal of packing for a model that cannot pack),
    then FSDP2 sharding with ``fsdp_cfg`` (``None``: the rollout's unsharded copy stays as it is). Returns the
    model (sharded in place); its :class:`~rlhf_core.kernels.KernelSupport` is ``kernels.support(model)``.

    Args:
        packed_key: the config key that turned ``use_remove_padding`` on for this role (``None``: not packed).
    Raises:
        ValueError: naming ``packed_key``, for a model whose packed forward could differ from the padded one.
    """
    kernels.prepare(model, packed_key)
    return model if fsdp_cfg is None else apply_fsdp2(model, fsdp_cfg, role)


def build_model(model_cfg: Mapping[str, Any], fsdp_cfg: Mapping[str, Any], role: str,
                value_head: bool = False) -> nn.Module:
    """Load the HF model (causal LM, or value model when ``value_head``), add LoRA (actor and critic: fresh, or the
    saved ``lora_adapter_path``, :func:`~rlhf_core.models.lora.lora_from_config`), gradient checkpointing, the
    tiled MLP (``model.tiled_mlp``, :mod:`rlhf_core.models.tiled_mlp`), then :func:`prepare_role_model` (the
    kernels, ``model_cfg.use_remove_padding`` checked; FSDP2 sharding). ``fsdp_cfg.model_dtype`` picks the parameter
    dtype.

    Args:
        model_cfg: ``actor_rollout_ref.model`` (roles ``actor``, ``ref``) or ``critic.model`` (``critic``).
        fsdp_cfg: the role's FSDP section (``actor.fsdp_config``, ``ref.fsdp_config``, ``critic.fsdp``).

    Raises:
        FileNotFoundError / OSError: naming the role and ``<section>.path`` when the model cannot be loaded, or
            ``lora_adapter_path`` when it holds no adapter (checked before the model loads).
        ValueError: an adapter that contradicts ``lora_rank`` / ``lora_alpha`` / ``target_modules``; ``tiled_mlp``
            for a model without a SwiGLU MLP; ``use_remove_padding`` for a model that cannot be packed
            (:func:`prepare_role_model`)."""
    if role in ("actor", "critic"):
        check_lora_adapter(model_cfg)  # a missing or contradicting adapter fails before the model loads
    dtype = to_torch_dtype(fsdp_cfg.model_dtype)
    loader = load_value_model if value_head else load_causal_lm
    try:
        model = loader(model_cfg.path, dtype=dtype, override_config=model_cfg.override_config,
                       trust_remote_code=bool(model_cfg.trust_remote_code), external_lib=model_cfg.external_lib,
                       # verl 0.9 model.hf_config_path: config.json from another folder (null: model.path)
                       config_path=model_cfg.hf_config_path)
    except OSError as exc:  # FileNotFoundError included: a missing or unreadable model directory
        raise type(exc)(f"{role_name(role)}: {full_key(model_cfg, 'path')}={model_cfg.path!r}: {exc}") from exc
    if role in ("actor", "critic"):
        model = lora_from_config(model, model_cfg, "TOKEN_CLS" if value_head else "CAUSAL_LM")
    if role in ("actor", "critic") and model_cfg.enable_gradient_checkpointing:
        enable_activation_checkpointing(model)
    if role == "ref":
        model.requires_grad_(False)
    tile_from_config(model, model_cfg)  # model.tiled_mlp
    packed_key = full_key(model_cfg, "use_remove_padding") if model_cfg.use_remove_padding else None
    return prepare_role_model(model, role, fsdp_cfg, packed_key)


def build_optim(model: nn.Module, optim_cfg: Mapping[str, Any]):
    """(AdamW, LambdaLR) from ``optim_cfg`` (``total_training_steps`` injected by the driver)."""
    optimizer = build_optimizer(model.parameters(), optim_cfg)
    return optimizer, build_lr_scheduler(optimizer, optim_cfg)


def per_rank(global_size: int | None, key: str, n: int = 1, sp_size: int = 1) -> int:
    """``global_size × n ÷ (world ÷ sp_size)``: the rows per data-parallel rank (an SP group's ranks hold the same
    rows, verl's division by the ``dp`` size under Ulysses); raises ``ValueError`` naming ``key`` when it does not
    divide or is 0."""
    ws = world_size() // sp_size
    total = int(global_size) * n
    if total % ws or total // ws == 0:
        what = ("world size" if sp_size == 1
                else f"data-parallel size (world ÷ ulysses_sequence_parallel_size={sp_size})")
        raise ValueError(f"{key}={global_size} (× n={n}) must be a positive multiple of the {what} {ws}")
    return total // ws


def micro_per_rank(cfg: Mapping[str, Any], per_gpu_key: str, global_key: str, dynamic: bool,
                   sp_size: int = 1) -> int | None:
    """The micro-batch size per rank: ``*_per_gpu``, or the deprecated global value ÷ world size.

    Raises ``ValueError`` naming the full keys when both are set, or neither is and ``use_dynamic_bsz`` is off
    (SEMANTICS)."""
    per_gpu, glob = cfg[per_gpu_key], cfg[global_key]
    per_gpu_path, global_path = full_key(cfg, per_gpu_key), full_key(cfg, global_key)
    if per_gpu is not None and glob is not None:
        raise ValueError(f"set only one of {per_gpu_path} and the deprecated {global_path}")
    if glob is not None:
        return per_rank(glob, global_path, sp_size=sp_size)
    if per_gpu is None and not dynamic:
        raise ValueError(f"{per_gpu_path} must be set when use_dynamic_bsz is False")
    return None if per_gpu is None else int(per_gpu)


def update_sizes(role_cfg: Any, model_cfg: Any, key: str, n: int, sp_size: int = 1) -> dict[str, Any]:
    """The per-rank sizes of a trainable role's update, as keyword arguments of ``DataParallelPPOActor`` /
    ``DataParallelPPOCritic``: ``mini_batch_size`` (``ppo_mini_batch_size × n ÷ world``), ``micro_batch_size``
    (:func:`micro_per_rank`) and ``activation_offload`` (``model.enable_activation_offload``).

    Args:
        role_cfg: ``actor_rollout_ref.actor`` or ``critic``; ``key`` is its dotted path, used in errors.
        model_cfg: the role's ``model`` section. n: ``rollout.n`` (responses per prompt).
        sp_size: the role's Ulysses size: the sizes are per data-parallel rank (``world ÷ sp_size``).
    Raises:
        ValueError: from :func:`per_rank` / :func:`micro_per_rank`, naming the key.
    """
    return {"mini_batch_size": per_rank(role_cfg.ppo_mini_batch_size, f"{key}.ppo_mini_batch_size", n, sp_size),
            "micro_batch_size": micro_per_rank(role_cfg, "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size",
                                               bool(role_cfg.use_dynamic_bsz), sp_size),
            "activation_offload": bool(model_cfg.enable_activation_offload)}


def first_param_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
