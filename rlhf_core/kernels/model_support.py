"""What the CPU kernels can do for one model, decided once: :class:`KernelSupport` from :func:`support`.

Every question the kernels ask of a model before running it (may it be packed? does it attend per sequence in a
pack? may its decode share a prompt's cache? may its update run each prompt once? does its forward take
``logits_to_keep``? may its dropout draw masks?) reads only the model's class, config and modules, none of which
change during a run. :func:`support` answers them all in one pass and keeps the answer per model object (one cache,
weakly keyed: a model that is freed drops its entry).
"""
from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

# model types whose packed forward equals the padded one to float rounding, for SDPA and eager attention
# (tests/rlhf_core/workers/test_workers_packing_support.py builds each and checks it): llama, qwen2, qwen3 and mistral on SDPA
# with full attention attend through packing.varlen_sdpa, every other case finds each sequence's start in
# position_ids through transformers' masking_utils
PACKED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gpt2", "gpt_neox", "gemma", "phi", "phi3",
                                "qwen3_moe", "mixtral", "olmo", "olmo2", "starcoder2", "stablelm", "granite",
                                "cohere", "glm", "smollm3", "falcon"})
# decoder families whose attention is the standard Llama form (q/k/v projections, rotary embedding applied before
# the cache update, softmax(q·kᵀ·scaling)·v with no softcapping, sinks or per-layer extras)
GROUPED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
# of those, the ones whose decoder layer is exactly what grouped_attention.decode_step runs (no q/k norms)
STEP_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})
# cache layers whose whole per-row state is ``keys``/``values`` (gathering both gives each row its prompt's cache);
# hybrid linear-attention, KV-shared and indexed (DSA) layers carry more state and are not supported
PLAIN_CACHE_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer)


@dataclass(frozen=True)
class KernelSupport:
    """Which kernels may serve one model (see :func:`support` for how each field is decided).

    Attributes:
        packing_refusal: why a packed forward (``use_remove_padding``) could differ from the padded one, or
            ``None`` when it may pack.
        sdpa_full_attention: the model runs SDPA and every layer is full causal attention (a 4-D boolean mask
            ``(b, 1, 1, kv_len)`` means what its 2-D padding mask means).
        varlen_attention: a packed forward attends per sequence through ``packing.varlen_sdpa`` (a Llama-form
            decoder on SDPA with full attention); the same models the grouped decode attention serves.
        decode_step: ``grouped_attention.decode_step`` computes the model's forward (a stock Llama/Qwen2/Mistral
            causal LM).
        shared_prefix: the update may run each distinct prompt once (``shared_prefix.shared_prefix_logits``): a
            forward taking ``cache``, ``use_cache`` and ``logits_to_keep`` and a cache of plain key/value layers.
            Activation checkpointing while training turns it off per call (transformers then disables the cache).
        logits_to_keep: ``model.forward`` takes ``logits_to_keep`` (the LM head can run on the kept positions).
        active_dropout: a forward in train mode would drop anything (an ``nn.Dropout*`` with ``p > 0`` or a config
            field named ``*dropout*`` above 0).
    """
    packing_refusal: str | None
    sdpa_full_attention: bool
    varlen_attention: bool
    decode_step: bool
    shared_prefix: bool
    logits_to_keep: bool
    active_dropout: bool

    @property
    def packable(self) -> bool:
        """Whether ``use_remove_padding`` may run this model packed (:attr:`packing_refusal` is ``None``)."""
        return self.packing_refusal is None

    @property
    def grouped_decode(self) -> bool:
        """Whether the rollout's grouped decode attention may replace the model's SDPA (as :attr:`varlen_attention`)."""
        return self.varlen_attention


_SUPPORT: "weakref.WeakKeyDictionary[nn.Module, KernelSupport]" = weakref.WeakKeyDictionary()


def support(model: nn.Module) -> KernelSupport:
    """The :class:`KernelSupport` of ``model``, computed on the first call for this model object and kept (a change
    of the model's attention implementation afterwards is not seen: set it before the model is prepared).

    A peft wrapper is judged by its base model's forward for packing (``position_ids``) and by its own forward for
    the shared prefix (a peft wrapper's forward takes no ``cache``). Source: verl's ``check_model_support_rmpad``
    refuses unlisted models for packing likewise."""
    if model not in _SUPPORT:
        text = model.config.get_text_config(decoder=True)
        model_type = getattr(text, "model_type", None)
        full = _sdpa_full_attention(text)
        varlen = model_type in GROUPED_MODEL_TYPES and full
        params = inspect.signature(model.forward).parameters
        _SUPPORT[model] = KernelSupport(
            packing_refusal=_packing_refusal(model, model_type), sdpa_full_attention=full, varlen_attention=varlen,
            decode_step=varlen and _stock_decoder(model),
            shared_prefix=(all(k in params for k in ("cache", "use_cache", "logits_to_keep"))
                           and hasattr(model.config, "get_text_config") and _plain_cache(model.config)),
            logits_to_keep="logits_to_keep" in params, active_dropout=has_active_dropout(model))
    return _SUPPORT[model]


def _sdpa_full_attention(text) -> bool:
    layer_types = getattr(text, "layer_types", None) or ["full_attention"]
    return (getattr(text, "_attn_implementation", None) == "sdpa" and getattr(text, "sliding_window", None) is None
            and all(t == "full_attention" for t in layer_types))


def _packing_refusal(model: nn.Module, model_type: str | None) -> str | None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if model_type not in PACKED_MODEL_TYPES:
        return (f"model_type {model_type!r} is not one whose packed forward was checked against the padded one "
                f"({', '.join(sorted(PACKED_MODEL_TYPES))})")
    if "position_ids" not in inspect.signature(base.forward).parameters:
        return f"{type(base).__name__}.forward takes no position_ids, which carry where each packed sequence starts"
    return None


def _stock_decoder(model: nn.Module) -> bool:
    """A transformers Llama/Qwen2/Mistral causal LM with the modules ``decode_step`` runs."""
    inner = getattr(model, "model", None)
    model_type = model.config.model_type
    if model_type not in STEP_MODEL_TYPES or inner is None:
        return False
    stock = type(model).__module__ == f"transformers.models.{model_type}.modeling_{model_type}"
    return stock and all(hasattr(inner, k) for k in ("embed_tokens", "rotary_emb", "layers", "norm")) and hasattr(
        model, "lm_head")


def _plain_cache(config) -> bool:
    """Whether the dynamic cache ``config`` builds has only plain or sliding-window key/value layers, and no layer
    shares another's keys/values."""
    text = config.get_text_config(decoder=True)
    if getattr(text, "num_kv_shared_layers", 0):
        return False
    try:
        layers = DynamicCache(config=config).layers
    except (KeyError, ValueError, TypeError, AttributeError):  # a layer type the mapping does not know
        return False
    return bool(layers) and all(type(layer) in PLAIN_CACHE_LAYERS for layer in layers)


def has_active_dropout(model: nn.Module) -> bool:
    """True when a forward in train mode would drop anything: an ``nn.Dropout*`` module with ``p > 0`` or a Hugging
    Face config field named ``*dropout*`` (``attention_dropout``, ``hidden_dropout``...) above 0."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "to_dict"):
            for k, v in cfg.to_dict().items():
                if "dropout" in k and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                    return True
    return False
