"""Continuous batching (rlhf_core/workers/rollout/hf_continuous.py) against the batched lockstep decode
(hf_decode.decode): the same tokens row for row greedy and with per-request seeded sampling, for prompts of
different lengths and requests stopping at different steps; a hand-predicted order of entering and finishing when
5 requests share 2 slots; a request's tokens independent of its slot and neighbours; a weight change between two
steps continues from prompt + tokens under the new weights."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlhf_core.workers.rollout.hf_continuous import ContinuousDecoder, call_uniforms
from rlhf_core.workers.rollout.hf_decode import decode

PAD = 0
VOCAB = 96


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        pad_token_id=PAD, bos_token_id=1, eos_token_id=2,
                                        attn_implementation="sdpa")).eval()


def _prompts():
    """Six prompts of lengths 7, 3, 5, 1, 7, 2 (the last two repeated: rollout.n-style duplicates), as lists."""
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, VOCAB, (length,), generator=g) for length in (7, 3, 5, 1, 7, 2)]
    return rows + [rows[4], rows[5]]


def _left_pad(rows):
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):], mask[i, P - len(r):] = r, 1
    return ids, mask


def _eos_mid_batch(model, ids, mask, T):
    """A token greedy decoding emits in some rows but not all (so rows end at different steps)."""
    seq, _ = decode(model, ids, mask, T, [], PAD, do_sample=False, fast=False)
    for tok in seq[0, 1:].tolist():
        if 0 < int((seq == tok).any(1).sum()) < len(seq):
            return tok
    raise AssertionError("no token of row 0 is emitted by only some rows; change the prompts' seed")


def _continuous(model, prompts, T, eos, slots, do_sample, seeds, max_new=None, **warp):
    engine = ContinuousDecoder(model, slots, eos, do_sample, output_logits=True, **warp)
    for i, p in enumerate(prompts):
        engine.submit(p, T if max_new is None else max_new[i], seed=seeds[i])
    done = {f.request: f for f in engine.run()}
    return engine, [done[i] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def eos(model):
    ids, mask = _left_pad(_prompts())
    return [_eos_mid_batch(model, ids, mask, 12)]


WARP = {"temperature": 0.7, "top_k": 20, "top_p": 0.9}


@pytest.mark.parametrize("slots,do_sample,warp", [(3, False, {}), (3, True, {}), (3, True, WARP), (8, True, WARP)])
def test_equals_the_batched_decode_row_for_row(model, eos, slots, do_sample, warp):
    prompts = _prompts()
    ids, mask = _left_pad(prompts)
    T = 12
    seeds = [100 + i for i in range(len(prompts))]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    want, want_logits = decode(model, ids, mask, T, eos, PAD, do_sample=do_sample, output_logits=True, fast=False,
                               generators=gens, **warp)
    engine, got = _continuous(model, prompts, T, eos, slots, do_sample, seeds, **warp)
    lengths = [len(f.tokens) for f in got]
    assert len(set(lengths)) > 1  # requests really ended at different steps (EOS mid-batch)
    for i, f in enumerate(got):
        n = len(f.tokens)
        assert torch.equal(f.tokens, want[i, :n]), i
        assert (want[i, n:] == PAD).all()  # the batched row is padding after the request's last token
        # float32: same model, different batch composition/padding -> equal to float rounding
        torch.testing.assert_close(f.logits, want_logits[i, :n], rtol=0, atol=1e-5)
    if slots < len(prompts):  # slots were refilled: some request entered after step 0
        assert max(f.entered for f in got) > 0


def test_five_requests_two_slots_enter_and_finish_in_the_predicted_order(model):
    # no EOS; budgets 3, 5, 2, 4, 1 tokens. Step s samples one token per open request.
    # steps 0-2: r0 (slot 0) and r1 (slot 1); r0 has its 3 tokens at step 2 -> slot 0 free
    # step 3: r2 enters slot 0 (its prefill's token at step 3), ends at step 4 (2 tokens); r1 ends at step 4 (5);
    #   within a step, rows finish in row order (r2's row 0 before r1's row 1)
    # step 5: r3 takes slot 0, r4 slot 1 (lowest free slot first, submission order); r4 ends at step 5 (1 token)
    # steps 6-8: r3 alone (the free row is dropped), its 4th token at step 8
    prompts = _prompts()[:5]
    engine, got = _continuous(model, prompts, None, [], 2, False, [0] * 5, max_new=[3, 5, 2, 4, 1])
    assert engine.events == [(0, "enter", 0, 0), (0, "enter", 1, 1), (2, "finish", 0, 0), (3, "enter", 2, 0),
                             (4, "finish", 2, 0), (4, "finish", 1, 1), (5, "enter", 3, 0), (5, "enter", 4, 1),
                             (5, "finish", 4, 1), (8, "finish", 3, 0)]
    assert [len(f.tokens) for f in got] == [3, 5, 2, 4, 1]
    assert engine.step_index == 9  # 9 steps, where lockstep batches of 2 take 5 + 4 + 1 = 10 and 2 slots idle


def test_a_request_does_not_depend_on_its_slot_or_neighbours(model):
    prompts = _prompts()
    seeds = [7] * len(prompts)
    _, alone = _continuous(model, prompts[3:4], 10, [], 1, True, [7])
    _, crowded = _continuous(model, prompts[::-1], 10, [], 3, True, seeds)  # prompt 3 is 5th, enters later
    assert crowded[len(prompts) - 1 - 3].entered > 0
    assert torch.equal(alone[0].tokens, crowded[len(prompts) - 1 - 3].tokens)


def test_reprefill_continues_from_prompt_plus_tokens_under_new_weights(model):
    """Weights changed between two steps: the open requests continue as a fresh decode of ``prompt + tokens so
    far`` under the new weights would (greedy)."""
    other = Qwen2ForCausalLM(model.config).eval()
    torch.manual_seed(5)
    for p in other.parameters():
        torch.nn.init.normal_(p, std=0.5)
    prompts = _prompts()[:3]
    engine = ContinuousDecoder(model, 2, [], do_sample=False)
    for p in prompts:
        engine.submit(p, 6)
    for _ in range(3):
        engine.step()
    prefix = [list(engine.requests[i].tokens) for i in range(3)]
    assert [len(t) for t in prefix] == [3, 3, 0]
    engine.model = other
    engine.reprefill()
    done = {f.request: f for f in engine.run()}
    for i in range(3):
        seq = torch.cat([prompts[i], torch.tensor(prefix[i], dtype=torch.long)])
        ids, mask = _left_pad([seq])
        rest, _ = decode(other, ids, mask, 6 - len(prefix[i]), [], PAD, do_sample=False, fast=False)
        assert done[i].tokens.tolist() == prefix[i] + rest[0].tolist(), i
    assert done[0].tokens.tolist()[:3] == prefix[0]


def test_refuses_bad_requests(model):
    engine = ContinuousDecoder(model, 2, [], do_sample=False)
    with pytest.raises(ValueError, match="non-empty 1-D prompt"):
        engine.submit(torch.tensor([], dtype=torch.long), 4)
    with pytest.raises(ValueError, match="max_new_tokens >= 1"):
        engine.submit(torch.tensor([3, 4]), 0)
    with pytest.raises(ValueError, match="at least one slot"):
        ContinuousDecoder(model, 0, [], do_sample=False)


def test_call_uniforms_reproduce_the_existing_seeded_decode(model, eos):
    """``decode`` as the rollout calls it today (one seeded global stream for the call, default fast path): the
    continuous engine with each request's row of ``call_uniforms(seed, b, T)`` gives its tokens row for row, with 3
    slots for 8 requests (refilled) and EOS mid-batch."""
    prompts = _prompts()
    ids, mask = _left_pad(prompts)
    T = 12
    torch.manual_seed(123)
    want, _ = decode(model, ids, mask, T, eos, PAD, do_sample=True, temperature=0.8)
    u = call_uniforms(123, len(prompts), T)
    engine = ContinuousDecoder(model, 3, eos, do_sample=True, temperature=0.8)
    for i, p in enumerate(prompts):
        engine.submit(p, T, uniforms=u[i])
    done = {f.request: f for f in engine.run()}
    assert max(f.entered for f in done.values()) > 0 and len({len(f.tokens) for f in done.values()}) > 1
    for i in range(len(prompts)):
        n = len(done[i].tokens)
        assert torch.equal(done[i].tokens, want[i, :n]) and (want[i, n:] == PAD).all(), i
    # and the per-request streams differ from it: the test would see a wrong stream
    _, other = _continuous(model, prompts, T, eos, 3, True, list(range(len(prompts))), temperature=0.8)
    assert any(not torch.equal(o.tokens, want[i, :len(o.tokens)]) for i, o in enumerate(other))


def test_requests_submitted_after_the_batch_drained_reuse_the_engine(model):
    """Submitting after every row left (the rows dropped, the cache kept) and while others decode: each request's
    tokens are those it gets in a fresh engine (greedy: a wrong cache row or position would change them)."""
    prompts = _prompts()
    engine = ContinuousDecoder(model, 2, [], do_sample=False)
    engine.submit(prompts[0], 5)
    engine.run()
    assert engine.rows == []  # drained: rows dropped
    later = [engine.submit(prompts[i], 7) for i in (1, 2)]
    engine.step()
    engine.step()
    later.append(engine.submit(prompts[3], 4))  # waits for a slot while 1 and 2 decode
    got = {f.request: f.tokens for f in engine.run()}
    for index, i in zip(later, (1, 2, 3)):
        _, fresh = _continuous(model, [prompts[i]], 7 if i < 3 else 4, [], 1, False, [0])
        assert torch.equal(got[index], fresh[0].tokens), i
