"""FSDP2 settings of verl 0.9's FSDP engine that exist on FSDP2: ``fsdp_config.forward_prefetch`` (actor, reference,
``critic.fsdp``, the reward model, SFT's ``engine``) in one process (a single-rank gloo group, sharded with
``single_rank=True``: one rank otherwise runs the plain module)."""
from __future__ import annotations

import pytest
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
    return apply_fsdp2(model, fsdp_cfg, "actor", single_rank=True)


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
    model = apply_fsdp2(Qwen2ForCausalLM(tiny_config()), {}, "actor", single_rank=True)
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


@pytest.mark.parametrize("spelling", ["actor_rollout_ref.actor.pad_to_length",
                                      "actor_rollout_ref.actor.fsdp_config.pad_to_length"])
def test_pad_to_length_rounds_the_pack_up_with_the_same_log_probs(spelling, monkeypatch):
    from rlhf_core import kernels
    from rlhf_core.config import load_config
    from rlhf_core.workers import actor as actor_mod
    from tests.rlhf_core.workers.test_workers_update_pins import fixed_batch, tiny_config

    packs = []
    real = actor_mod.packed_logits
    monkeypatch.setattr(actor_mod, "packed_logits", lambda m, ids, mask, pos, **k: (packs.append(int(mask.sum())),
                                                                                   real(m, ids, mask, pos, **k))[1])
    out = {}
    for on in (False, True):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(tiny_config()).eval()
        kernels.prepare(model, "use_remove_padding")
        cfg = load_config("ppo_trainer", [f"{spelling}={on}",
                                          "actor_rollout_ref.actor.fsdp_config.pad_to_length_bucket=16"])
        actor = actor_mod.DataParallelPPOActor(cfg.actor_rollout_ref.actor, model, use_remove_padding=True)
        packs.clear()
        out[on] = actor.compute_log_prob(fixed_batch(), 4)
        out[f"packs{on}"] = list(packs)
    # fixed_batch: prompt 4 (row 0 has 2 pads) + responses of 5,4,3,5 | 2,5,1,4 tokens:
    # 4·4−2+17 = 31 and 4·4+12 = 28 valid tokens per micro-batch of 4 → 32 each with bucket 16
    assert out["packsFalse"] == [31, 28] and out["packsTrue"] == [32, 32]
    torch.testing.assert_close(out[True][0], out[False][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out[True][1], out[False][1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("setting, role", [("actor_rollout_ref.ref.pad_to_length", "ref"),
                                           ("actor_rollout_ref.actor.pad_to_length", "ref"),  # the ref follows it
                                           ("critic.fsdp.pad_to_length", "critic")])
def test_reference_and_critic_read_their_pad_to_length(setting, role):
    from transformers import Qwen2ForTokenClassification

    from rlhf_core.config import load_config
    from rlhf_core.workers.actor import DataParallelPPOActor
    from rlhf_core.workers.critic import DataParallelPPOCritic
    from tests.rlhf_core.workers.test_workers_update_pins import tiny_config

    def path(*overrides):
        cfg = load_config("ppo_trainer", list(overrides))
        if role == "critic":
            return DataParallelPPOCritic(cfg.critic, Qwen2ForTokenClassification(tiny_config()), None, 8, 2,
                                         use_remove_padding=True)._path
        return DataParallelPPOActor(cfg.actor_rollout_ref.ref, Qwen2ForCausalLM(tiny_config()),
                                    use_remove_padding=True)._path

    assert path().pad_bucket is None
    assert path(f"{setting}=True").pad_bucket == 1024  # the bucket's default


@pytest.mark.parametrize("section, key", [("ppo_trainer", "actor_rollout_ref.actor.fsdp_config.dtype"),
                                          ("ppo_trainer", "critic.fsdp.dtype"), ("sft_trainer", "engine.dtype")])
def test_engine_dtype_is_checked_as_verl_does(section, key):
    # verl 0.9 FSDPEngineConfig.__post_init__ asserts bfloat16 | float16 (and reads the key nowhere else)
    from rlhf_core.config import ConfigError, load_config

    assert load_config(section, [f"{key}=float16"])
    with pytest.raises(ConfigError, match=rf"{key}='fp32' is not one of \['bfloat16', 'float16'\]"):
        load_config(section, [f"{key}=fp32"])
