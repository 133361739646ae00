"""The decode step's linear layers as oneDNN matrix products on weights reordered once per rollout.

A decode step multiplies a few dozen rows (one per sample) by every weight of the model, and on CPU those
products are most of the step. torch runs a float32 ``nn.Linear`` through MKL's ``sgemm`` and a bf16 one through
oneDNN on the weight as stored. ``torch.ops.mkldnn._reorder_linear_weight`` lays a weight out in oneDNN's blocked
format once, and ``torch.ops.mkldnn._linear_pointwise`` multiplies by it: the pair inductor uses for a frozen
model's linears on CPU (``torch._inductor.fx_passes.mkldnn_fusion``), and the oneDNN path of vLLM's CPU backend.
A rollout reorders the weights at its start (a copy of the decoder's linear weights, freed at its end) and every
step reuses them; the q/k/v projections share one product, and so do the MLP's gate and up projections.

``bench/bench_kernels.py --only linear`` times these products against ``nn.functional.linear`` in float32 (where MKL
on a non-Intel CPU runs a slower code path) and bf16 (BENCHMARKS.md, "Kernels"). The outputs are
the same products in another summation order: float32 rounding (oneDNN's default ``fpmath`` mode is strict;
torch's ``torch.backends.mkldnn.matmul.fp32_precision`` is not touched), and bf16 outputs rounded from float32
accumulators as torch's own bf16 path does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rlhf_core.kernels.onednn_linear import OneDNNLinearLayer, onednn_available, onednn_product

_DTYPES = (torch.float32, torch.bfloat16)


def packed_linear_available(module: nn.Module) -> bool:
    """Whether :class:`DecodeWeights` can serve ``module``: its parameters are float32 or bf16 on the CPU and this
    torch build has oneDNN's product (:func:`~rlhf_core.kernels.onednn_linear.onednn_available`) and its weight
    reorder."""
    param = next(module.parameters(), None)
    return (param is not None and param.device.type == "cpu" and param.dtype in _DTYPES and onednn_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear:
    """One or more ``nn.Linear`` layers reading the same input, as one product with a reordered weight.

    Args:
        linears: plain ``nn.Linear`` layers with the same ``in_features`` (a layer without a bias adds zeros).
        rows: the expected number of input rows (oneDNN's layout hint; any row count is computed correctly).

    Calling it on ``x (r, in_features)`` returns ``(r, sum of out_features)`` in ``x``'s dtype; :meth:`split` cuts
    that into each layer's output. The weights are copied: a later change to the layers is not seen.
    """

    def __init__(self, linears: list[nn.Linear], rows: int) -> None:
        weight = torch.cat([lin.weight.detach() for lin in linears]) if len(linears) > 1 else linears[0].weight.detach()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        self.bias = None
        if any(lin.bias is not None for lin in linears):
            self.bias = torch.cat([weight.new_zeros(lin.out_features) if lin.bias is None else lin.bias.detach()
                                   for lin in linears])
        self.sizes = [lin.out_features for lin in linears]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_product(x, self.weight, self.bias)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return y.split(self.sizes, dim=-1)


@dataclass
class LayerWeights:
    """One decoder layer's products: ``qkv`` (q, k, v projections), ``o``, ``gate_up`` (gate, up), ``down``."""
    qkv: PackedLinear
    o: PackedLinear
    gate_up: PackedLinear
    down: PackedLinear


@dataclass
class DecodeWeights:
    """The reordered weights of a Llama-form causal LM's decoder layers and LM head, for :func:`~.grouped_attention.
    decode_step`. Build with :meth:`of`."""
    layers: list[LayerWeights]
    lm_head: PackedLinear

    @classmethod
    def of(cls, model: nn.Module, rows: int) -> "DecodeWeights | None":
        """The weights of ``model`` (``model.model.layers[i].self_attn.{q,k,v,o}_proj``, ``.mlp.{gate,up,down}_proj``
        and ``model.lm_head``) reordered for ``rows`` input rows, or ``None`` when :func:`packed_linear_available`
        fails or any of those is not a plain ``nn.Linear`` or ``OneDNNLinearLayer`` (a LoRA or quantized layer
        computes something else)."""
        if not packed_linear_available(model):
            return None
        layers = model.model.layers
        linears = [model.lm_head] + [m for layer in layers for m in (
            layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
            layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
        if any(type(m) not in (nn.Linear, OneDNNLinearLayer) for m in linears):
            return None
        return cls([LayerWeights(PackedLinear([a.q_proj, a.k_proj, a.v_proj], rows), PackedLinear([a.o_proj], rows),
                                 PackedLinear([m.gate_proj, m.up_proj], rows), PackedLinear([m.down_proj], rows))
                    for a, m in ((layer.self_attn, layer.mlp) for layer in layers)],
                   PackedLinear([model.lm_head], rows))
