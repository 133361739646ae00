"""The lean HF decode loop (rlhf_core/workers/rollout/hf_decode.py) against ``model.generate``: same tokens greedy and
sampled (same seed), same raw logits, rows stopping at EOS mid-batch; HFRollout gives the same batch either way."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from rlhf_core.protocol import Batch
from rlhf_core.workers.rollout.hf_decode import decode, next_token_probs, sampling_warpers, supports_lean_decode
from rlhf_core.workers.rollout.hf_rollout import HFRollout

REPO = Path(__file__).resolve().parents[2]
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
    ids, mask = _prompts()
    eos = _eos_mid_batch(model, ids, mask, 16)
    want, want_logits = _generate(model, ids, mask, 16, [eos], False)
    got, got_logits = decode(model, ids, mask, 16, [eos], PAD, do_sample=False, output_logits=True)
    assert torch.equal(got, want)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)
    stopped = (want == eos).any(1)
    assert stopped.any() and not stopped.all()  # EOS really came mid-batch: some rows ended, some did not
    after = (want == eos).long().cumsum(1) - (want == eos).long() > 0
    assert (want[after] == PAD).all()  # generate pads a finished row; so does decode (equal tensors)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 20, 0.9)])
def test_sampling_equals_generate_same_seed(model, temperature, top_k, top_p):
    ids, mask = _prompts()
    eos = _eos_mid_batch(model, ids, mask, 16)
    want, want_logits = _generate(model, ids, mask, 16, [eos], True, temperature, top_k, top_p, seed=3)
    torch.manual_seed(3)
    got, got_logits = decode(model, ids, mask, 16, [eos], PAD, True, temperature, top_k, top_p, output_logits=True)
    assert torch.equal(got, want)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)
    # repeated prompts (rollout.n = 2) were prefilled once but sampled independently
    assert not torch.equal(got[0::2], got[1::2])


def test_no_eos_runs_every_step_and_no_padding_drops_the_mask(model):
    ids = torch.randint(3, VOCAB, (3, 4), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    want, _ = _generate(model, ids, mask, 9, [], True, 0.8, seed=7)
    torch.manual_seed(7)
    got, _ = decode(model, ids, mask, 9, [], PAD, True, 0.8)
    assert got.shape == (3, 9) and torch.equal(got, want)


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


def test_hf_rollout_lean_equals_generate(model):
    cfg = OmegaConf.load(REPO / "configs" / "ppo_trainer.yaml").actor_rollout_ref.rollout
    cfg.response_length, cfg.calculate_log_probs, cfg.top_k = 12, True, 0
    ids, mask = _prompts()
    eos = _eos_mid_batch(model, ids, mask, 12)
    model.generation_config.eos_token_id = eos
    try:
        batch = Batch({"input_ids": ids, "attention_mask": mask,
                       "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)}, {}, {"validate": False})
        outs = []
        for lean in (True, False):
            rollout = HFRollout(model, _Tok(), cfg, seed=4)
            assert rollout.lean_decode
            rollout.lean_decode = lean
            outs.append(rollout.generate_sequences(batch))
    finally:
        model.generation_config.eos_token_id = 2
    lean, ref = outs
    assert (ref["response_mask"].sum(1) < 12).any()  # some responses ended at the EOS
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids", "rollout_log_probs"):
        assert torch.equal(lean[key], ref[key]), key
