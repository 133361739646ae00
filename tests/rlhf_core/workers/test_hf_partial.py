"""Partial rollouts on the HF engine (rlhf_core/workers/rollout/hf_partial.py): an interrupted generation resumed
after a weight load keeps its prefix, records each token's log-prob under the weights that sampled it, and without
an interrupt equals ``generate_sequences`` (same seed → same tokens)."""
from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlhf_core.config import shipped_config_dir
from rlhf_core.protocol import Batch
from rlhf_core.workers.rollout.hf_rollout import HFRollout
from tests.rlhf_core.workers.test_hf_decode import PAD, VOCAB, _prompts, _Tok

T = 12


@pytest.fixture(scope="module")
def weights():
    """(model A, the state dict of B = A with every parameter moved by N(0, 0.3²)); A's EOS ids: two tokens that A's
    sampled responses (seed 4, no EOS) hold at positions 5 and 6 of rows 0 and 3, so some rows end early (the
    draws before an EOS do not depend on the EOS ids: one uniform per row per step)."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                         pad_token_id=PAD, bos_token_id=1, eos_token_id=2)).eval()
    g = torch.Generator().manual_seed(3)
    b = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
    model.generation_config.eos_token_id = []
    free = _engine(model).generate_sequences(_batch())["responses"]
    model.generation_config.eos_token_id = sorted({int(free[0, 5]), int(free[3, 6])})
    return model, b


def _engine(model, seed=4, lean=True):
    cfg = OmegaConf.load(shipped_config_dir() / "ppo_trainer.yaml").actor_rollout_ref.rollout
    cfg.response_length, cfg.calculate_log_probs, cfg.top_k = T, True, 0
    rollout = HFRollout(copy.deepcopy(model), _Tok(), cfg, seed=seed)
    assert rollout.lean_decode
    rollout.lean_decode = lean
    return rollout


def _batch(do_sample=True):
    ids, mask = _prompts()
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)},
                 {}, {"validate": False, "do_sample": do_sample})


class _StopAt:
    """Stands for the engine's interrupt event: ``is_set`` is True at its ``k``-th question (after the k-th token
    of the first segment); ``clear`` (the weight load) ends it."""

    def __init__(self, k: int) -> None:
        self.k, self.asked, self.cleared = k, 0, False

    def is_set(self) -> bool:
        self.asked += 1
        return not self.cleared and self.asked == self.k

    def clear(self) -> None:
        self.cleared = True


def _teacher_forced(model, state, out, temperature):
    """log-softmax(logits / temperature) of ``model`` with ``state`` loaded at every response token of ``out``."""
    m = copy.deepcopy(model)
    if state is not None:
        m.load_state_dict(state)
    P = out["prompts"].shape[1]
    with torch.no_grad():
        logits = m(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                   position_ids=out["position_ids"]).logits[:, P - 1:-1]
    return torch.log_softmax(logits / temperature, -1).gather(-1, out["responses"][..., None]).squeeze(-1)


@pytest.mark.parametrize("lean", [True, False])
def test_without_an_interrupt_it_equals_generate_sequences(weights, lean):
    model, _ = weights
    ref = _engine(model, lean=lean).generate_sequences(_batch())
    rollout = _engine(model, lean=lean)
    assert rollout.start_partial(_batch()) is True
    out = rollout.finish_partial()
    assert rollout.calls == 1  # one training call consumed, as generate_sequences
    assert (ref["response_mask"].sum(1) < T).any() and (ref["response_mask"].sum(1) == T).any()  # EOS mid-batch
    for key in ref.keys():
        assert torch.equal(out[key], ref[key]), key
    assert torch.equal(out["rollout_last_segment"], torch.zeros(len(out), dtype=torch.long))


@pytest.mark.parametrize("lean", [True, False])
def test_interrupted_at_a_token_and_resumed_with_new_weights(weights, lean):
    model, b = weights
    k = 3  # the first segment stops after 3 tokens
    whole = _engine(model, lean=lean).generate_sequences(_batch())  # A only, same seed
    rollout = _engine(model, lean=lean)
    rollout._interrupt = _StopAt(k)
    assert rollout.start_partial(_batch()) is False
    assert rollout.partial.filled == k
    rollout.sync_weights(b)  # clears the interrupt
    assert rollout.resume_partial() is True
    out = rollout.finish_partial()
    mask = out["response_mask"].bool()
    # the prefix is what A sampled without the interrupt: same seed, same RNG stream up to token k
    assert torch.equal(out["responses"][:, :k], whole["responses"][:, :k])
    # rows that ended within the first k tokens were not resumed (segment 0); the others were (segment 1)
    ended = torch.isin(out["responses"][:, :k], torch.tensor(rollout.eos_ids)).any(1)
    assert torch.equal(out["rollout_last_segment"], (~ended).long())
    assert (~ended).any() and (out["response_mask"][~ended].sum(1) > k).any()  # some rows continued under B
    # each token's log-prob is that of the weights that sampled it: A before k, B from k on
    temperature = float(rollout.config.temperature)
    lp_a, lp_b = _teacher_forced(model, None, out, temperature), _teacher_forced(model, b, out, temperature)
    got = out["rollout_log_probs"]
    torch.testing.assert_close(got[:, :k][mask[:, :k]], lp_a[:, :k][mask[:, :k]], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[:, k:][mask[:, k:]], lp_b[:, k:][mask[:, k:]], rtol=1e-5, atol=1e-5)
    # and the two weight sets give different values there (the check above could fail)
    assert (got[:, k:][mask[:, k:]] - lp_a[:, k:][mask[:, k:]]).abs().max() > 1e-2


def test_greedy_resume_continues_prompt_plus_prefix_under_the_new_weights(weights):
    """The real event: interrupt() before the start stops after the first token (it stays set until the load);
    the greedy continuation equals B's greedy decoding of prompt + that token."""
    model, b = weights
    rollout = _engine(model)
    rollout.interrupt()
    assert rollout.start_partial(_batch(do_sample=False)) is False
    assert rollout.partial.filled == 1
    rollout.sync_weights(b)
    assert rollout.resume_partial() is True
    out = rollout.finish_partial()
    first = _engine(model).generate_sequences(_batch(do_sample=False))["responses"][:, :1]
    assert torch.equal(out["responses"][:, :1], first)
    ids, mask = _prompts()
    cont = _engine(model)
    cont.sync_weights(b)
    open_rows = ~torch.isin(first[:, 0], torch.tensor(cont.eos_ids))
    gen, _ = cont.decode_tokens(torch.cat([ids, first], -1)[open_rows], torch.cat([mask, torch.ones_like(first)], -1)
                                [open_rows], T - 1, {"do_sample": False, "temperature": 1.0, "top_k": 0, "top_p": 1.0},
                                False, False)
    assert torch.equal(out["responses"][open_rows, 1:1 + gen.shape[1]], gen)
    # B's continuation is not A's (the weights changed mid-response)
    assert not torch.equal(out["responses"], _engine(model).generate_sequences(_batch(do_sample=False))["responses"])


def test_release_after_a_failed_sync_lets_the_chunk_finish_with_the_weights_it_holds(weights):
    # the trainer's path when the weight load never comes (fully_async.sync_rollout -> release_generation): without
    # release the interrupt stays set and every resumed segment stops after one token; with it the resume runs to
    # the end in one segment and equals the uninterrupted generation (same weights A, same seed)
    model, _ = weights
    whole = _engine(model).generate_sequences(_batch())
    rollout = _engine(model)
    rollout.interrupt()
    assert rollout.start_partial(_batch()) is False and rollout.partial.filled == 1
    assert rollout.resume_partial() is False and rollout.partial.filled == 2  # still interrupted: one token
    rollout.release()
    assert rollout.resume_partial() is True
    out = rollout.finish_partial()
    assert torch.equal(out["responses"], whole["responses"])
    torch.testing.assert_close(out["rollout_log_probs"], whole["rollout_log_probs"], rtol=1e-5, atol=1e-5)
