"""Model FLOPs utilisation of the actor update (``perf/mfu/actor``), estimated on the driver.

verl's ``FlopsCounter``: achieved FLOPs / (peak FLOPs of the device × number of workers). FLOPs of one training
pass over the batch ≈ ``6 · N · tokens + 12 · L · H · Σ seqlen²`` (dense matmuls forward+backward, plus the
attention score/value products; N = matmul parameters from the HF config, L layers, H hidden size, seqlen =
valid tokens per sequence); the update runs ``ppo_epochs`` passes. Peak FLOPs come from a table of bf16 dense
peaks by CUDA device name; an unknown device (e.g. CPU) has an unknown peak and MFU is reported as 0.0, as verl does.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import torch
from transformers import AutoConfig

from rlhf_core.models.loading import local_path

logger = logging.getLogger(__name__)

PEAK_BF16_FLOPS = {  # dense bf16 tensor-core peaks, FLOP/s
    "H200": 989e12, "H100": 989e12, "H800": 989e12, "H20": 148e12, "A100": 312e12, "A800": 312e12,
    "L40S": 362e12, "L40": 181e12, "A10": 125e12, "4090": 165e12, "B200": 2250e12, "MI300X": 1307e12,
}


def device_peak_flops(device_name: str | None) -> float:
    """Peak FLOP/s for a CUDA device name (``"NVIDIA H200"`` → 989e12); ``inf`` when unknown or None."""
    if not device_name:
        return float("inf")
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_BF16_FLOPS[key]
    return float("inf")


def matmul_params(hf_config: Any) -> float:
    """Parameters that take part in matmuls per token (attention projections, MLP, LM head) of a decoder LM."""
    h = int(hf_config.hidden_size)
    layers = int(hf_config.num_hidden_layers)
    heads = int(hf_config.num_attention_heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or h // heads)
    inter = int(getattr(hf_config, "intermediate_size", 4 * h))
    attn = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2
    mlp = 3 * h * inter
    return float(layers * (attn + mlp) + int(hf_config.vocab_size) * h)


def estimate_mfu(hf_config: Any, seqlens: Sequence[int], seconds: float, n_workers: int, passes: int = 1,
                 device_name: str | None = None) -> float:
    """MFU of ``passes`` training passes over sequences of ``seqlens`` valid tokens that took ``seconds``."""
    if seconds <= 0 or n_workers < 1:
        return 0.0
    tokens = float(sum(seqlens))
    attn = 12.0 * int(hf_config.num_hidden_layers) * int(hf_config.hidden_size) * float(sum(s * s for s in seqlens))
    flops = (6.0 * matmul_params(hf_config) * tokens + attn) * passes
    return flops / (seconds * device_peak_flops(device_name) * n_workers)


def load_hf_config(model_config: Any) -> Any | None:
    """The HF config of ``actor_rollout_ref.model`` (``path``, ``trust_remote_code``), or ``None`` with a warning
    when the driver cannot load it (e.g. a remote-code model): MFU is then unknown."""
    try:
        return AutoConfig.from_pretrained(local_path(str(model_config.path)),
                                          trust_remote_code=bool(model_config.trust_remote_code))
    except Exception as exc:  # a remote-code model the driver cannot load: MFU unknown
        logger.warning("perf/mfu/actor unavailable: %s", exc)
        return None


def actor_mfu(hf_config: Any | None, seqlens: Sequence[int], seconds: float, world_size: int, passes: int) -> float:
    """``perf/mfu/actor``: :func:`estimate_mfu` on this process's CUDA device (``None`` on CPU); 0.0 when
    ``hf_config`` is ``None``."""
    if hf_config is None:
        return 0.0
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return estimate_mfu(hf_config, seqlens, seconds, world_size, passes, name)
