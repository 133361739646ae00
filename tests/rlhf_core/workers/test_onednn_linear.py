"""float32 linears on oneDNN (rlhf_core/kernels/onednn_linear.py): the same products and gradients as
``nn.functional.linear`` to float32 rounding, the process-wide choice and its override, and the fallbacks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rlhf_core.kernels import onednn_linear
from rlhf_core.kernels.onednn_linear import OneDNNLinear, OneDNNLinearLayer, onednn_is_faster, use_onednn_linears

pytestmark = pytest.mark.skipif(not onednn_linear.onednn_available(), reason="this torch build has no oneDNN")


def test_the_cpu_vendor_is_read_from_cpuinfo():
    # on this x86 machine /proc/cpuinfo names a vendor; elsewhere (aarch64) there is none
    import platform

    vendor = onednn_linear.cpu_vendor()
    if platform.machine().lower() in ("x86_64", "amd64"):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            assert f"vendor_id\t: {vendor}" in f.read()
    else:
        assert vendor is None


@pytest.fixture
def choice(monkeypatch):
    """Set ``RLHF_FP32_LINEAR`` for one test (the choice is cached per process: cleared before and after)."""
    def set_choice(value: str) -> None:
        monkeypatch.setenv(onednn_linear.ENV, value)
        onednn_is_faster.cache_clear()
    yield set_choice
    onednn_is_faster.cache_clear()


@pytest.mark.parametrize("bias", [True, False])
def test_products_and_gradients_equal_torchs(bias):
    # (2, 5, 48) → (2, 5, 24): the forward and the three backward products against F.linear's autograd; another
    # summation order of at most 48 (x, W) or 10 (∂W, ∂b) float32 terms of order 1: 1e-5 covers it
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 48, generator=g, requires_grad=True)
    w = torch.randn(24, 48, generator=g, requires_grad=True)
    b = torch.randn(24, generator=g, requires_grad=True) if bias else None
    up = torch.randn(2, 5, 24, generator=g)
    y = OneDNNLinear.apply(x, w, b)
    grads = torch.autograd.grad((y * up).sum(), [t for t in (x, w, b) if t is not None])
    y_ref = F.linear(x, w, b)
    grads_ref = torch.autograd.grad((y_ref * up).sum(), [t for t in (x, w, b) if t is not None])
    assert y.shape == (2, 5, 24)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2))


def test_a_models_loss_and_gradients_are_unchanged(choice):
    # the same tiny model twice, one with its 15 linears (7 per layer + LM head) on oneDNN: same loss and
    # parameter gradients to float32 rounding, and the same state-dict keys
    choice("onednn")
    ids = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(1))
    ref, model = _tiny_qwen2(), _tiny_qwen2()
    assert use_onednn_linears(model) == 15
    assert sum(type(m) is OneDNNLinearLayer for m in model.modules()) == 15
    assert model.state_dict().keys() == ref.state_dict().keys()
    calls = []
    real_apply = OneDNNLinear.apply

    def counting_apply(*args):
        calls.append(1)
        return real_apply(*args)

    OneDNNLinear.apply = counting_apply
    try:
        loss = model(input_ids=ids, labels=ids).loss
    finally:
        OneDNNLinear.apply = real_apply
    assert len(calls) == 15
    loss_ref = ref(input_ids=ids, labels=ids).loss
    loss.backward()
    loss_ref.backward()
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_bf16_calls_keep_torchs_product(choice):
    # under FSDP2's bf16 mixed precision the layer sees bf16 inputs and weights: F.linear's result exactly
    choice("onednn")
    layer = nn.Linear(16, 8).to(torch.bfloat16)
    use_onednn_linears(layer)
    assert type(layer) is OneDNNLinearLayer
    x = torch.randn(4, 16).to(torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_what_it_leaves_to_torch_and_what_it_refuses(choice):
    # an empty input (oneDNN has no primitive for 0 rows), CPU autocast (bf16 out, as nn.Linear gives) keep torch's
    # product; a gradient of a gradient fails loudly instead of giving 0 (the products have no derivative)
    choice("onednn")
    layer = nn.Linear(16, 8)
    use_onednn_linears(layer)
    for shape in ((0, 16), (2, 0, 16)):
        assert layer(torch.randn(shape)).shape == (*shape[:-1], 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(4, 16)).dtype == torch.bfloat16
    x = torch.randn(4, 16, requires_grad=True)
    (gx,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
        gx.sum().backward()


def test_the_choice_and_its_override(choice, caplog, monkeypatch):
    choice("torch")
    model = _tiny_qwen2()
    assert not onednn_is_faster() and use_onednn_linears(model) == 0
    assert all(type(m) is not OneDNNLinearLayer for m in model.modules())
    choice("oneDNN ")  # case and spaces are forgiven
    assert onednn_is_faster()
    # auto: oneDNN exactly where torch's float32 BLAS is MKL on a non-Intel x86 CPU (MKL's slower path), logged
    for vendor, mkl, want in (("AuthenticAMD", True, True), ("HygonGenuine", True, True),
                              ("GenuineIntel", True, False), ("AuthenticAMD", False, False), (None, True, False)):
        monkeypatch.setattr(onednn_linear, "cpu_vendor", lambda v=vendor: v)
        monkeypatch.setattr(torch.backends.mkl, "is_available", lambda m=mkl: m)
        choice("auto")
        with caplog.at_level("INFO", logger=onednn_linear.__name__):
            assert onednn_is_faster() is want, (vendor, mkl)
        assert f"float32 linears: {'oneDNN' if want else 'torch'} (CPU vendor {vendor}" in caplog.text
        caplog.clear()
    choice("mkl")
    with pytest.raises(ValueError, match="RLHF_FP32_LINEAR='mkl'"):
        onednn_is_faster()
