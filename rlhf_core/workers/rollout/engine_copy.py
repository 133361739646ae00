"""The rollout engine's own full (unsharded) copy of the policy — the hybrid engine's inference side."""
from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from rlhf_core.models.loading import load_causal_lm, to_torch_dtype
from rlhf_core.models.lora import apply_lora
from rlhf_core.workers.fsdp_utils import device


def build_engine_copy(model_cfg: Mapping[str, Any], fsdp_cfg: Mapping[str, Any] | None) -> nn.Module:
    """Load the policy again, unsharded, in the actor's ``model_dtype``, with the same LoRA structure (so the
    actor's full state dict loads into it key for key); eval mode, no gradients, on :func:`device`."""
    dtype = to_torch_dtype((fsdp_cfg or {}).get("model_dtype") or "float32")
    module = load_causal_lm(model_cfg["path"], dtype=dtype, override_config=model_cfg.get("override_config"),
                            trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
                            external_lib=model_cfg.get("external_lib"))
    if int(model_cfg.get("lora_rank", 0) or 0) > 0:
        module = apply_lora(module, int(model_cfg["lora_rank"]), model_cfg.get("lora_alpha", 16),
                            model_cfg.get("target_modules", "all-linear"))
    module.requires_grad_(False)
    return module.to(device()).eval()
