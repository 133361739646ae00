"""LoRA adapters via peft for the actor, critic and SFT (verl: ``model.lora_rank/lora_alpha/target_modules``)."""
from __future__ import annotations

from typing import Sequence

import torch
from peft import LoraConfig, TaskType, get_peft_model


def apply_lora(model, lora_rank: int, lora_alpha: float = 16, target_modules: str | Sequence[str] = "all-linear",
               task_type: str = "CAUSAL_LM", seed: int = 0, exclude_modules: str | Sequence[str] | None = None):
    """Wrap ``model`` with LoRA adapters; only the adapters (and, for a critic, the score head) train.

    The adapters' random ``A`` matrices are drawn on CPU from ``seed`` (the CPU generator is restored after, and
    the CUDA generators are not touched), so every run and every rank builds the same adapters, as
    :func:`~rlhf_core.models.loading.load_value_model` does for the critic's head; ``B`` starts at 0 (peft), so the
    wrapped model computes what ``model`` did. ``model`` is expected on CPU (as the workers load it).

    Args:
        lora_rank: adapter rank ``r``; ``<= 0`` returns ``model`` unchanged.
        lora_alpha: scaling numerator (effective scale ``alpha / r``).
        target_modules: ``"all-linear"`` or a list of module names (e.g. ``["q_proj", "v_proj"]``).
        task_type: ``"CAUSAL_LM"`` (actor, SFT) or ``"TOKEN_CLS"`` (critic: the ``score`` head stays trainable).
        seed: the seed of the adapters' initialisation.
        exclude_modules: module names that never get an adapter even when ``target_modules`` matches them (verl
            ``model.exclude_modules``, peft's ``LoraConfig.exclude_modules``): a string is a regex matched against
            the full module name, a list matches exact names or name suffixes; None = none.

    Returns the ``peft.PeftModel``. Calls ``enable_input_require_grads`` so that gradient checkpointing works
    with frozen embeddings.
    """
    if lora_rank is None or int(lora_rank) <= 0:
        return model
    if not isinstance(target_modules, str):
        target_modules = list(target_modules)
    extra = {}
    if exclude_modules is not None:
        extra["exclude_modules"] = exclude_modules if isinstance(exclude_modules, str) else list(exclude_modules)
    if task_type == "TOKEN_CLS":
        # the value head is trained in full (peft's modules_to_save), so it must not also get an adapter
        user = extra.get("exclude_modules")
        if isinstance(user, str):
            user = f"{user}|(.*\\.)?(score|classifier)"
        else:
            user = [*(user or []), "score", "classifier"]
        extra = {"exclude_modules": user, "modules_to_save": ["score"]}
    config = LoraConfig(task_type=getattr(TaskType, task_type), r=int(lora_rank), lora_alpha=lora_alpha,
                        target_modules=target_modules, bias="none", **extra)
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    with torch.random.fork_rng(devices=[]):  # the CPU generator only: torch.manual_seed would reseed CUDA too
        torch.default_generator.manual_seed(int(seed))
        return get_peft_model(model, config)


def merge_lora(model):
    """Fold the adapters into the base weights and return the plain base model (for saving/rollout)."""
    if hasattr(model, "merge_and_unload"):
        return model.merge_and_unload()
    return model
