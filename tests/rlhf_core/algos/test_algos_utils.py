"""Masked reductions, whitening, log-probs and entropy from logits."""
from __future__ import annotations

import math
import statistics

import pytest
import torch

from rlhf_core.algos import entropy_from_logits, logprobs_from_logits, masked_mean, masked_sum, masked_var, masked_whiten

X = torch.tensor([[1.0, 2.0, math.inf], [4.0, math.nan, 0.0]])  # inf/nan sit on masked positions
M = torch.tensor([[1, 1, 0], [1, 0, 1]])


def test_masked_sum_mean_ignore_masked_garbage():
    assert masked_sum(X, M).item() == 7.0                       # 1 + 2 + 4 + 0
    assert masked_mean(X, M).item() == pytest.approx(7 / 4)
    assert masked_mean(X, M, axis=-1).tolist() == pytest.approx([1.5, 2.0])
    assert masked_mean(X, torch.zeros_like(M)).item() == 0.0    # empty → 0, not NaN


def test_masked_var_is_unbiased_and_whiten_matches_statistics():
    vals = [1.0, 2.0, 4.0, 0.0]
    assert masked_var(X, M).item() == pytest.approx(statistics.variance(vals), abs=1e-6)  # Bessel: ÷ (n − 1)
    w = masked_whiten(X, M)
    mu, sd = statistics.mean(vals), statistics.stdev(vals)
    got = [w[0, 0], w[0, 1], w[1, 0], w[1, 2]]
    assert [g.item() for g in got] == pytest.approx([(v - mu) / sd for v in vals], abs=1e-5)
    assert torch.isfinite(w).all()
    w_noshift = masked_whiten(X, M, shift_mean=False)
    assert w_noshift[0, 0].item() == pytest.approx((1 - mu) / sd + mu, abs=1e-5)
    with pytest.raises(ValueError, match="no valid"):
        masked_var(X, torch.zeros_like(M))
    assert masked_var(X, torch.tensor([[1, 0, 0], [0, 0, 0]])).item() == 0.0  # one element: variance 0


def test_logprobs_from_logits_matches_log_softmax_gather_chunked_and_bf16():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 4
    labels = torch.randint(0, 11, (3, 5), generator=g)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    got = logprobs_from_logits(logits, labels, chunk_rows=4)  # 15 rows in chunks of 4
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    bf = logits.bfloat16()
    got_bf = logprobs_from_logits(bf, labels)
    assert got_bf.dtype == torch.float32
    ref_bf = torch.log_softmax(bf.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(got_bf, ref_bf, atol=1e-6, rtol=0)
    # gradient equals log_softmax's
    a = logits.clone().requires_grad_(True)
    logprobs_from_logits(a, labels, chunk_rows=4).sum().backward()
    b = logits.clone().requires_grad_(True)
    torch.log_softmax(b, -1).gather(-1, labels[..., None]).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)
    # ... for any upstream gradient (the fused backward scales the softmax term by it), and through a bf16 input
    # (the chunk's float32 gradient is cast back to bf16 by autograd, as log_softmax's is)
    up = torch.randn(3, 5, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        a = logits.detach().to(dtype, copy=True).requires_grad_(True)
        (logprobs_from_logits(a, labels, chunk_rows=4) * up).sum().backward()
        b = logits.detach().to(dtype, copy=True).requires_grad_(True)
        (torch.log_softmax(b.float(), -1).gather(-1, labels[..., None]).squeeze(-1) * up).sum().backward()
        assert a.grad.dtype == dtype
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)
    # first-order only: a double backward says so instead of failing inside an out= operation
    a = logits.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(logprobs_from_logits(a, labels).sum(), a, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        (grad ** 2).sum().backward()


def test_entropy_from_logits_values_and_stability():
    # uniform over 4 → ln 4; one-hot-ish huge logits → ≈ 0 and finite; a banned (−inf) token contributes 0:
    # [0, 0, −inf] is uniform over 2 → ln 2.
    logits = torch.tensor([[[0.0, 0, 0, 0], [1e4, 0, 0, 0], [0, 0, -math.inf, -math.inf]]])
    h = entropy_from_logits(logits)
    assert h.shape == (1, 3)
    assert h[0].tolist() == pytest.approx([math.log(4), 0.0, math.log(2)], abs=1e-6)
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2, 3, 9, generator=g)
    p = torch.softmax(z, -1)
    torch.testing.assert_close(entropy_from_logits(z, chunk_rows=2), -(p * p.log()).sum(-1), atol=1e-6, rtol=0)


def test_entropy_gradient_is_finite_with_banned_tokens():
    # d H / d z_v = −p_v (z_v − Σ p z): a banned (−inf) token has p = 0 and gets gradient 0, the others the
    # analytic value, for upstream gradients of 1, 2 and 1000 (a clamp at the lowest float overflowed above 1)
    p = torch.softmax(torch.tensor([1.0, 2.0]), -1)
    mean = (p * torch.tensor([1.0, 2.0])).sum()
    want = torch.cat([-p * (torch.tensor([1.0, 2.0]) - mean), torch.zeros(1)])
    for upstream in (1.0, 2.0, 1000.0):
        z = torch.tensor([[[1.0, 2.0, -math.inf]]], requires_grad=True)
        (upstream * entropy_from_logits(z)).sum().backward()
        torch.testing.assert_close(z.grad[0, 0], upstream * want, atol=1e-6 * upstream, rtol=1e-5)
