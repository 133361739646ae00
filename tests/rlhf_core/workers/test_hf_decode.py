"""The lean HF decode loop (rlhf_core/workers/rollout/hf_decode.py) against ``model.generate``: same tokens and raw
logits greedy, rows stopping at EOS mid-batch; sampled, the logits of the model on the drawn tokens and draws that
follow the warped distribution (inverse-transform sampling); HFRollout gives generate's batch greedy."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from rlhf_core.config import shipped_config_dir
from rlhf_core.protocol import Batch
from rlhf_core.kernels.grouped_attention import sdpa_full_attention, supports_grouped_decode
from rlhf_core.workers.rollout.hf_decode import (decode, next_token_probs, sample_categorical, sampling_warpers,
                                                 supports_lean_decode)
from rlhf_core.workers.rollout.hf_rollout import HFRollout

PAD = 0
VOCAB = 96


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        pad_token_id=PAD, bos_token_id=1, eos_token_id=2)).eval()


def _prompts(n=2):
    """Five prompts of lengths 7, 3, 5, 1, 7, each repeated ``n`` times (interleaved, like rollout.n), left-padded."""
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, VOCAB, (length,), generator=g) for length in (7, 3, 5, 1, 7)]
    rows = [r for r in rows for _ in range(n)]
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):], mask[i, P - len(r):] = r, 1
    return ids, mask


def _generate(model, ids, mask, T, eos, do_sample, temperature=1.0, top_k=0, top_p=1.0, seed=0):
    torch.manual_seed(seed)
    cfg = GenerationConfig(do_sample=do_sample, temperature=temperature if do_sample else None,
                           top_k=top_k if do_sample else None, top_p=top_p if do_sample else None, max_new_tokens=T,
                           num_beams=1, pad_token_id=PAD, eos_token_id=eos, return_dict_in_generate=True,
                           output_logits=True)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)


def _eos_mid_batch(model, ids, mask, T):
    """An EOS id that greedy decoding emits in some rows but not all, and not as every row's first token: a token of
    the greedy (no-EOS) continuation of row 0, chosen so the EOS test stops rows at different steps."""
    seq, _ = _generate(model, ids, mask, T, [], False)
    for tok in seq[0, 1:].tolist():
        hits = (seq == tok).any(1)
        if 0 < int(hits.sum()) < len(seq):
            return tok
    raise AssertionError("no token of row 0 is emitted by only some rows; change the prompts' seed")


def test_greedy_equals_generate_with_eos_mid_batch(model):
    assert supports_grouped_decode(model)
    ids, mask = _prompts()
    eos = _eos_mid_batch(model, ids, mask, 16)
    want, want_logits = _generate(model, ids, mask, 16, [eos], False)
    got, got_logits = decode(model, ids, mask, 16, [eos], PAD, do_sample=False, output_logits=True)
    assert torch.equal(got, want)
    # repeated prompts: the decode steps run the grouped attention (grouped_attention.py), equal to float rounding
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-5)
    stopped = (want == eos).any(1)
    assert stopped.any() and not stopped.all()  # EOS really came mid-batch: some rows ended, some did not
    after = (want == eos).long().cumsum(1) - (want == eos).long() > 0
    assert (want[after] == PAD).all()  # generate pads a finished row; so does decode (equal tensors)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 20, 0.9)])
def test_sampled_tokens_carry_the_models_logits_and_stop_at_eos(model, temperature, top_k, top_p):
    ids, mask = _prompts()
    eos = _eos_mid_batch(model, ids, mask, 16)
    torch.manual_seed(3)
    got, got_logits = decode(model, ids, mask, 16, [eos], PAD, True, temperature, top_k, top_p, output_logits=True)
    # the raw logits of every step are the model's, teacher-forced on the prompt + the drawn tokens (one forward)
    full_ids, full_mask = torch.cat([ids, got], 1), torch.cat([mask, torch.ones_like(got)], 1)
    with torch.no_grad():
        ref = model(input_ids=full_ids, attention_mask=full_mask,
                    position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)).logits[:, ids.shape[1] - 1:-1]
    ended = (got == eos).long().cumsum(1) - (got == eos).long() > 0  # steps after a row's EOS
    torch.testing.assert_close(got_logits[~ended], ref[~ended], rtol=1e-5, atol=1e-5)
    assert ended.any() and (got[ended] == PAD).all()  # some rows ended at the EOS, and were padded after it
    # no token outside top-k: every drawn token ranks within the top 20 of its step's logits
    if top_k:
        rank = (got_logits > got_logits.gather(-1, got[..., None])).sum(-1)
        assert (rank[~ended] < top_k).all()
    # repeated prompts (rollout.n = 2) were prefilled once but sampled independently
    assert not torch.equal(got[0::2], got[1::2])


def test_sample_categorical_is_the_inverse_cdf_of_its_uniforms():
    # probs [0.5, 0.3, 0.2, 0] → cdf [0.5, 0.8, 1.0, 1.0]: a uniform u in [0, 0.5) draws 0, [0.5, 0.8) draws 1,
    # [0.8, 1) draws 2, and token 3 (probability 0) never; the uniforms are the generator's, read back from a copy
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0]).expand(20000, 4)
    g = torch.Generator().manual_seed(11)
    u = torch.rand((20000, 1), generator=torch.Generator().manual_seed(11)).squeeze(1)
    got = sample_categorical(probs, g)
    assert torch.equal(got, (u >= 0.5).long() + (u >= 0.8).long())
    # frequencies within 5 standard errors (√(p(1−p)/n) ≤ 0.0036) of the probabilities
    freq = torch.bincount(got, minlength=4).double() / 20000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64), rtol=0, atol=0.018)
    # unnormalised rows and leading/trailing zeros: only the positive entries are drawn, each row on its own
    rows = sample_categorical(torch.tensor([[0.0, 0.0, 3.0], [0.0, 2.0, 0.0], [1e-30, 0.0, 0.0]]).repeat(500, 1))
    assert torch.equal(rows, torch.tensor([2, 1, 0]).repeat(500))
    # one-dimensional probabilities (the agent engine's single-row draw) give a 0-d index
    assert sample_categorical(torch.tensor([0.0, 1.0])).shape == ()
    # bf16 probabilities are summed in float32: a bf16 cumulative sum of 2,000 entries of 1/2000 moves in steps of
    # up to 2^-8 = 0.0039 (8 entries' mass), so most tokens would get an empty interval and never be drawn; in
    # float32, 20,000 draws reach all but e^-10 of the 2,000 tokens
    flat = torch.full((20000, 2000), 1 / 2000).to(torch.bfloat16)
    assert sample_categorical(flat, torch.Generator().manual_seed(2)).unique().numel() >= 1990
    # what torch.multinomial refuses is refused too, instead of returning the index V past the vocabulary
    for bad in ([0.0, 0.0], [float("nan"), 1.0], [float("inf"), 1.0], [-0.5, 1.5]):
        with pytest.raises(ValueError, match="finite and non-negative"):
            sample_categorical(torch.tensor([[0.5, 0.5], bad]))


def test_sampling_draws_from_generates_distribution(model):
    # one prompt repeated 4000 times, one step: the first token's frequencies against generate's own distribution
    # (its warped probabilities, output_logits of one generate call) within 5 standard errors
    ids, mask = _prompts(1)
    ids, mask = ids[1:2].repeat(4000, 1), mask[1:2].repeat(4000, 1)
    torch.manual_seed(5)
    got, logits = decode(model, ids, mask, 1, [], PAD, True, 0.7, 20, 0.9, output_logits=True)
    _, want_logits = _generate(model, ids[:1], mask[:1], 1, [], True, 0.7, 20, 0.9)
    # one step: the prefill, plain SDPA; to float rounding, as decode drops the 4 pad columns generate attends over
    torch.testing.assert_close(logits[:1], want_logits, rtol=0, atol=1e-6)
    p = next_token_probs(want_logits[:, 0], sampling_warpers(True, 0.7, 20, 0.9))[0].double()
    freq = torch.bincount(got[:, 0], minlength=VOCAB).double() / 4000
    assert (freq[p == 0] == 0).all()
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / 4000).sqrt() + 1e-9).all()


def test_distinct_prompts_with_padding_pass_a_prebuilt_mask_and_equal_generate_exactly(model):
    assert sdpa_full_attention(model)  # the reference path: per-row cache, the 4-D mask built once (SDPA)
    ids, mask = _prompts(1)
    want, want_logits = _generate(model, ids, mask, 10, [], False)
    got, got_logits = decode(model, ids, mask, 10, [], PAD, False, output_logits=True, fast=False)
    assert torch.equal(got, want)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)


def test_fast_path_on_distinct_prompts_equals_the_reference_path(model):
    # distinct prompts (groups of one row), left padding, an EOS that stops rows at different steps: the fast path
    # (grouped layout, decode_step on reordered weights) gives the reference path's greedy tokens, and its logits to
    # float rounding (other summation orders: oneDNN's products, attention by matrix products); the reference path's
    # logits are generate's exactly (test above). Both steps are the model's: a wrong cache row, position or mask
    # would move logits by far more than 1e-5 (the logits' spread here is ~0.1-1).
    ids, mask = _prompts(1)
    eos = _eos_mid_batch(model, ids, mask, 12)
    ref, ref_logits = decode(model, ids, mask, 12, [eos], PAD, False, output_logits=True, fast=False)
    seen = []
    hook = model.model.layers[0].self_attn.register_forward_hook(lambda *a: seen.append(1))
    try:  # decode_step calls the attention module's parts, never its forward: proof the fast step ran
        got, got_logits = decode(model, ids, mask, 12, [eos], PAD, False, output_logits=True)
    finally:
        hook.remove()
    assert seen == [1]  # the prefill's forward only
    assert torch.equal(got, ref) and (got == PAD).any()  # some row stopped early, padded after its EOS
    assert got_logits.shape == ref_logits.shape and float(ref_logits.std()) > 0.05
    torch.testing.assert_close(got_logits, ref_logits, rtol=0, atol=1e-5)


def test_grouped_decode_with_uneven_groups_in_any_row_order(model):
    # rows of prompts [0, 1, 0, 2, 0, 1, 3]: groups of 3, 2, 1 and 1 rows, not contiguous, with left padding;
    # each row's greedy continuation and logits are generate's (to float rounding: the grouped attention)
    ids, mask = _prompts(1)
    pick = torch.tensor([0, 1, 0, 2, 0, 1, 3])
    ids, mask = ids[pick], mask[pick]
    want, want_logits = _generate(model, ids, mask, 12, [], False)
    got, got_logits = decode(model, ids, mask, 12, [], PAD, False, output_logits=True)
    assert torch.equal(got, want)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-5)
    assert model.config._attn_implementation == "sdpa"  # restored after the decode


def _prefill_widths(model, run):
    """``run()``'s result and the input shapes of every forward of ``model`` during it."""
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    try:
        return run(), seen
    finally:
        hook.remove()


@pytest.mark.parametrize("n", [1, 2])  # distinct prompts (groups of one row) and repeated ones
def test_packed_prefill_and_dropped_pad_columns_give_generates_tokens_and_logits(model, n):
    # prompts of 7, 3, 5, 1, 7 tokens with 3 more all-pad columns in front (max_prompt_length > the longest
    # prompt): the prefill runs on 7 columns, not 10, and packed (use_remove_padding) on the 5 distinct prompts'
    # 23 valid tokens as one (1, 23) sequence. Greedy tokens are generate's; logits to float rounding.
    ids, mask = _prompts(n)
    pads = torch.zeros((len(ids), 3), dtype=torch.long)
    ids, mask = torch.cat([pads + PAD, ids], 1), torch.cat([pads, mask], 1)
    want, want_logits = _generate(model, ids, mask, 8, [], False)
    for packed, prefill in ((False, (5, 7)), (True, (1, 23))):
        (got, got_logits), seen = _prefill_widths(
            model, lambda: decode(model, ids, mask, 8, [], PAD, False, output_logits=True, pack_prompts=packed))
        assert seen[0] == prefill and len(seen) == 8  # the prefill, then 7 decode steps
        assert torch.equal(got, want)
        torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-5)


def test_no_eos_runs_every_step_and_no_padding_drops_the_mask(model):
    ids = torch.randint(3, VOCAB, (3, 4), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    want, want_logits = _generate(model, ids, mask, 9, [], False)
    got, got_logits = decode(model, ids, mask, 9, [], PAD, False, output_logits=True, fast=False)
    assert got.shape == (3, 9) and torch.equal(got, want)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)
    fast, fast_logits = decode(model, ids, mask, 9, [], PAD, False, output_logits=True)  # the fast path, unpadded
    assert torch.equal(fast, want)
    torch.testing.assert_close(fast_logits, want_logits, rtol=0, atol=1e-5)
    torch.manual_seed(7)
    assert decode(model, ids, mask, 9, [], PAD, True, 0.8)[0].shape == (3, 9)


def test_processed_probabilities_hand_derived():
    # logits (1, 5) = [2, 1, 0, -1, -2], temperature 0.5 → scores [4, 2, 0, -2, -4]; top_k 3 keeps 4, 2, 0;
    # softmax over those: e^4, e^2, e^0 / (e^4+e^2+1) = 0.8668, 0.1173, 0.0159; top_p 0.9: sorted ascending the
    # cumulative mass of the smallest (0.0159) is ≤ 1 − 0.9 = 0.1 → removed; 0.0159 + 0.1173 > 0.1 → 2 kept.
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -2.0]])
    probs = next_token_probs(logits, sampling_warpers(True, 0.5, 3, 0.9))
    e4, e2 = torch.exp(torch.tensor(4.0)), torch.exp(torch.tensor(2.0))
    torch.testing.assert_close(probs, torch.tensor([[e4 / (e4 + e2), e2 / (e4 + e2), 0.0, 0.0, 0.0]]))
    assert len(sampling_warpers(False, 0.5, 3, 0.9)) == 0  # greedy: argmax of the raw logits


def test_generation_config_with_extra_processors_falls_back_to_generate(model):
    assert supports_lean_decode(model)
    model.generation_config.repetition_penalty = 1.3
    try:
        assert not supports_lean_decode(model)
    finally:
        model.generation_config.repetition_penalty = None
    assert supports_lean_decode(model)


class _Tok:
    pad_token_id, eos_token_id = PAD, None


def test_hf_rollout_lean_equals_generate_greedy_and_logs_its_samples_log_probs(model):
    cfg = OmegaConf.load(shipped_config_dir() / "ppo_trainer.yaml").actor_rollout_ref.rollout
    cfg.response_length, cfg.calculate_log_probs, cfg.top_k = 12, True, 0
    ids, mask = _prompts()
    eos = _eos_mid_batch(model, ids, mask, 12)
    model.generation_config.eos_token_id = eos

    def run(lean, do_sample):
        batch = Batch({"input_ids": ids, "attention_mask": mask,
                       "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)}, {},
                      {"validate": False, "do_sample": do_sample})
        rollout = HFRollout(model, _Tok(), cfg, seed=4)
        assert rollout.lean_decode
        rollout.lean_decode = lean
        return rollout.generate_sequences(batch)

    try:
        lean, ref, sampled = run(True, False), run(False, False), run(True, True)
    finally:
        model.generation_config.eos_token_id = 2
    assert (ref["response_mask"].sum(1) < 12).any()  # some responses ended at the EOS
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(lean[key], ref[key]), key
    torch.testing.assert_close(lean["rollout_log_probs"], ref["rollout_log_probs"], rtol=0, atol=1e-5)
    # sampled: rollout_log_probs are log-softmax(logits / temperature) of the model at the drawn tokens
    P, temperature = ids.shape[1], float(cfg.temperature)
    with torch.no_grad():
        logits = model(input_ids=sampled["input_ids"], attention_mask=sampled["attention_mask"],
                       position_ids=sampled["position_ids"]).logits[:, P - 1:-1]
    want = torch.log_softmax(logits / temperature, -1).gather(-1, sampled["responses"][..., None]).squeeze(-1)
    m = sampled["response_mask"].bool()
    torch.testing.assert_close(sampled["rollout_log_probs"][m], want[m], rtol=1e-5, atol=1e-5)


def test_sliding_window_and_eager_models_keep_the_2d_mask():
    # a sliding-window layer builds its own (windowed) mask and eager attention adds a float mask: a prebuilt
    # boolean 4-D mask would be wrong for both, so decode keeps passing the 2-D padding mask there
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, pad_token_id=PAD)
    windowed = Qwen2ForCausalLM(Qwen2Config(**base, use_sliding_window=True, sliding_window=4, max_window_layers=0))
    eager = Qwen2ForCausalLM(Qwen2Config(**base, attn_implementation="eager"))
    assert not sdpa_full_attention(windowed) and not sdpa_full_attention(eager)
    ids, mask = _prompts()
    for m in (windowed.eval(), eager.eval()):  # and decode still equals generate there (greedy)
        want, _ = _generate(m, ids, mask, 8, [], False)
        assert torch.equal(decode(m, ids, mask, 8, [], PAD, False)[0], want)


def test_token_log_probs_follow_logprobs_mode_hand_values():
    # logits ln 6, ln 3, ln 1 and the drawn token 1 (logit ln 3). raw: softmax → 3/10. temperature 0.5 doubles the
    # logits (36 : 9 : 1) and top_k=2 drops the last: processed log-prob ln(9/45) = ln(1/5); logits: ln 3 and 2 ln 3
    from rlhf_core.workers.rollout.hf_decode import token_log_probs

    logits = torch.log(torch.tensor([[[6.0, 3.0, 1.0]]]))
    tok = torch.tensor([[1]])
    want = {"raw_logprobs": torch.log(torch.tensor(0.3)), "processed_logprobs": torch.log(torch.tensor(0.2)),
            "raw_logits": torch.log(torch.tensor(3.0)), "processed_logits": 2 * torch.log(torch.tensor(3.0))}
    for mode, value in want.items():
        got = token_log_probs(logits, tok, mode, True, 0.5, 2, 1.0)
        torch.testing.assert_close(got, value.reshape(1, 1), msg=mode)
    # greedy: no warpers, so processed equals raw
    torch.testing.assert_close(token_log_probs(logits, tok, "processed_logprobs", False, 1.0, 2, 1.0),
                               torch.log(torch.tensor([[0.3]])))
    with pytest.raises(ValueError, match="logprobs_mode='bogus'"):
        token_log_probs(logits, tok, "bogus", True, 0.5, 2, 1.0)


@pytest.mark.parametrize("lean", [True, False])
def test_hf_rollout_log_probs_follow_logprobs_mode(model, lean):
    # the same sampled rollout (same seed) under each rollout.logprobs_mode; rollout_log_probs checked against the
    # model's own forward on the drawn tokens: raw = log_softmax(logits), processed = log_softmax of
    # logits / temperature with all but the top 5 at -inf
    cfg = OmegaConf.load(shipped_config_dir() / "ppo_trainer.yaml").actor_rollout_ref.rollout
    cfg.response_length, cfg.calculate_log_probs, cfg.top_k, cfg.temperature = 6, True, 5, 0.7
    ids, mask = _prompts(1)
    outs = {}
    for mode in ("processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits"):
        cfg.logprobs_mode = mode
        rollout = HFRollout(model, _Tok(), cfg, seed=3)
        rollout.lean_decode = lean
        outs[mode] = rollout.generate_sequences(Batch(
            {"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)},
            {}, {"validate": False, "do_sample": True}))
    ref = outs["raw_logits"]
    for out in outs.values():
        assert torch.equal(out["responses"], ref["responses"])
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                       position_ids=ref["position_ids"]).logits[:, ids.shape[1] - 1:-1]
    scaled = logits / 0.7
    cut = scaled.masked_fill(scaled < scaled.topk(5, dim=-1).values[..., -1:], float("-inf"))
    at = ref["responses"][..., None]
    want = {"raw_logits": logits.gather(-1, at), "processed_logits": scaled.gather(-1, at),
            "raw_logprobs": torch.log_softmax(logits, -1).gather(-1, at),
            "processed_logprobs": torch.log_softmax(cut, -1).gather(-1, at)}
    m = ref["response_mask"].bool()
    for mode, value in want.items():
        torch.testing.assert_close(outs[mode]["rollout_log_probs"][m], value.squeeze(-1)[m], rtol=1e-4, atol=1e-4,
                                   msg=mode)
    # and the modes differ from one another on this model (top-5 of 96 tokens, temperature 0.7)
    assert not torch.allclose(outs["processed_logprobs"]["rollout_log_probs"][m],
                              outs["raw_logprobs"]["rollout_log_probs"][m], atol=1e-3)
