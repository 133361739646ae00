"""LoRA adapters via peft for the actor, critic and SFT (verl: ``model.lora_rank/lora_alpha/target_modules``)."""
from __future__ import annotations

import json
import os
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


def check_lora_adapter(model_cfg) -> dict | None:
    """The ``adapter_config.json`` of ``model_cfg.lora_adapter_path`` (verl 0.9 ``model.lora_adapter_path``: a saved
    PEFT LoRA adapter to start from), checked against the section's LoRA keys before any model is loaded; None
    when it is null. ``model_cfg``: a model section with LoRA keys (actor, critic, SFT). Cheap (one JSON file).

    Raises:
        FileNotFoundError: naming the key and path when the folder or its ``adapter_config.json`` is missing.
        ValueError: naming the keys when the adapter contradicts them: its rank ``r`` is not ``lora_rank``, its
            ``lora_alpha`` not ``lora_alpha``, or ``target_modules`` is a list naming other modules than the
            adapter's (``all-linear`` takes the adapter's modules).
    """
    path = model_cfg.lora_adapter_path
    if path is None:
        return None
    from rlhf_core.config.structured import full_key
    from rlhf_core.models.loading import local_path

    key = f"{full_key(model_cfg, 'lora_adapter_path')}={path!r}"
    try:
        folder = local_path(str(path))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{key}: {exc}") from exc
    config_file = os.path.join(folder, "adapter_config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{key}: no PEFT adapter there (adapter_config.json is missing)")
    with open(config_file) as fh:
        saved = json.load(fh)
    rank, alpha = int(model_cfg.lora_rank), float(model_cfg.lora_alpha)
    if int(saved.get("r", -1)) != rank:
        raise ValueError(f"{key}: the adapter has rank r={saved.get('r')}, but "
                         f"{full_key(model_cfg, 'lora_rank')}={rank}; set it to the adapter's rank")
    if float(saved.get("lora_alpha", alpha)) != alpha:
        raise ValueError(f"{key}: the adapter has lora_alpha={saved.get('lora_alpha')}, but "
                         f"{full_key(model_cfg, 'lora_alpha')}={model_cfg.lora_alpha}; set it to the adapter's")
    targets = model_cfg.target_modules
    theirs = saved.get("target_modules")
    if not isinstance(targets, str) and set(targets) != set([theirs] if isinstance(theirs, str) else theirs or []):
        raise ValueError(f"{key}: the adapter targets {sorted(theirs) if not isinstance(theirs, str) else theirs!r}, "
                         f"but {full_key(model_cfg, 'target_modules')}={list(targets)}; set it to the adapter's "
                         "modules or to all-linear")
    return {**saved, "folder": folder}


def lora_from_config(model, model_cfg, task_type: str = "CAUSAL_LM", seed: int = 0):
    """The LoRA of a model section (actor, critic, SFT, the rollout's copy): fresh adapters from ``lora_rank`` /
    ``lora_alpha`` / ``target_modules`` / ``exclude_modules`` (:func:`apply_lora`), or, with
    ``lora_adapter_path``, the saved adapter (checked by :func:`check_lora_adapter`) loaded trainable with
    ``peft.PeftModel.from_pretrained(..., is_trainable=True)`` (verl 0.9's FSDP engine), its saved weights
    being the starting point. ``lora_rank <= 0`` without an adapter returns ``model`` unchanged.

    Raises: as :func:`check_lora_adapter`."""
    adapter = check_lora_adapter(model_cfg)
    if adapter is None:
        return apply_lora(model, int(model_cfg.lora_rank), model_cfg.lora_alpha, model_cfg.target_modules, task_type,
                          seed, exclude_modules=model_cfg.exclude_modules)
    from peft import PeftModel

    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    return PeftModel.from_pretrained(model, adapter["folder"], is_trainable=True)
