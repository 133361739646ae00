"""The entropy keys of the actor and the reference (``calculate_entropy``, ``entropy_from_logits_with_chunking``,
``entropy_from_logits_chunk_size``, ``entropy_checkpointing``) and their ``fsdp_config`` copies, which the actor
object reads (verl 0.9's new engine reads the copies; each follows the role's key by default)."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from rlhf_core.algos.loss_agg import agg_loss
from rlhf_core.config import load_config
from rlhf_core.workers.actor import DataParallelPPOActor

from tests.rlhf_core.workers.test_workers_update_pins import fixed_batch, tiny_config

ROLES = {"actor": lambda cfg: cfg.actor_rollout_ref.actor, "ref": lambda cfg: cfg.actor_rollout_ref.ref}


def _actor(role: str, *overrides: str) -> DataParallelPPOActor:
    torch.manual_seed(0)
    return DataParallelPPOActor(ROLES[role](load_config("ppo_trainer", list(overrides))),
                                Qwen2ForCausalLM(tiny_config()))


@pytest.mark.parametrize("role", list(ROLES))
@pytest.mark.parametrize("spelling", ["{r}.", "{r}.fsdp_config."])
def test_chunking_is_read_from_either_spelling(role, spelling):
    prefix = "actor_rollout_ref." + spelling.format(r=role)
    default = _actor(role)
    assert (default.entropy_chunk_rows, default.entropy_checkpointing) == (None, False)
    a = _actor(role, f"{prefix}entropy_from_logits_with_chunking=True", f"{prefix}entropy_from_logits_chunk_size=3",
               f"{prefix}entropy_checkpointing=True")
    assert (a.entropy_chunk_rows, a.entropy_checkpointing) == (3, True)


def test_chunked_entropy_equals_the_default(monkeypatch):
    # rows are independent: any chunking gives the same entropies, bit for bit
    logits = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1)) * 4
    chunked = _actor("actor", "actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
                     "actor_rollout_ref.actor.entropy_from_logits_chunk_size=3")
    calls = []
    real = chunked._entropy_fn
    chunked._entropy_fn = lambda x, **kw: calls.append(kw) or real(x, **kw)
    out = chunked.entropy(logits)
    assert calls == [{"chunk_rows": 3}]  # 10 rows in chunks of 3 (4 chunks), not the default 128
    assert torch.equal(out, _actor("actor").entropy(logits))
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(out, -(p * p.log()).sum(-1))  # H = −Σ p log p


def _saved_bytes(fn, x):
    total = []

    def pack(t):
        total.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    return out, sum(total)


def test_entropy_checkpointing_keeps_less_and_gives_the_same_gradient():
    logits = (torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(2)) * 3).requires_grad_(True)
    w = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
    grads, saved = {}, {}
    for on in (False, True):
        actor = _actor("actor", f"actor_rollout_ref.actor.entropy_checkpointing={on}")
        out, saved[on] = _saved_bytes(actor.entropy, logits)
        (g,) = torch.autograd.grad((out * w).sum(), logits)
        grads[on] = g
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-6, atol=1e-7)
    # stored: the float32 log-softmax and its exp, (12, 32) each, at least; recomputed: nothing of the entropy's
    assert saved[False] >= 2 * 12 * 32 * 4 and saved[True] < saved[False] / 2


def _one_step(*overrides: str):
    """One update (one mini-batch of all 8 rows, one epoch, micro-batches of 2) from fixed weights: (metrics, the
    entropies of compute_log_prob at the initial weights, the updated weights)."""
    base = ["actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.ppo_epochs=1"]
    actor = _actor("actor", *base, *overrides)
    actor.optimizer = torch.optim.AdamW(actor.model.parameters(), lr=1e-2)
    actor.mini_batch_size, actor.micro_batch_size = 8, 2
    batch = fixed_batch()
    _, ent = actor.compute_log_prob(batch, 8)
    metrics = actor.update_policy(batch)
    return metrics, ent, torch.cat([p.detach().reshape(-1) for p in actor.model.parameters()])


def test_calculate_entropy_logs_the_update_entropy_without_changing_the_update():
    off, _, w_off = _one_step()
    on, ent, w_on = _one_step("actor_rollout_ref.actor.calculate_entropy=True")
    assert "actor/entropy_loss" not in off
    assert torch.equal(w_on, w_off) and on["actor/pg_loss"] == off["actor/pg_loss"]  # a metric only
    # the update's entropy is taken before its one step: the token-mean of the initial entropies; near-uniform
    # over V = 32 at init, so about log 32 = 3.466
    expected = agg_loss(ent, fixed_batch()["response_mask"], "token-mean").item()
    assert on["actor/entropy_loss"] == pytest.approx(expected, rel=1e-5)
    assert abs(expected - torch.log(torch.tensor(32.0)).item()) < 0.05
