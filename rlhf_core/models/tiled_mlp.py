"""TiledMLP (verl 0.9 ``model.tiled_mlp``): each decoder layer's MLP computed over sequence tiles.

A SwiGLU MLP (``down_proj(act(gate_proj(x)) * up_proj(x))``, Llama / Qwen2 / Qwen3) acts on every token alone, so
running it on ``num_shards`` slices of the sequence and concatenating gives the same output. In training each tile
runs under non-reentrant activation checkpointing: only the tile's input is kept for backward and its
``(…, intermediate_size)`` activations are recomputed tile by tile in backward, so the MLP's peak activation
memory falls from the whole sequence's to one tile's (verl's ``TiledMLP`` autograd function does the same with a
hand-written backward; checkpointing is the form FSDP2 already supports). Outputs and gradients equal the
untiled ones up to float rounding of the smaller matrix products.
"""
from __future__ import annotations

import types

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

_SWIGLU = ("gate_proj", "up_proj", "down_proj")


def _tiled_forward(self: nn.Module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """``x``: ``(…, L, hidden)``; the MLP of each of ``self._tiled_mlp_shards`` chunks of the ``L`` dim (the last
    chunk may be shorter; an ``L`` below the shard count makes fewer tiles), concatenated back to ``(…, L, hidden)``."""
    forward = type(self).forward
    tiles = torch.chunk(x, self._tiled_mlp_shards, dim=-2)
    if torch.is_grad_enabled():
        outs = [checkpoint(forward, self, tile, *args, use_reentrant=False, **kwargs) for tile in tiles]
    else:
        outs = [forward(self, tile, *args, **kwargs) for tile in tiles]
    return torch.cat(outs, dim=-2)


def apply_tiled_mlp(model: nn.Module, num_shards: int, key: str) -> int:
    """Make every SwiGLU MLP of ``model`` (a module holding ``gate_proj``, ``up_proj`` and ``down_proj``, LoRA
    layers included) run tiled over ``num_shards`` sequence tiles; patches the instances only (other models in the
    process are untouched). Returns the number of MLPs tiled.

    Args:
        key: the dotted path of the section's ``tiled_mlp`` (e.g. ``actor_rollout_ref.model.tiled_mlp``), for errors.
    Raises:
        ValueError: naming ``{key}.num_shards`` when it is below 1, or ``{key}.enabled`` when the model has no such
            MLP (verl supports the Llama / Qwen2 / Qwen3 MLPs only).
    """
    if int(num_shards) < 1:
        raise ValueError(f"{key}.num_shards={num_shards} must be >= 1")
    mlps = [m for m in model.modules() if all(isinstance(getattr(m, n, None), nn.Module) for n in _SWIGLU)]
    if not mlps:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ValueError(f"{key}.enabled=True: model type {model_type!r} has no SwiGLU MLP (gate_proj/up_proj/"
                         "down_proj) to tile; TiledMLP supports Llama, Qwen2 and Qwen3 MLPs")
    for mlp in mlps:
        mlp._tiled_mlp_shards = int(num_shards)
        mlp.forward = types.MethodType(_tiled_forward, mlp)
    return len(mlps)


def tile_from_config(model: nn.Module, model_cfg) -> nn.Module:
    """:func:`apply_tiled_mlp` with ``model_cfg.tiled_mlp.num_shards`` when ``model_cfg.tiled_mlp.enabled`` (a
    model section: ``actor_rollout_ref.model``, ``critic.model``, SFT's ``model``); returns ``model``.

    Raises: as :func:`apply_tiled_mlp`, naming the section's keys."""
    from rlhf_core.config.structured import full_key

    if bool(model_cfg.tiled_mlp.enabled):
        apply_tiled_mlp(model, int(model_cfg.tiled_mlp.num_shards), full_key(model_cfg, "tiled_mlp"))
    return model
