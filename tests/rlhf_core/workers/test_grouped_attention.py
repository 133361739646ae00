"""The grouped decode attention (rlhf_core/kernels/grouped_attention.py) against SDPA over the per-row
concatenated cache: uneven groups in any row order, left-padded prompts, GQA, fp32 and bf16."""
from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlhf_core.kernels.grouped_attention import _ACTIVE, group_cache, grouped_attention


# row -> prompt layouts: groups of 3, 1 and 2 rows interleaved; 2 rows per prompt side by side (rollout.n's order);
# distinct prompts (groups of one row, as the rollout's decode runs them too); with and without left padding
LAYOUTS = [([2, 0, 1, 0, 2, 0], True), ([0, 0, 1, 1, 2, 2], True), ([0, 1, 2], True), ([0, 1, 2], False)]


@pytest.mark.parametrize("rows,padded", LAYOUTS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_grouped_attention_equals_sdpa_over_the_row_cache(dtype, tol, rows, padded):
    g = torch.Generator().manual_seed(0)
    u, KV, H, P, d, steps = 3, 2, 6, 9, 16, 4
    inverse = torch.tensor(rows)
    b = inverse.numel()
    prompt_mask = torch.ones(u, P, dtype=torch.long)
    if padded:
        prompt_mask[0, :4], prompt_mask[2, :1] = 0, 0  # left padding of prompts 0 and 2
    kp, vp = (torch.randn(u, KV, P, d, generator=g).to(dtype) for _ in range(2))
    cache = DynamicCache()
    cache.layers.append(DynamicLayer())
    cache.layers[0].update(kp, vp)
    active = group_cache(cache, inverse, prompt_mask, steps)
    assert active is not None
    module = types.SimpleNamespace(layer_idx=0)
    rows_k, rows_v = kp[inverse], vp[inverse]
    token = _ACTIVE.set(active)
    try:
        for _ in range(steps):
            q = torch.randn(b, H, 1, d, generator=g).to(dtype)
            k, v = (torch.randn(b, KV, 1, d, generator=g).to(dtype) for _ in range(2))
            cache.update(k, v, 0)
            got, _ = grouped_attention(module, q, k, v, None, scaling=0.3)
            rows_k, rows_v = torch.cat([rows_k, k], 2), torch.cat([rows_v, v], 2)
            mask = torch.cat([prompt_mask[inverse].bool(), torch.ones(b, rows_k.shape[2] - P, dtype=torch.bool)], 1)
            want = F.scaled_dot_product_attention(q.float(), rows_k.float(), rows_v.float(), attn_mask=mask[:, None, None],
                                                  scale=0.3, enable_gqa=True).transpose(1, 2)
            assert got.shape == (b, 1, H, d) and got.dtype == dtype
            torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    finally:
        _ACTIVE.reset(token)
    assert cache.layers[0].get_seq_length() == P + steps


def test_outside_a_grouped_decode_it_refuses():
    with pytest.raises(RuntimeError, match="one-token decode steps"):
        grouped_attention(types.SimpleNamespace(layer_idx=0), torch.zeros(1, 2, 1, 4), None, None, None)


def _tiny(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, pad_token_id=0)
    config, cls = (Qwen2Config, Qwen2ForCausalLM) if kind == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    return cls(config(**sizes)).eval()


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("packed,dtype", [(False, torch.float32), (True, torch.float32), (True, torch.bfloat16)])
def test_decode_step_is_the_models_forward(kind, packed, dtype):
    # the same tokens through decode_step and through model(...) (both on the grouped attention, each with its own
    # cache from the same prefill): identical logits at every step with the model's modules; with the oneDNN
    # products (q/k/v and gate/up fused, other summation orders) equal to float rounding: fp32 to 1e-5, bf16 to
    # 3e-2 (a few bf16 steps, 2^-8 each, on logits of order 1). The steps really ran the chosen path: the modules'
    # projections are never called on the packed one.
    from rlhf_core.kernels.grouped_attention import decode_step, grouped_decode, supports_decode_step
    from rlhf_core.kernels.packed_linear import DecodeWeights

    model = _tiny(kind).to(dtype)
    assert supports_decode_step(model)
    g = torch.Generator().manual_seed(3)
    u, n, P = 3, 2, 6
    prompts = torch.randint(1, 64, (u, P), generator=g)
    pmask = torch.ones(u, P, dtype=torch.long)
    pmask[1, :2] = 0
    inverse = torch.arange(u).repeat_interleave(n)
    pos0 = (pmask.cumsum(-1) - 1).clamp(min=0)
    weights = DecodeWeights.of(model, u * n) if packed else None
    assert (weights is not None) == packed
    module_calls = []
    hooks = [m.register_forward_hook(lambda *a: module_calls.append(1))
             for m in (model.model.layers[0].self_attn.q_proj, model.model.layers[1].mlp.up_proj, model.lm_head)]
    caches = []
    with torch.no_grad():
        for _ in range(2):
            cache = DynamicCache(config=model.config)
            model(input_ids=prompts, attention_mask=pmask, position_ids=pos0, cache=cache, use_cache=True)
            caches.append((cache, group_cache(cache, inverse, pmask, 5)))
        position = pos0[inverse, -1:]
        for step in range(5):
            tok = torch.randint(1, 64, (u * n, 1), generator=g)
            position = position + 1
            module_calls.clear()
            with grouped_decode(model, caches[0][1]):
                fast = decode_step(model, tok, position, weights)
            assert len(module_calls) == (0 if packed else 3)
            with grouped_decode(model, caches[1][1]):
                ref = model(input_ids=tok, position_ids=position, cache=caches[1][0], use_cache=True).logits
            assert fast.shape == ref.shape and fast.dtype == dtype
            if not packed:
                assert torch.equal(fast, ref), step
            else:
                tol = 1e-5 if dtype == torch.float32 else 3e-2
                torch.testing.assert_close(fast, ref, rtol=tol, atol=tol)
    for h in hooks:
        h.remove()
    assert caches[0][0].layers[0].n == 5


def test_the_attention_implementation_is_restored_after_an_error():
    # an exception inside the decode steps (raised by the final norm at its second call: the first decode step, after
    # the prefill; the decode step's LM head is a oneDNN product, not the module) must not leave the model on the grouped attention, which outside a grouped decode refuses to run
    from rlhf_core.workers.rollout.hf_decode import decode

    model = _tiny("qwen2")
    ids = torch.randint(1, 64, (2, 5)).repeat_interleave(2, 0)
    calls = []

    def fail_on_second_call(module, args):
        calls.append(1)
        if len(calls) == 2:
            assert model.config._attn_implementation != "sdpa"  # inside the grouped decode
            raise KeyboardInterrupt("stop")

    handle = model.model.norm.register_forward_pre_hook(fail_on_second_call)
    with pytest.raises(KeyboardInterrupt):
        decode(model, ids, torch.ones_like(ids), 3, [], 0, False)
    handle.remove()
    assert len(calls) == 2 and model.config._attn_implementation == "sdpa"
    out, _ = decode(model, ids, torch.ones_like(ids), 3, [], 0, False)  # and decodes normally afterwards
    assert out.shape == (4, 3)
