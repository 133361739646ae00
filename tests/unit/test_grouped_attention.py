"""The grouped decode attention (rlhf_core/workers/rollout/grouped_attention.py) against SDPA over the per-row
concatenated cache: uneven groups in any row order, left-padded prompts, GQA, fp32 and bf16."""
from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlhf_core.workers.rollout.grouped_attention import _ACTIVE, group_cache, grouped_attention


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_grouped_attention_equals_sdpa_over_the_row_cache(dtype, tol):
    g = torch.Generator().manual_seed(0)
    u, KV, H, P, d, steps = 3, 2, 6, 9, 16, 4
    inverse = torch.tensor([2, 0, 1, 0, 2, 0])  # groups of 3, 1 and 2 rows, interleaved
    b = inverse.numel()
    prompt_mask = torch.ones(u, P, dtype=torch.long)
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
