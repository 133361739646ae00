"""The ``linear`` micro-benchmark of ``bench/bench_kernels.py`` (``--only linear``): each linear layer shape of the
benchmark's model sizes, a decode step's 32-row product by ``nn.functional.linear`` vs oneDNN on a reordered weight
(``kernels/packed_linear.py``), float32 and bf16, and an update's 4,096-token float32 forward and backward, torch vs
``onednn_linear.OneDNNLinear``. Run it through ``bench_kernels.py``; the timing helper and the sizes are
``bench_timing.py``'s."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from bench_timing import PACKING_SIZES as _PACKING_SIZES
from bench_timing import interleaved_median_ms as _interleaved_median_ms


def _linear_shapes(size: dict) -> list[tuple[str, int, int]]:
    """``(name, in_features, out_features)`` of one decoder layer's projections and the LM head (vocabulary 2,000);
    q/k/v and gate/up as the one product each that the decode step runs."""
    h, inter = size["hidden_size"], size["intermediate_size"]
    kv = h // size["num_attention_heads"] * size["num_key_value_heads"]
    return [("qkv", h, h + 2 * kv), ("o", h, h), ("gate_up", h, 2 * inter), ("down", inter, h), ("lm_head", h, 2000)]


def bench_linear(reps: int, sizes: tuple[str, ...] = ("1m", "20m")) -> None:
    """Decode-step products (32 rows) torch vs oneDNN on a reordered weight, float32 and bf16, and the update's
    float32 forward and backward products (4,096 tokens) torch vs ``OneDNNLinear``, per layer shape and size."""
    from rlhf_core.kernels.onednn_linear import OneDNNLinear, onednn_available, onednn_is_faster
    from rlhf_core.kernels.packed_linear import PackedLinear

    if not onednn_available():
        print("linear: this torch build has no oneDNN")
        return
    print(f"float32 linears chosen here (onednn_linear.onednn_is_faster): {'oneDNN' if onednn_is_faster() else 'torch'}")
    g = torch.Generator().manual_seed(0)
    for name, size in ((k, _PACKING_SIZES[k]) for k in sizes):
        totals = {}
        for layer, fan_in, fan_out in _linear_shapes(size):
            lin = torch.nn.Linear(fan_in, fan_out, bias=layer == "qkv")
            for dtype in (torch.float32, torch.bfloat16):
                lin_d = copy.deepcopy(lin).to(dtype)
                x = torch.randn(32, fan_in, generator=g).to(dtype)
                packed = PackedLinear([lin_d], rows=32)
                t_torch, t_packed = _interleaved_median_ms(
                    [lambda: F.linear(x, lin_d.weight, lin_d.bias), lambda: packed(x)], reps)
                key = f"decode {str(dtype)[6:]}"
                totals[key] = [a + b for a, b in zip(totals.get(key, [0.0, 0.0]), (t_torch, t_packed))]
                print(f"{name:4s} decode  {layer:7s} {str(dtype)[6:]:8s} 32 x {fan_in} -> {fan_out}: "
                      f"torch {1e3 * t_torch:7.1f} us   oneDNN reordered {1e3 * t_packed:7.1f} us   "
                      f"({t_torch / t_packed:.2f}x)")
            x = torch.randn(4096, fan_in, generator=g, requires_grad=True)
            w = lin.weight.detach().clone().requires_grad_()
            up = torch.randn(4096, fan_out, generator=g)

            def step(fn):
                return lambda: torch.autograd.grad((fn(x, w, None) * up).sum(), (x, w))

            t_torch, t_onednn = _interleaved_median_ms([step(F.linear), step(OneDNNLinear.apply)], max(3, reps // 10))
            totals["update float32"] = [a + b for a, b in zip(totals.get("update float32", [0.0, 0.0]),
                                                              (t_torch, t_onednn))]
            print(f"{name:4s} update  {layer:7s} float32  4096 x {fan_in} -> {fan_out}, forward + backward: "
                  f"torch {t_torch:7.2f} ms   OneDNNLinear {t_onednn:7.2f} ms   ({t_torch / t_onednn:.2f}x)")
        for key, (a, b) in totals.items():
            print(f"{name:4s} one layer + LM head, {key}: torch / oneDNN {a / b:.2f}x")
