"""Hugging Face loading helpers: tokenizer, causal LM (actor / ref / rollout), value model (critic).

Paths may be remote (``hdfs://``, ``s3://``, ...): they are copied into the local cache first with
``rlhf_core.data.fs.copy_to_local`` (verl's ``copy_to_local``); a plain local path is used as is.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Mapping

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from rlhf_core.config.errors import ConfigError

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}


def to_torch_dtype(dtype: str | torch.dtype | None, default: torch.dtype = torch.float32) -> torch.dtype:
    """``"bf16"``/``"bfloat16"``/``"fp32"``/... → ``torch.dtype``; ``None`` → ``default``.

    Raises ``ValueError`` naming the accepted spellings for anything else."""
    if dtype is None:
        return default
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().replace("torch.", "")
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[key]


def local_path(path: str) -> str:
    """A local directory for ``path``: remote paths are copied via ``rlhf_core.data.fs.copy_to_local``.

    A Hugging Face hub id (``org/name``) is returned as is for ``from_pretrained``.

    Raises:
        FileNotFoundError: from :func:`check_local_path` (a filesystem-looking path that does not exist or is a
            file) — before any model loading, instead of transformers' hub-id error.
    """
    path = os.path.expanduser(str(path))
    check_local_path(path)
    try:
        from rlhf_core.data.fs import copy_to_local
    except ImportError:  # the data package is optional for local paths
        if "://" in path and not path.startswith("file://"):
            raise
        return path[len("file://"):] if path.startswith("file://") else path
    return copy_to_local(path)


def check_local_path(path: str) -> None:
    """Check that a filesystem-looking model or tokenizer ``path`` (absolute, ``~``, ``./``, ``../``, ``file://``)
    names an existing directory; hub ids (``org/name``) and other URLs pass unchecked.

    Raises:
        FileNotFoundError: ``model path '<expanded>' does not exist``, or ``... is a file`` (a model or tokenizer
            is a directory).
    """
    path = os.path.expanduser(str(path))
    path = path[len("file://"):] if path.startswith("file://") else path
    if "://" in path or not path.startswith(("/", "./", "../")):
        return
    if not os.path.exists(path):
        raise FileNotFoundError(f"model path {path!r} does not exist")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model path {path!r} is a file; a model or tokenizer is a directory")


def import_external_libs(external_lib: str | list[str] | None) -> None:
    """Import ``external_lib`` module(s) so they can register models/tokenizers with transformers."""
    if not external_lib:
        return
    for name in [external_lib] if isinstance(external_lib, str) else list(external_lib):
        importlib.import_module(name)


def model_tokenizer_path(model_cfg: Mapping[str, Any]) -> str:
    """The tokenizer folder of a model section: its ``tokenizer_path`` when set (verl 0.9 ``HFModelConfig``),
    else its ``path``."""
    return str(model_cfg.path if model_cfg.tokenizer_path is None else model_cfg.tokenizer_path)


def load_tokenizer(path: str, trust_remote_code: bool = False, chat_template: str | None = None):
    """``AutoTokenizer`` for ``path``; sets ``pad_token = eos_token`` when the tokenizer has no pad (as verl).
    ``chat_template`` (``model.custom_chat_template``), when given, replaces the tokenizer's chat template.

    Raises:
        ConfigError: (a ``ValueError``) the tokenizer has neither a pad nor an eos token (naming ``path``): prompts
            could not be padded nor responses ended, so this stops before any data is read or worker started.
    """
    tok = AutoTokenizer.from_pretrained(local_path(path), trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    if tok.pad_token_id is None:
        raise ConfigError(f"tokenizer at {path!r} has neither a pad token nor an eos token; set eos_token (and "
                         "pad_token) in its tokenizer_config.json or special_tokens_map.json")
    if chat_template is not None:
        tok.chat_template = str(chat_template)
    return tok


def _model_config_overrides(override_config: Mapping[str, Any] | None) -> dict:
    """verl's ``model.override_config`` holds config fields directly or under ``model_config``;
    ``moe_config`` is Megatron-only and ignored here."""
    if not override_config:
        return {}
    cfg = dict(override_config)
    nested = cfg.pop("model_config", None) or {}
    cfg.pop("moe_config", None)
    return {**cfg, **dict(nested)}


def _load_config(path: str, override_config, trust_remote_code: bool, config_path: str | None = None):
    """The model's HF config, from ``config_path`` (``model.hf_config_path``) when given, else from ``path``,
    with ``override_config`` applied."""
    source = path if config_path is None else local_path(str(config_path))
    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    for k, v in _model_config_overrides(override_config).items():
        setattr(config, k, v)
    return config


def load_causal_lm(path: str, dtype: str | torch.dtype = "float32", override_config: Mapping | None = None,
                   trust_remote_code: bool = False, external_lib: str | list[str] | None = None,
                   config_path: str | None = None):
    """``AutoModelForCausalLM.from_pretrained`` on CPU with ``dtype`` and config overrides; the HF config is read
    from ``config_path`` when given (``model.hf_config_path``), the weights from ``path``.

    Returns the model in train mode on CPU (the FSDP layer moves it to the device)."""
    import_external_libs(external_lib)
    path = local_path(path)
    config = _load_config(path, override_config, trust_remote_code, config_path)
    model = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=to_torch_dtype(dtype), trust_remote_code=trust_remote_code)
    return model


def load_value_model(path: str, dtype: str | torch.dtype = "float32", override_config: Mapping | None = None,
                     trust_remote_code: bool = False, external_lib: str | list[str] | None = None,
                     head_seed: int = 0, config_path: str | None = None):
    """The critic: the LM backbone from ``path`` plus a scalar head (verl: ``AutoModelForTokenClassification``
    with ``num_labels=1``, ``classifier_dropout=0``). The backbone is initialised from the LM weights, the
    ``score`` head with N(0, initializer_range²) from ``head_seed`` when the checkpoint has
    none (reproducible across processes). ``model(input_ids, attention_mask, position_ids).logits`` is ``(B, L, 1)``.

    Raises ``ValueError`` (from transformers) when the architecture has no token-classification variant."""
    import_external_libs(external_lib)
    path = local_path(path)
    config = _load_config(path, override_config, trust_remote_code, config_path)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    model, info = AutoModelForTokenClassification.from_pretrained(
        path, config=config, dtype=to_torch_dtype(dtype), trust_remote_code=trust_remote_code, output_loading_info=True)
    if any(k.split(".")[0] in ("score", "classifier") for k in info.get("missing_keys", [])):
        _seeded_head_init(model, head_seed, getattr(config, "initializer_range", 0.02))
    return model


@torch.no_grad()
def _seeded_head_init(model, seed: int, std: float) -> None:
    """Re-initialise a newly created ``score`` head from a fixed seed (N(0, std²) weights, zero bias), so
    every process — and every rank — builds the same critic from the same checkpoint."""
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if head is None or not hasattr(head, "weight"):
        return
    gen = torch.Generator().manual_seed(int(seed))
    head.weight.copy_(torch.randn(head.weight.shape, generator=gen, dtype=torch.float32).to(head.weight.dtype) * std)
    if getattr(head, "bias", None) is not None:
        head.bias.zero_()


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant activation checkpointing (``model.enable_gradient_checkpointing``) on a transformers model, or
    a peft wrapper of one: ``activation_checkpointing_enable`` where transformers has it (5.24 deprecates
    ``gradient_checkpointing_enable``, to be removed in v6, and warns on each call), else the older name."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
