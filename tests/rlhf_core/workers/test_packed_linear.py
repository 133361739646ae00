"""The decode step's oneDNN products (rlhf_core/kernels/packed_linear.py): equal to the ``nn.Linear`` layers
they replace, for any row count, with their own copy of the weights; refused where they would compute something else."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rlhf_core.kernels.packed_linear import DecodeWeights, PackedLinear, packed_linear_available


def _layers(dtype):
    torch.manual_seed(0)
    q, k, v = nn.Linear(48, 32), nn.Linear(48, 16, bias=False), nn.Linear(48, 16)  # k without a bias: zeros
    return [m.to(dtype) for m in (q, k, v)]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("rows", [1, 7, 32, 50])
def test_one_product_equals_the_layers(dtype, tol, rows):
    # reordered for 32 rows, it computes any row count; outputs are the layers' outputs side by side (float32:
    # another summation order of 48 products; bf16: both round float32 accumulators, so 1e-2 covers one bf16 step)
    layers = _layers(dtype)
    packed = PackedLinear(layers, rows=32)
    x = torch.randn(rows, 48).to(dtype)
    y = packed(x)
    assert y.shape == (rows, 64) and y.dtype == dtype
    for got, layer in zip(packed.split(y), layers):
        torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=tol, atol=tol)


def test_it_keeps_its_own_copy_of_the_weights():
    # the rollout builds the products after the weight sync; a later in-place change of a layer is not seen
    layers = _layers(torch.float32)
    packed = PackedLinear(layers, rows=4)
    x = torch.randn(4, 48)
    before = packed(x)
    with torch.no_grad():
        layers[0].weight.add_(1.0)
    assert torch.equal(packed(x), before)


def _tiny_llama(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2)).to(dtype).eval()


def test_decode_weights_cover_every_layer_of_a_llama():
    model = _tiny_llama()
    weights = DecodeWeights.of(model, rows=8)
    assert weights is not None and len(weights.layers) == 2
    # q (4 heads × 8) | k (2 × 8) | v (2 × 8); gate | up; the LM head's vocabulary
    assert weights.layers[0].qkv.sizes == [32, 16, 16] and weights.layers[1].gate_up.sizes == [64, 64]
    assert weights.lm_head.sizes == [64]


def test_decode_weights_refuse_what_they_would_compute_wrongly():
    assert DecodeWeights.of(_tiny_llama(torch.float16), rows=8) is None  # fp16: not a dtype served
    assert not packed_linear_available(_tiny_llama(torch.float16))
    model = _tiny_llama()

    class Scaled(nn.Linear):  # a subclass (LoRA, quantized, ...) computes something else than its weight's product
        def forward(self, x):
            return 2 * super().forward(x)

    lin = model.model.layers[1].mlp.down_proj
    scaled = Scaled(lin.in_features, lin.out_features, bias=False)
    scaled.load_state_dict(lin.state_dict())
    model.model.layers[1].mlp.down_proj = scaled
    assert DecodeWeights.of(model, rows=8) is None
