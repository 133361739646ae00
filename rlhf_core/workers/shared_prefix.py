"""The policy forward with each distinct prompt run once (a "shared prefix"): GRPO-style batches repeat every
prompt ``rollout.n`` times, and the plain forward runs its tokens through the model ``n`` times.

:func:`shared_prefix_logits` runs the distinct prompts of a micro-batch once, with the KV cache on, gathers each
row's keys and values from its prompt's (an index, so gradients from all ``n`` responses flow back into the one
prompt pass), and runs the responses against them. The response logits equal the plain forward's up to float
rounding (tests/unit/test_workers_shared_prefix.py: log-probs and gradients to 1e-5), and the update's arithmetic
shrinks with the repeated prompt tokens (Countdown preset: 256 rows of 31 + ≤ 12 tokens become 32 prompts + 256
responses). The HF rollout's prefill shares prompts the same way (``workers/rollout/hf_decode.py``).
"""
from __future__ import annotations

import inspect

import torch
from torch import nn

_TAKES_CACHE: dict[type, bool] = {}


def supports_shared_prefix(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes ``cache``, ``use_cache`` and ``logits_to_keep`` (transformers 5 causal LMs)."""
    cls = type(model)
    if cls not in _TAKES_CACHE:
        params = inspect.signature(model.forward).parameters
        _TAKES_CACHE[cls] = all(k in params for k in ("cache", "use_cache", "logits_to_keep"))
    return _TAKES_CACHE[cls]


def shared_prefix_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, response_length: int) -> torch.Tensor | None:
    """Logits predicting the response tokens, ``(b, T, V)``, computing each distinct prompt once; ``None`` when no
    prompt repeats in the micro-batch (the caller runs the plain forward) or the cache is not a per-layer
    key/value cache.

    Inputs ``(b, P+T)`` with prompts left-padded in ``[:, :P]`` and responses in ``[:, P:]``; 2-D ``position_ids``
    only. A prompt is a row's ``(input_ids, attention_mask, position_ids)`` over ``[:, :P]``: rows equal in all three
    share one prompt pass. Logit ``t`` predicts response token ``t``: ``t = 0`` comes from the prompt pass's last
    position, ``t ≥ 1`` from the response pass's position ``t - 1`` (as ``logits[:, P-1 : P+T-1]`` of the plain
    forward).
    """
    T = int(response_length)
    P = input_ids.shape[1] - T
    if P <= 0 or T <= 0 or position_ids.dim() != 2:
        return None
    key = torch.cat([input_ids[:, :P], attention_mask[:, :P], position_ids[:, :P]], 1)
    prompts, inverse = torch.unique(key, dim=0, return_inverse=True)
    if prompts.shape[0] == input_ids.shape[0]:
        return None
    head = model(input_ids=prompts[:, :P], attention_mask=prompts[:, P:2 * P], position_ids=prompts[:, 2 * P:],
                 use_cache=True, logits_to_keep=1)
    cache = head.cache
    layers = getattr(cache, "layers", None)
    if not layers or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
        return None
    for layer in layers:  # each row's copy of its prompt's keys and values (differentiable gather)
        layer.keys, layer.values = layer.keys[inverse], layer.values[inverse]
    tail = model(input_ids=input_ids[:, P:], attention_mask=attention_mask, position_ids=position_ids[:, P:],
                 cache=cache, use_cache=True, logits_to_keep=T)
    return torch.cat([head.logits[inverse], tail.logits[:, :T - 1]], 1)
