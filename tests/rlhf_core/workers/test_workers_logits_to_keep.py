"""The actor's response-logits forward runs the LM head on the response positions only (``logits_to_keep``): its
log-probs, entropies and gradients equal those of the full-sequence head (padded and packed), and a value model
without ``logits_to_keep`` keeps the full forward."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from rlhf_core.algos.utils import entropy_from_logits, logprobs_from_logits
from rlhf_core.protocol import Batch
from rlhf_core.workers.actor import accepts_logits_to_keep, forward_response_logits
from rlhf_core.kernels.packing import packed_logits

T = 6


def _config(**extra):
    return Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, **extra)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(_config())


def _batch():
    """4 rows: left-padded prompts of 9, 4, 7, 2 tokens (P = 9), right-padded responses of 6, 3, 1, 5 tokens."""
    g = torch.Generator().manual_seed(2)
    P, B = 9, 4
    ids = torch.zeros((B, P + T), dtype=torch.long)
    mask = torch.zeros((B, P + T), dtype=torch.long)
    for i, (p, r) in enumerate(((9, 6), (4, 3), (7, 1), (2, 5))):
        ids[i, P - p:P + r] = torch.randint(1, 300, (p + r,), generator=g)
        mask[i, P - p:P + r] = 1
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0),
                  "responses": ids[:, P:]}, {}, {})


def _reference_logits(model, mb, packed=False):
    """The head over every position, then the response slice (the path before logits_to_keep), padded or packed."""
    if packed:
        return packed_logits(model, mb["input_ids"], mb["attention_mask"], mb["position_ids"])[:, -T - 1:-1]
    out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"],
                use_cache=False)
    return out.logits[:, -T - 1:-1]


def _terms(logits, mb):
    """(log-probs, entropies, a scalar loss of both over the response mask) from response logits (b, T, V)."""
    lp = logprobs_from_logits(logits.float(), mb["responses"])
    ent = entropy_from_logits(logits.float())
    resp_mask = mb["attention_mask"][:, -T:].float()
    return lp, ent, ((lp * 0.7 - ent * 0.3) * resp_mask).sum()


def _grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("packed", [False, True])
def test_kept_logits_equal_full_head(model, packed):
    mb = _batch()
    resp_mask = mb["attention_mask"][:, -T:].bool()
    lp_ref, ent_ref, loss_ref = _terms(_reference_logits(model, mb, packed), mb)
    g_ref = _grads(model, loss_ref)
    lp, ent, loss = _terms(forward_response_logits(model, mb, T, use_remove_padding=packed), mb)
    g = _grads(model, loss)
    # packed rows hold 0 logits at pads (unpack_output); compare where the response is valid
    torch.testing.assert_close(lp[resp_mask], lp_ref[resp_mask], rtol=0, atol=1e-6)
    torch.testing.assert_close(ent[resp_mask], ent_ref[resp_mask], rtol=0, atol=1e-6)
    assert g.keys() == g_ref.keys() and "lm_head.weight" in g
    for name in g:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-5, atol=1e-6, msg=name)


def test_head_runs_on_the_response_positions_only(model):
    mb = _batch()
    seen = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    try:
        with torch.no_grad():
            forward_response_logits(model, mb, T)
            forward_response_logits(model, mb, T, use_remove_padding=True)
    finally:
        hook.remove()
    # padded: 4 rows × T positions (the forward stops before the last column, whose logits predict nothing);
    # packed: the valid tokens of the last T + 1 columns (the prompt's last token + the responses: 1+6, 1+3, 1+1,
    # 1+5 = 19), instead of all 4 × 15 = 60 / 44 valid positions
    assert seen == [(4, T, 32), (1, 19, 32)]


def test_an_empty_response_gives_no_logits(model):
    # T = 0: (b, 0, V), not every position's logits (logits_to_keep=0 means "all" in transformers)
    mb = _batch()
    with torch.no_grad():
        got = forward_response_logits(model, mb, 0)
    assert got.shape == (4, 0, 300)


def test_value_model_without_logits_to_keep_keeps_the_full_forward():
    torch.manual_seed(0)
    critic = Qwen2ForTokenClassification(_config(num_labels=1)).eval()  # eval: no classifier dropout
    assert not accepts_logits_to_keep(critic) and accepts_logits_to_keep(Qwen2ForCausalLM(_config()))
    mb = _batch()
    with torch.no_grad():
        full = critic(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                      position_ids=mb["position_ids"]).logits[:, -T - 1:-1]
        got = forward_response_logits(critic, mb, T)
    # equal to float rounding, not bitwise: the forward stops one column early (its last position predicts nothing),
    # and on some CPUs (an AMD EPYC here) BLAS blocks the narrower matrices differently (differences of 7e-9 on
    # values of 1e-2); a column shifted by one would differ by about the values themselves
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-6)


def _left_padded(mb, extra):
    """``mb`` with ``extra`` more all-padding columns in front (a longer ``data.max_prompt_length``)."""
    def pad(t):
        return torch.cat([torch.zeros((t.shape[0], extra), dtype=t.dtype), t], dim=1)

    return Batch({"input_ids": pad(mb["input_ids"]), "attention_mask": pad(mb["attention_mask"]),
                  "position_ids": pad(mb["position_ids"]), "responses": mb["responses"]}, {}, {})


@pytest.mark.parametrize("packed", [False, True])
def test_all_padding_leading_columns_are_dropped_with_the_same_outputs_and_grads(model, packed):
    """Prompts left-padded to a max_prompt_length longer than the micro-batch's longest prompt: the 5 extra columns
    (and none of the 9-token prompt's) are cut before the model runs; log-probs, entropies and grads are those of
    the tight batch."""
    tight, wide = _batch(), _left_padded(_batch(), 5)
    widths = []
    hook = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: widths.append(inp[0].shape[-1]))
    try:
        lp_ref, ent_ref, loss_ref = _terms(forward_response_logits(model, tight, T, use_remove_padding=packed), tight)
        g_ref = _grads(model, loss_ref)
        lp, ent, loss = _terms(forward_response_logits(model, wide, T, use_remove_padding=packed), wide)
        g = _grads(model, loss)
    finally:
        hook.remove()
    # padded: both forwards see 9 + 6 - 1 = 14 columns (not 20; the last column predicts nothing and is not run);
    # packed: the same valid tokens either way, (9+6) + (4+3) + (7+1) + (2+5) = 37
    assert widths == ([37, 37] if packed else [14, 14])
    resp_mask = tight["attention_mask"][:, -T:].bool()
    torch.testing.assert_close(lp[resp_mask], lp_ref[resp_mask], rtol=0, atol=1e-6)
    torch.testing.assert_close(ent[resp_mask], ent_ref[resp_mask], rtol=0, atol=1e-6)
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-5, atol=1e-6, msg=name)


def test_trim_left_padding_cuts_to_the_longest_row_keeps_full_and_empty_batches_and_3d_positions():
    from rlhf_core.workers.actor import trim_left_padding

    ids = torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9]])  # the longest row starts at column 1: one column goes
    mask = (ids > 0).long()
    out = trim_left_padding(ids, mask, mask.cumsum(-1))
    assert [t.tolist() for t in out] == [[[0, 5, 6], [7, 8, 9]], [[0, 1, 1], [1, 1, 1]], [[0, 1, 2], [1, 2, 3]]]
    full = torch.ones((2, 3), dtype=torch.long)
    assert trim_left_padding(full, full, full)[0].shape == (2, 3)  # a row starts at column 0: nothing to cut
    empty = torch.zeros((2, 3), dtype=torch.long)
    assert trim_left_padding(empty, empty, empty)[0].shape == (2, 3)  # no valid token: left as is
    pos3 = torch.arange(24).reshape(2, 3, 4)  # mrope-style (b, 3, S) positions: the sequence dimension is cut
    assert trim_left_padding(ids, mask, pos3)[2].tolist() == pos3[..., 1:].tolist()
