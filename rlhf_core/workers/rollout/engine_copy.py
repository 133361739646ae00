"""The rollout engine's own full (unsharded) copy of the policy — the hybrid engine's inference side."""
from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from rlhf_core.models.loading import load_causal_lm, to_torch_dtype
from rlhf_core.models.lora import apply_lora
from rlhf_core.workers.fsdp_utils import device


def build_engine_copy(model_cfg: Mapping[str, Any], fsdp_cfg: Mapping[str, Any]) -> nn.Module:
    """Load the policy again, unsharded, in the actor's ``model_dtype``, with the same LoRA structure (so the
    actor's full state dict loads into it key for key); eval mode, no gradients, on :func:`device`."""
    dtype = to_torch_dtype(fsdp_cfg.model_dtype)
    module = load_causal_lm(model_cfg.path, dtype=dtype, override_config=model_cfg.override_config,
                            trust_remote_code=bool(model_cfg.trust_remote_code), external_lib=model_cfg.external_lib)
    if int(model_cfg.lora_rank) > 0:
        module = apply_lora(module, int(model_cfg.lora_rank), model_cfg.lora_alpha, model_cfg.target_modules)
    module.requires_grad_(False)
    return module.to(device()).eval()
