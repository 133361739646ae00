"""Build an FSDP2 model (+ optimizer + LR schedule) from a verl model/fsdp config section."""
from __future__ import annotations

import logging
from typing import Any, Mapping

import torch
from torch import nn

from rlhf_core.models.loading import load_causal_lm, load_value_model, to_torch_dtype
from rlhf_core.models.lora import apply_lora
from rlhf_core.workers.fsdp_utils import apply_fsdp2, world_size
from rlhf_core.workers.optim import build_lr_scheduler, build_optimizer

logger = logging.getLogger(__name__)


def note_unsupported(model_cfg: Mapping[str, Any], use_torch_compile: bool, role: str) -> None:
    """Log, once per model, the settings this build accepts but runs differently (never silently).

    ``use_torch_compile`` is kept for callers; the actor logs its own CPU note (``actor.hot_functions``)."""
    if model_cfg.get("enable_activation_offload", False) and not torch.cuda.is_available():
        logger.info("%s: enable_activation_offload=True is a no-op on CPU (activations already live in host memory)",
                    role)


def build_model(model_cfg: Mapping[str, Any], fsdp_cfg: Mapping[str, Any] | None, role: str,
                value_head: bool = False, default_dtype: str = "float32") -> nn.Module:
    """Load the HF model (causal LM, or value model when ``value_head``), add LoRA, gradient checkpointing,
    then shard it with FSDP2. ``fsdp_cfg.model_dtype`` picks the parameter dtype (default ``default_dtype``)."""
    fsdp_cfg = fsdp_cfg or {}
    dtype = to_torch_dtype(fsdp_cfg.get("model_dtype") or default_dtype)
    loader = load_value_model if value_head else load_causal_lm
    model = loader(model_cfg["path"], dtype=dtype, override_config=model_cfg.get("override_config"),
                   trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
                   external_lib=model_cfg.get("external_lib"))
    if role in ("actor", "critic") and int(model_cfg.get("lora_rank", 0) or 0) > 0:
        model = apply_lora(model, int(model_cfg["lora_rank"]), model_cfg.get("lora_alpha", 16),
                           model_cfg.get("target_modules", "all-linear"), "TOKEN_CLS" if value_head else "CAUSAL_LM")
    if role in ("actor", "critic") and model_cfg.get("enable_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if role == "ref":
        model.requires_grad_(False)
    return apply_fsdp2(model, fsdp_cfg, role)


def build_optim(model: nn.Module, optim_cfg: Mapping[str, Any]):
    """(AdamW, LambdaLR) from ``optim_cfg`` (``total_training_steps`` injected by the driver)."""
    optimizer = build_optimizer(model.parameters(), optim_cfg)
    return optimizer, build_lr_scheduler(optimizer, optim_cfg)


def per_rank(global_size: int | None, key: str, n: int = 1) -> int:
    """``global_size × n ÷ world``; raises ``ValueError`` naming ``key`` when it does not divide or is 0."""
    ws = world_size()
    total = int(global_size) * n
    if total % ws or total // ws == 0:
        raise ValueError(f"{key}={global_size} (× n={n}) must be a positive multiple of the world size {ws}")
    return total // ws


def micro_per_rank(cfg: Mapping[str, Any], per_gpu_key: str, global_key: str, dynamic: bool) -> int | None:
    """The micro-batch size per rank: ``*_per_gpu``, or the deprecated global value ÷ world size.

    Raises ``ValueError`` when both are set, or neither is and ``use_dynamic_bsz`` is off (SEMANTICS)."""
    per_gpu, glob = cfg.get(per_gpu_key), cfg.get(global_key)
    if per_gpu is not None and glob is not None:
        raise ValueError(f"set only one of {per_gpu_key} and the deprecated {global_key}")
    if glob is not None:
        return per_rank(glob, global_key)
    if per_gpu is None and not dynamic:
        raise ValueError(f"{per_gpu_key} must be set when use_dynamic_bsz is False")
    return None if per_gpu is None else int(per_gpu)


def first_param_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
