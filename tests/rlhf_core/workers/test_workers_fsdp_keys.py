"""FSDP2 settings of verl 0.9's FSDP engine that exist on FSDP2: ``fsdp_config.forward_prefetch`` (actor, reference,
``critic.fsdp``, the reward model, SFT's ``engine``) in one process (a single-rank gloo group)."""
from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlhf_core.distributed import LocalWorkerGroup
from rlhf_core.workers.fsdp_utils import apply_fsdp2


class _Rank:
    """Nothing but this process's single-rank group (LocalWorkerGroup joins it)."""


def _sharded(**fsdp_cfg) -> torch.nn.Module:
    LocalWorkerGroup(_Rank, {})
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                         num_attention_heads=2, num_key_value_heads=1))
    return apply_fsdp2(model, fsdp_cfg, "actor")


def _prefetched(model) -> list[list]:
    return [list(layer._get_fsdp_state()._states_to_forward_prefetch) for layer in model.model.layers]


def test_forward_prefetch_prefetches_the_next_layer_with_the_same_outputs():
    plain, prefetch = _sharded(), _sharded(forward_prefetch=True)
    assert _prefetched(plain) == [[], [], []]
    states = [layer._get_fsdp_state() for layer in prefetch.model.layers]
    assert _prefetched(prefetch) == [[states[1]], [states[2]], []]  # depth 1, as verl (FSDP1's limit)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    out = [m(input_ids=ids).logits for m in (plain, prefetch)]
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=0)
    out[1].square().sum().backward()  # the backward runs with the prefetch schedule too


def _fsdp_update(monkeypatch, *overrides: str):
    """One actor update (one mini-batch of 8 rows in 4 micro-batches of 2) of an FSDP2-sharded tiny Qwen2: (the
    updated weights, the set_requires_gradient_sync calls on the root)."""
    from torch.distributed.fsdp import FSDPModule

    from rlhf_core.config import load_config
    from rlhf_core.workers.actor import DataParallelPPOActor
    from tests.rlhf_core.workers.test_workers_update_pins import fixed_batch, tiny_config

    calls = []
    real = FSDPModule.set_requires_gradient_sync
    monkeypatch.setattr(FSDPModule, "set_requires_gradient_sync",
                        lambda self, flag, **kw: (calls.append(flag) if self is model else None,
                                                  real(self, flag, **kw))[1])
    LocalWorkerGroup(_Rank, {})
    torch.manual_seed(0)
    model = apply_fsdp2(Qwen2ForCausalLM(tiny_config()), {}, "actor")
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.actor.entropy_coeff=0.01", *overrides])
    actor = DataParallelPPOActor(cfg.actor_rollout_ref.actor, model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                                 mini_batch_size=8, micro_batch_size=2)
    actor.update_policy(fixed_batch())
    return torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()]).detach(), calls


def test_no_sync_for_gradient_accumulation_defers_the_reduction_with_the_same_update(monkeypatch):
    key = "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation"
    w_sync, calls_sync = _fsdp_update(monkeypatch)
    w_defer, calls_defer = _fsdp_update(monkeypatch, f"{key}=True")
    assert calls_sync == []
    assert calls_defer == [False, True] * 3  # micro-batches 1-3 skip the reduction; the 4th reduces all four
    torch.testing.assert_close(w_defer, w_sync, rtol=1e-5, atol=1e-6)
