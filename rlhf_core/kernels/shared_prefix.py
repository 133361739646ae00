"""The policy forward with each distinct prompt run once (a "shared prefix"): GRPO-style batches repeat every
prompt ``rollout.n`` times, and the plain forward runs its tokens through the model ``n`` times.

:func:`shared_prefix_logits` runs the distinct prompts of a micro-batch once, with the KV cache on, gathers each
row's keys and values from its prompt's (an index, so gradients from all ``n`` responses flow back into the one
prompt pass), and runs the responses against them. The response logits equal the plain forward's up to float
rounding (tests/rlhf_core/workers/test_workers_shared_prefix.py: log-probs and gradients to 1e-5), and the update's arithmetic
shrinks with the repeated prompt tokens (Countdown, experiments/countdown.yaml: 256 rows of 31 + ≤ 12 tokens become
32 prompts + 256 responses). With ``use_remove_padding`` the prompt pass runs the prompts' valid tokens only
(``packing.packed_prompt_pass``). The HF rollout's prefill shares prompts the same way (``workers/rollout/hf_decode.py``).

Whether the shared path can run is decided from the model alone, before any forward; whether it runs for a
micro-batch is the same on every rank: it runs when a prompt repeats in the micro-batch of *any* rank (a scalar
all-reduce). FSDP2 issues its all-gathers and reduce-scatters per model call, so ranks that disagreed on one pass
or two would deadlock.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from transformers.cache_utils import DynamicCache

from rlhf_core.kernels.packing import packed_prompt_pass, supports_varlen_attention
from rlhf_core.kernels.model_support import PLAIN_CACHE_LAYERS as _PLAIN_LAYERS
from rlhf_core.kernels.model_support import support


def supports_shared_prefix(model: nn.Module) -> bool:
    """Whether the shared path may run for ``model`` now (the same answer on every rank: it reads only the model).

    Needs a forward that takes ``cache``, ``use_cache`` and ``logits_to_keep`` (transformers 5 causal LMs; a peft
    wrapper's does not) and a config whose dynamic cache has only plain or sliding-window key/value layers (no hybrid
    linear attention, indexed or KV-shared layers): ``support(model).shared_prefix``; and no activation
    checkpointing while gradients are on (transformers then turns the cache off)."""
    return support(model).shared_prefix and not checkpointing_disables_cache(model)


def checkpointing_disables_cache(model: nn.Module) -> bool:
    """Whether this call's forward of ``model`` runs without its KV cache: activation checkpointing on while it
    trains with gradients (transformers then turns the cache off, and the shared path needs it)."""
    checkpointing = getattr(model, "is_activation_checkpointing", False)
    return bool(checkpointing and model.training and torch.is_grad_enabled())


def _any_rank_repeats(repeats: bool, device: torch.device) -> bool:
    """``repeats`` of this rank, OR-ed over all ranks (one scalar all-reduce when there are several), so that every
    rank takes the same path and FSDP2's per-call collectives stay matched."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return repeats
    flag = torch.tensor([1.0 if repeats else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def shared_prefix_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, response_length: int,
                         pack_prompts: bool = False) -> torch.Tensor | None:
    """Logits predicting the response tokens, ``(b, T, V)``, computing each distinct prompt once; ``None`` (the
    caller runs the plain forward) for shapes it does not handle and when no prompt repeats in this micro-batch on
    any rank (so all ranks issue the same collectives; a rank without repeats then runs its rows as their own
    prompts). Call only when :func:`supports_shared_prefix` holds.

    Inputs ``(b, P+T)`` with prompts left-padded in ``[:, :P]`` and responses in ``[:, P:]``; 2-D ``position_ids``
    only. A prompt is a row's ``(input_ids, attention_mask, position_ids)`` over ``[:, :P]``: rows equal in all three
    share one prompt pass. Logit ``t`` predicts response token ``t``: ``t = 0`` comes from the prompt pass's last
    position, ``t ≥ 1`` from the response pass's position ``t - 1`` (as ``logits[:, P-1 : P+T-1]`` of the plain
    forward); the response pass runs positions ``P .. P+T-2`` only. ``pack_prompts`` (``use_remove_padding``) runs
    the prompt pass on the prompts' valid tokens only (:func:`~rlhf_core.kernels.packing.packed_prompt_pass`) where
    the model attends packed per sequence (:func:`~rlhf_core.kernels.packing.supports_varlen_attention`) and every
    prompt ends in its last column; the padded prompt pass otherwise.

    Raises:
        RuntimeError: the model's cache holds a layer other than a plain or sliding-window key/value layer (a
            model :func:`supports_shared_prefix` let through by mistake; falling back after the prompt pass could
            desynchronise ranks).
    """
    T = int(response_length)
    P = input_ids.shape[1] - T
    if P <= 0 or T <= 0 or position_ids.dim() != 2:  # shapes: the same on every rank (padded to the batch)
        return None
    key = torch.cat([input_ids[:, :P], attention_mask[:, :P], position_ids[:, :P]], 1)
    prompts, inverse = torch.unique(key, dim=0, return_inverse=True)
    if not _any_rank_repeats(prompts.shape[0] < input_ids.shape[0], input_ids.device):
        return None
    p_ids, p_mask, p_pos = prompts[:, :P], prompts[:, P:2 * P], prompts[:, 2 * P:]
    cache = DynamicCache(config=model.config)
    if pack_prompts and supports_varlen_attention(model) and bool(p_mask[:, -1].all()):
        head_logits = packed_prompt_pass(model, p_ids, p_mask, p_pos, cache)
    else:
        head_logits = model(input_ids=p_ids, attention_mask=p_mask, position_ids=p_pos, cache=cache, use_cache=True,
                            logits_to_keep=1).logits
    layers = cache.layers
    if not all(type(layer) in _PLAIN_LAYERS for layer in layers):
        raise RuntimeError(f"shared-prefix forward: {type(model).__name__}'s cache has layers "
                           f"{sorted({type(layer).__name__ for layer in layers})}; only "
                           f"{[c.__name__ for c in _PLAIN_LAYERS]} can be gathered per row")
    # each row's copy of its prompt's keys and values: a differentiable gather whose backward sums the n rows'
    # gradients into their prompt. index_select's backward (index_add_) is faster on CPU than indexing's
    # (index_put_ with accumulation): bench/bench_kernels.py --only gather, BENCHMARKS.md "Kernels"
    for layer in layers:
        layer.keys, layer.values = layer.keys.index_select(0, inverse), layer.values.index_select(0, inverse)
    head_logits = head_logits.index_select(0, inverse)
    if T == 1:
        return head_logits
    # the last response token predicts nothing that is used: the response pass stops before it (a slice of its logits
    # instead cost a zero-filled (b, T, V) gradient in the backward)
    tail = model(input_ids=input_ids[:, P:-1], attention_mask=attention_mask[:, :-1],
                 position_ids=position_ids[:, P:-1], cache=cache, use_cache=True, logits_to_keep=T - 1)
    return torch.cat([head_logits, tail.logits], 1)
