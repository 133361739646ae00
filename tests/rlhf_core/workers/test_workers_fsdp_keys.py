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
