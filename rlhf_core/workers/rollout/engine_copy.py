"""The rollout engine's own full (unsharded) copy of the policy — the hybrid engine's inference side."""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from rlhf_core.config.structured import full_key
from rlhf_core.models.loading import load_causal_lm, to_torch_dtype
from rlhf_core.models.lora import lora_from_config
from rlhf_core.workers.fsdp_utils import device
from rlhf_core.workers.model_setup import prepare_role_model
from rlhf_core.workers.precision import cast_buffers


def compute_dtype(fsdp_cfg: Mapping[str, Any]) -> torch.dtype:
    """The dtype the actor's forward runs in: ``mixed_precision.param_dtype`` when it is not fp32 (FSDP2 casts the
    unsharded parameters to it), else ``model_dtype``.

    Raises ``ValueError`` for an unknown dtype spelling (from ``to_torch_dtype``)."""
    param = to_torch_dtype(fsdp_cfg.mixed_precision.param_dtype)
    return param if param != torch.float32 else to_torch_dtype(fsdp_cfg.model_dtype)


def build_engine_copy(model_cfg: Mapping[str, Any], fsdp_cfg: Mapping[str, Any]) -> nn.Module:
    """Load the policy again, unsharded, with the same LoRA structure (so the actor's full state dict loads into it
    key for key); eval mode, no gradients, on :func:`device`.

    Its parameters are in the actor's :func:`compute_dtype` and its floating buffers in
    ``mixed_precision.buffer_dtype``: the rollout samples from the same numerics as the actor's forward (verl's
    HF rollout runs the FSDP module itself, so under ``param_dtype: bf16`` it generates in bf16 too), and its float32
    linears run on oneDNN where the actor's do: the kernels are applied as for every role
    (:func:`~rlhf_core.workers.model_setup.prepare_role_model`, unsharded; ``model.use_remove_padding`` refused for
    a model that cannot pack, as its prefill then runs packed). The weight sync casts the actor's full-precision
    state into these dtypes (``load_state_dict`` copies).

    Raises:
        ValueError: ``use_remove_padding`` for a model that cannot be packed."""
    module = load_causal_lm(model_cfg.path, dtype=to_torch_dtype(fsdp_cfg.model_dtype),
                            override_config=model_cfg.override_config,
                            trust_remote_code=bool(model_cfg.trust_remote_code), external_lib=model_cfg.external_lib,
                            config_path=model_cfg.hf_config_path)
    module = lora_from_config(module, model_cfg)  # the actor's adapters (fresh or lora_adapter_path), key for key
    dtype = compute_dtype(fsdp_cfg)
    with torch.no_grad():
        for param in module.parameters():
            param.data = param.data.to(dtype)
    cast_buffers(module, fsdp_cfg.mixed_precision)
    packed_key = full_key(model_cfg, "use_remove_padding") if model_cfg.use_remove_padding else None
    prepare_role_model(module, "rollout", None, packed_key)  # the prefill's float32 products, as the actor's
    module.requires_grad_(False)
    return module.to(device()).eval()
