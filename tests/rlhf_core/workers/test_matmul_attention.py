"""bf16 attention on CPU by matrix products (``kernels/matmul_attention.py``).

The function is dtype-generic, so its semantics (GQA grouping, bool and additive masks, ``is_causal`` with and
without a key crop or a module, the scale, decode steps with and without a mask, values wider than queries) are
checked in float32 against transformers' own ``sdpa_attention_forward``, outputs and gradients to float32 rounding.
Then the dispatch rules, and in bf16: the "sdpa" entry taking the path for a bf16 model and a packed grid, its
log-probs as close to a float32 copy as SDPA's, finite outputs and gradients where a query has every key masked,
and dropout reaching SDPA."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rlhf_core.kernels import matmul_attention as mm
from rlhf_core.kernels import packing


class _Attn(torch.nn.Module):
    """What transformers' SDPA reads from an attention module."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def _qkv(b=3, H=6, KV=2, q=5, k=9, d=8, dtype=torch.float32, seed=0, dv=None):
    g = torch.Generator().manual_seed(seed)
    # the query comes transposed from (b, q, H, d), as the models build it (a non-contiguous view)
    query = torch.randn(b, q, H, d, generator=g).to(dtype).transpose(1, 2).requires_grad_()
    key = torch.randn(b, KV, k, d, generator=g).to(dtype).requires_grad_()
    value = torch.randn(b, KV, k, dv or d, generator=g).to(dtype).requires_grad_()
    return query, key, value


def _padding_mask(b, q, k, seed=1):
    """``(b, 1, q, k)`` bool: row i's first ``pads[i]`` keys are left padding, and query t sees keys up to k - q + t
    (a response of q tokens after a cached prompt); every query keeps at least its own key."""
    pads = torch.tensor([0, 2, 4][:b])
    cols = torch.arange(k)
    causal = cols[None, :] <= (k - q + torch.arange(q))[:, None]
    return (causal[None] & (cols[None, None, :] >= pads[:, None, None]))[:, None]


def _both(module, query, key, value, mask, **kwargs):
    """Outputs and input gradients of transformers' SDPA and of matmul_attention, for one upstream gradient."""
    results = []
    for fn in (sdpa_attention_forward, mm.matmul_attention):
        if module is None and fn is sdpa_attention_forward:
            results.append(None)
            continue
        q, k, v = (x.detach().clone().requires_grad_() for x in (query, key, value))
        out, _ = fn(module, q, k, v, mask, **kwargs)
        w = torch.linspace(-1, 1, out.numel()).view(out.shape)  # a different weight per output element
        (out.float() * w).sum().backward()
        results.append((out, q.grad, k.grad, v.grad))
    return results


@pytest.mark.parametrize("case", ["bool mask", "additive mask", "causal", "causal, keys cropped", "decode step",
                                  "decode step, no mask", "no mask, not causal", "no groups", "custom scale",
                                  "value head size", "no module"])
def test_float32_equals_transformers_sdpa(case):
    b, H, KV, q, k, dv = 3, 6, 2, 5, 9, 8
    mask, kwargs = None, {}
    if case == "bool mask":
        mask = _padding_mask(b, q, k)
    elif case == "additive mask":
        # float32's minimum at masked keys, as transformers builds float masks
        mask = torch.zeros(b, 1, q, k).masked_fill(~_padding_mask(b, q, k), torch.finfo(torch.float32).min)
    elif case == "causal":
        k = q
    elif case == "causal, keys cropped":
        # transformers' rule: no mask and q > 1 is causal from the first key (top-left); the 4 keys past q are dropped
        k = q + 4
    elif case == "decode step":
        q, mask = 1, _padding_mask(b, 1, k)
    elif case == "decode step, no mask":
        q = 1  # transformers passes no mask when nothing is padded: the one query sees every key, not key 0 only
    elif case == "value head size":
        mask, dv = _padding_mask(b, q, k), 12  # DeepSeek-style attention: values wider than queries and keys
    elif case == "no module":
        k = q  # without a module, no mask and q > 1 is causal (transformers' default)
    elif case == "no mask, not causal":
        kwargs["is_causal"] = False
    elif case == "no groups":
        KV = H
        mask = _padding_mask(b, q, k)
    elif case == "custom scale":
        mask, kwargs["scaling"] = _padding_mask(b, q, k), 0.3
    query, key, value = _qkv(b, H, KV, q, k, dv=dv)
    if case == "no module":
        theirs = _both(_Attn(H // KV), query, key, value, mask)[0]  # a module with is_causal=True
        ours = _both(None, query, key, value, mask)[1]
    else:
        theirs, ours = _both(_Attn(H // KV), query, key, value, mask, **kwargs)
    assert ours[0].shape == theirs[0].shape == (b, q, H, dv) and ours[0].is_contiguous()
    for a, e in zip(ours, theirs):
        assert torch.allclose(a, e, atol=2e-6), case


def test_float32_causal_crop_is_really_top_left():
    # guard against a test that cannot fail: with 4 extra keys, bottom-right alignment would let query 0 see keys
    # 0-4; the crop keeps key 0 only, so query 0's output is value 0 exactly
    query, key, value = _qkv(b=1, H=2, KV=2, q=3, k=7)
    out, _ = mm.matmul_attention(_Attn(1), query, key, value, None)
    assert torch.allclose(out[0, 0], value[0, :, 0], atol=1e-6)


def test_dispatch_rules():
    q16, k16, _ = _qkv(dtype=torch.bfloat16)
    q32, k32, _ = _qkv()
    mask = _padding_mask(3, 5, 9)
    assert mm.prefers_matmul_attention(q16, k16, mask, 0.0, {})
    assert mm.prefers_matmul_attention(q16, k16, None, 0.0, {})
    assert not mm.prefers_matmul_attention(q32, k32, mask, 0.0, {})  # float32: SDPA's kernel is as fast
    assert not mm.prefers_matmul_attention(q32.half(), k32.half(), mask, 0.0, {})  # float16 keeps SDPA
    assert not mm.prefers_matmul_attention(q16[:, :5], k16, mask, 0.0, {})  # 5 query heads on 2 key/value heads
    assert not mm.prefers_matmul_attention(q16[:1], k16, None, 0.0, {})  # SDPA broadcasts a batch of 1
    assert not mm.prefers_matmul_attention(q16, k16, mask, 0.1, {})  # dropout
    assert not mm.prefers_matmul_attention(q16, k16, mask, 0.0, {"softcap": 30.0})
    assert not mm.prefers_matmul_attention(q16, k16, mask, 0.0, {"position_bias": torch.zeros(1)})
    assert not mm.prefers_matmul_attention(q16, k16, mask.expand(3, 6, 5, 9), 0.0, {})  # a per-head mask
    # the score budget: (b, H, q, k) bf16 = 3·6·5·9·2 = 1,620 bytes
    assert mm.prefers_matmul_attention(q16, k16, mask, 0.0, {}) and 3 * 6 * 5 * 9 * 2 <= mm.MAX_SCORE_BYTES


def test_score_budget_sends_large_calls_to_sdpa(monkeypatch):
    q16, k16, _ = _qkv(dtype=torch.bfloat16)
    monkeypatch.setattr(mm, "MAX_SCORE_BYTES", 3 * 6 * 5 * 9 * 2)
    assert mm.prefers_matmul_attention(q16, k16, None, 0.0, {})
    monkeypatch.setattr(mm, "MAX_SCORE_BYTES", 3 * 6 * 5 * 9 * 2 - 1)
    assert not mm.prefers_matmul_attention(q16, k16, None, 0.0, {})


def _model():
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=200, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg).train()


def _left_padded(b=4, L=12, seed=2):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([12, 9, 6, 3])[:b]
    mask = (torch.arange(L)[None] >= (L - lengths)[:, None]).long()
    ids = torch.randint(1, 200, (b, L), generator=g) * mask
    return ids, mask, torch.clamp(mask.cumsum(-1) - 1, min=0)


def test_bf16_model_takes_the_path_and_stays_as_close_to_float32_as_sdpa(monkeypatch):
    # a bf16 copy of a float32 model, through transformers' "sdpa" entry: with the path, and with it switched off
    # (plain SDPA), the log-probs of the valid tokens differ from the float32 model's by the same order
    ref = _model()
    model = copy.deepcopy(ref).to(torch.bfloat16)
    ids, mask, pos = _left_padded()
    calls = []
    real = mm.matmul_attention
    monkeypatch.setattr(packing, "matmul_attention", lambda *a, **k: calls.append(1) or real(*a, **k))

    def logprobs(m):
        with torch.no_grad():
            logits = m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        return torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]

    valid = (mask[:, :-1] * mask[:, 1:]).bool()
    exact = logprobs(ref)
    ours = logprobs(model)
    assert len(calls) == 2  # one per layer
    monkeypatch.setattr(packing, "prefers_matmul_attention", lambda *a: False)
    theirs = logprobs(model)
    assert len(calls) == 2
    err_ours = float((ours - exact).abs()[valid].max())
    err_sdpa = float((theirs - exact).abs()[valid].max())
    assert err_ours > 0  # bf16 really ran
    assert err_ours <= 2 * err_sdpa + 1e-3, (err_ours, err_sdpa)


def test_bf16_padding_queries_keep_gradients_finite():
    # rows 1-3 start with left padding: those queries see no valid key (every key masked) and must not put NaN into
    # the gradients that the valid tokens' loss sends back
    model = _model().to(torch.bfloat16)
    ids, mask, pos = _left_padded()
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    (torch.log_softmax(logits.float(), -1)[..., 0] * mask).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g.float()).all() for g in grads)


def test_packed_prompt_grid_takes_the_path_in_bf16(monkeypatch):
    # the per-sequence grid of a packed forward (is_causal, no mask) goes through the same dispatch
    model = _model().to(torch.bfloat16)
    ids, mask, pos = _left_padded()
    calls = []
    real = mm.matmul_attention
    monkeypatch.setattr(packing, "matmul_attention", lambda *a, **k: calls.append(k.get("is_causal")) or real(*a, **k))
    with torch.no_grad():
        packed = packing.packed_logits(model, ids, mask, pos)
        assert calls == [True, True]  # one per layer, causal over each sequence's row of the grid
        padded = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    valid = mask.bool()
    # both bf16 through the same arithmetic but for the grid layout: equal to bf16 rounding of the logits
    assert torch.allclose(packed[valid].float(), padded[valid].float(), atol=0.05)


def test_bf16_float32_minimum_mask_keeps_a_fully_masked_row_finite():
    # an additive float32 mask (float32's minimum would overflow to -inf in bf16) with row 0's query 0 seeing no key:
    # every output finite, the fully masked row the average of the values (as eager attention gives)
    query, key, value = _qkv(b=2, H=2, KV=2, q=3, k=4, dtype=torch.bfloat16)
    keep = torch.ones(2, 1, 3, 4, dtype=torch.bool)
    keep[0, 0, 0] = False
    mask = torch.zeros(2, 1, 3, 4).masked_fill(~keep, torch.finfo(torch.float32).min)
    out, _ = mm.matmul_attention(_Attn(1), query, key, value, mask)
    assert torch.isfinite(out.float()).all()
    assert torch.allclose(out[0, 0].float(), value[0, :, :, :].float().mean(1), atol=0.02)


def test_the_sdpa_entry_passes_dropout_on(monkeypatch):
    # dropout > 0 (attention dropout in training) goes to SDPA with its probability, in bf16 as in float32
    seen = []
    monkeypatch.setattr(packing, "_SDPA", lambda m, q, k, v, mask, dropout, **kw: seen.append(dropout) or (q, None))
    query, key, value = _qkv(dtype=torch.bfloat16)
    packing.sdpa(_Attn(3), query, key, value, None, dropout=0.25)
    packing.sdpa(_Attn(3), query.float(), key.float(), value.float(), None, 0.5)
    assert seen == [0.25, 0.5]
