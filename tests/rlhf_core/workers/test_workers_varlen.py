"""The packed forward's per-sequence attention on CPU (``kernels/packing.varlen_sdpa``): the grid layout by hand, the
logits and gradients of the padded forward (GQA, a mask with a hole, LoRA, activation checkpointing), each row
independent of the others in its pack, eager attention keeping transformers' path, clear errors for inputs a pack
cannot reproduce, and on CPU a micro-batch whose prompts repeat taking the shared-prefix path even with
``use_remove_padding``."""
from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface, Qwen2Config, Qwen2ForCausalLM

from rlhf_core.models.loading import enable_activation_checkpointing
from rlhf_core.protocol import Batch
from rlhf_core.workers import actor as actor_mod
from rlhf_core.kernels import packing
from rlhf_core.workers.actor import forward_response_logits
from rlhf_core.kernels.packing import (LAYOUT_KWARG, pack_inputs, packed_logits, packed_next_token_ce,
                                       supports_varlen_attention, varlen_layout)

T = 5


def _model(attn="sdpa"):
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    cfg._attn_implementation = attn
    return Qwen2ForCausalLM(cfg).train()


def _batch(prompts=((7, 5), (3, 2), (5, 4), (1, 5)), hole: bool = True, seed: int = 3):
    """Rows of left-padded prompts (P = 7) and right-padded responses (T = 5), ``(prompt, response)`` lengths as
    given; with ``hole``, row 0's third prompt token is masked out (a multi-turn mask), its positions counting
    the valid tokens only, as the rollout builds them."""
    g = torch.Generator().manual_seed(seed)
    P, B = 7, len(prompts)
    ids = torch.zeros((B, P + T), dtype=torch.long)
    mask = torch.zeros((B, P + T), dtype=torch.long)
    for i, (p, r) in enumerate(prompts):
        ids[i, P - p:P + r] = torch.randint(1, 200, (p + r,), generator=g)
        mask[i, P - p:P + r] = 1
    if hole:
        mask[0, 2] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)}


def _padded_logits(model, mb):
    return model(**mb, use_cache=False).logits


def _grads(model, logits, mask):
    model.zero_grad(set_to_none=True)  # (frozen parameters keep grad None and are left out)
    # a loss over valid positions only, with weights that differ per position (so a misplaced token shows)
    w = torch.arange(logits.shape[1], dtype=torch.float32)[None, :, None] + 1.0
    (torch.log_softmax(logits.float(), -1) * w * mask[..., None]).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to float32 rounding: within 1e-5 of ``b``'s largest magnitude (gradients here reach about 30)."""
    return bool((a - b).abs().max() <= 1e-5 * max(1.0, float(b.abs().max())))


class _Count:
    """Counts the attention calls that carry a pack's layout (the per-sequence path) during a test, by wrapping
    ``varlen_sdpa`` in transformers' registry."""

    def __enter__(self):
        self.calls = 0
        inner = packing.varlen_sdpa

        def counted(*args, **kwargs):
            self.calls += LAYOUT_KWARG in kwargs
            return inner(*args, **kwargs)

        AttentionInterface.register("sdpa", counted)
        return self

    def __exit__(self, *exc):
        AttentionInterface.register("sdpa", packing.varlen_sdpa)


def test_layout_by_hand():
    # row 0: 2 left pads then 3 tokens; row 1: 4 tokens then 1 right pad -> max_len 4; packed tokens 0-2 go to slots
    # 0-2 of row 0, tokens 3-6 to slots 4-7 (row 1); row 0's empty slot 3 points at token 0
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 0]])
    mask = (ids != 0).long()
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    _, packed_pos, index = pack_inputs(ids, mask, pos)
    layout = varlen_layout(mask, index, packed_pos)
    assert layout.rows == 2 and layout.max_len == 4
    assert layout.dst.tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert layout.src.tolist() == [0, 1, 2, 0, 3, 4, 5, 6]


@pytest.mark.parametrize("pos", [[0, 0, 0, 1, 3], [0, 0, 0, 1, 0]])
def test_positions_that_are_not_counts_are_refused(pos):
    # a gap (…1, 3) or a restart inside a row: the padded forward attends across it, a pack cannot
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 0]])
    mask = (ids != 0).long()
    with pytest.raises(ValueError, match="row 0, column 4 has position"):
        pack_inputs(ids, mask, torch.tensor([pos, [0, 1, 2, 3, 0]]))


def test_degenerate_inputs_are_refused_clearly():
    model = _model()
    mb = _batch()
    with pytest.raises(ValueError, match="shaped like attention_mask"):  # multi-axis rotary positions (b, 3, L)
        pack_inputs(mb["input_ids"], mb["attention_mask"], mb["position_ids"][:, None].expand(-1, 3, -1))
    with pytest.raises(ValueError, match="no valid token"):
        packed_logits(model, mb["input_ids"], torch.zeros_like(mb["attention_mask"]), mb["position_ids"])
    with pytest.raises(ValueError, match="keep_last=0"):
        packed_logits(model, **mb, keep_last=0)
    loss_mask = mb["attention_mask"].clone()
    loss_mask[1, 0] = 1  # row 1's column 0 is left padding
    with pytest.raises(ValueError, match="row 1, column 0"):
        packed_next_token_ce(model, **mb, loss_mask=loss_mask)


def test_sft_loss_equals_the_padded_sum():
    # Σ CE(logits[:, c], ids[:, c+1]) · loss_mask[:, c] over c < L-1, against the padded forward's
    model = _model()
    mb = _batch(hole=False)
    loss_mask = mb["attention_mask"].clone()
    loss_mask[:, :7] = 0  # train on the responses only, as SFT does
    logits = _padded_logits(model, mb)[:, :-1].float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), mb["input_ids"][:, 1:].reshape(-1),
                                           reduction="none").view(loss_mask.shape[0], -1)
    expected = (ce * loss_mask[:, :-1]).sum()
    with _Count() as count:
        got = packed_next_token_ce(model, **mb, loss_mask=loss_mask)
    assert count.calls == 2
    assert torch.allclose(got, expected, rtol=1e-6)


def test_varlen_equals_padded_logits_and_gradients():
    model = _model()
    mb = _batch()
    mask = mb["attention_mask"]
    ref = _padded_logits(model, mb)
    g_ref = _grads(model, ref, mask)
    with _Count() as count:
        out = packed_logits(model, **mb)
    assert count.calls == 2  # one per layer: the per-sequence attention ran
    valid = mask.bool()
    assert torch.allclose(out[valid], ref[valid], atol=1e-5)
    assert torch.all(out[~valid] == 0)
    g = _grads(model, out, mask)
    for k in g_ref:
        assert _close(g[k], g_ref[k]), k


def test_a_lora_model_packs_through_the_varlen_attention():
    # peft's wrapper passes the layout keyword down to the base model: the adapters' gradients match
    from rlhf_core.models.lora import apply_lora

    model = _model()
    lora = apply_lora(model, 4, 8)
    for name, p in lora.named_parameters():
        if "lora_B" in name:  # nonzero B so the adapters change the output and get gradients through A
            torch.nn.init.normal_(p, std=0.1)
    mb = _batch()
    mask = mb["attention_mask"]
    ref = _padded_logits(lora, mb)
    g_ref = {k: v for k, v in _grads(lora, ref, mask).items() if "lora_" in k}
    assert supports_varlen_attention(lora)
    with _Count() as count:
        out = packed_logits(lora, **mb)
    assert count.calls == 2
    valid = mask.bool()
    assert torch.allclose(out[valid], ref[valid], atol=1e-5)
    g = _grads(lora, out, mask)
    assert len(g_ref) == 28  # A and B of the 7 linear layers (q, k, v, o, gate, up, down) in each of 2 layers
    for k in g_ref:
        assert _close(g[k], g_ref[k]), k


def test_a_row_does_not_see_the_others():
    # row 1's logits alone equal row 1's inside the pack of four (each sequence attends to itself only)
    model = _model().eval()
    mb = _batch(hole=False)
    with torch.no_grad():
        together = packed_logits(model, **mb)[1]
        alone = packed_logits(model, **{k: v[1:2] for k, v in mb.items()})[0]
    valid = mb["attention_mask"][1].bool()
    assert torch.allclose(together[valid], alone[valid], atol=1e-6)


def test_keep_last_equals_the_padded_response_slice():
    model = _model()
    mb = _batch()
    resp_mask = mb["attention_mask"][:, -T:]
    ref = _padded_logits(model, mb)[:, -T:]
    with _Count() as count:
        out = packed_logits(model, **mb, keep_last=T)
    assert count.calls == 2 and out.shape == ref.shape
    valid = resp_mask.bool()
    assert torch.allclose(out[valid], ref[valid], atol=1e-5)


def test_checkpointed_layers_recompute_through_the_varlen_attention():
    # the layout is a forward keyword, which the checkpoint replays in its recompute: 2 layers' forwards and 2
    # recomputes attend per sequence, and the gradients are the padded forward's
    model = _model()
    mb = _batch()
    mask = mb["attention_mask"]
    ref = _padded_logits(model, mb)
    g_ref = _grads(model, ref, mask)
    enable_activation_checkpointing(model)
    with _Count() as count:
        out = packed_logits(model, **mb)
        g = _grads(model, out, mask)
    assert count.calls == 4
    valid = mask.bool()
    assert torch.allclose(out[valid], ref[valid], atol=1e-5)
    for k in g_ref:
        assert _close(g[k], g_ref[k]), k


def test_eager_attention_keeps_transformers_packing():
    model = _model("eager")
    mb = _batch()
    assert not supports_varlen_attention(model)
    with _Count() as count:
        out = packed_logits(model, **mb)
    assert count.calls == 0
    valid = mb["attention_mask"].bool()
    assert torch.allclose(out[valid], _padded_logits(model, mb)[valid], atol=1e-5)


def test_a_layout_for_another_pack_is_refused():
    q = torch.zeros(1, 4, 3, 8)
    layout = packing.VarlenLayout(torch.zeros(8, dtype=torch.long), torch.arange(5), 2, 4)
    with pytest.raises(RuntimeError, match="a layout of 5 tokens"):
        packing.varlen_sdpa(None, q, q, q, None, **{LAYOUT_KWARG: layout})


def test_repeated_prompts_take_the_shared_prefix_on_cpu(monkeypatch):
    # rows 0-1 and 2-3 share their prompts (rollout.n = 2): with use_remove_padding on CPU the prompt runs once per
    # pair (the shared-prefix path) with its prompt pass packed (per-sequence attention in each of the 2 layers; the
    # response pass attends to the cache), and the logits equal the padded forward's
    model = _model()
    mb = _batch(prompts=((6, 5), (6, 2), (3, 4), (3, 1)), hole=False)
    ids = mb["input_ids"]
    ids[1, :7], ids[3, :7] = ids[0, :7], ids[2, :7]
    calls = []
    real = actor_mod.shared_prefix_logits
    monkeypatch.setattr(actor_mod, "shared_prefix_logits", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    batch = Batch(dict(mb), {}, {})
    with _Count() as count:
        out = forward_response_logits(model, batch, T, use_remove_padding=True)
    assert len(calls) == 1 and calls[0] is not None and count.calls == 2
    ref = _padded_logits(model, mb)[:, -T - 1:-1]
    valid = mb["attention_mask"][:, -T:].bool()
    assert torch.allclose(out[valid], ref[valid], atol=1e-5)
    # distinct prompts: packed, through the per-sequence attention
    with _Count() as count:
        forward_response_logits(model, Batch(_batch(), {}, {}), T, use_remove_padding=True)
    assert count.calls == 2


def test_unpacked_forwards_are_transformers_own_sdpa_bitwise():
    # in float32 the "sdpa" entry diverts only calls carrying a layout: a padded forward and a cached decode step are
    # bitwise what transformers' own SDPA attention gives (bf16 on CPU goes to matmul_attention: its own tests)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model = _model().eval()
    mb = _batch()

    def run():
        with torch.no_grad():
            out = model(**mb, use_cache=True)
            step = model(input_ids=mb["input_ids"][:, -1:], position_ids=mb["position_ids"][:, -1:] + 1,
                         attention_mask=torch.cat([mb["attention_mask"], torch.ones(4, 1, dtype=torch.long)], 1),
                         cache=out.cache, use_cache=True)
        return out.logits, step.logits

    ours = run()
    AttentionInterface.register("sdpa", sdpa_attention_forward)
    try:
        theirs = run()
    finally:
        AttentionInterface.register("sdpa", packing.varlen_sdpa)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
