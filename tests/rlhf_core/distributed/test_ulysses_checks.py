"""Ulysses' refusals before any data runs (rlhf_core/workers/ulysses.py), in one process: each names the key
and the values. The two-rank equivalence tests are in test_ulysses_ranks.py."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlhf_core.config.sequence_parallel import role_sp_size
from rlhf_core.workers.ulysses import build_sequence_parallel, check_sequence_parallel

KEY = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
RMPAD = "actor_rollout_ref.model.use_remove_padding"


def _model(heads: int = 4, kv: int = 2, attn: str = "sdpa"):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlhf_core import kernels

    cfg = Qwen2Config(vocab_size=16, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=heads, num_key_value_heads=kv)
    cfg._attn_implementation = attn
    model = Qwen2ForCausalLM(cfg)
    kernels.prepare(model, "use_remove_padding")
    return model


def test_heads_key_value_heads_padding_and_attention_are_checked():
    model = _model()
    check_sequence_parallel(model, 2, KEY, True, RMPAD)  # 4 heads, 2 key/value heads: split in 2
    check_sequence_parallel(model, 1, KEY, False, RMPAD)  # size 1: nothing to check
    with pytest.raises(ValueError, match=f"{KEY}=2 needs {RMPAD}=True"):
        check_sequence_parallel(model, 2, KEY, False, RMPAD)
    with pytest.raises(ValueError, match=f"{KEY}=3 must divide the model's num_attention_heads=4"):
        check_sequence_parallel(model, 3, KEY, True, RMPAD)
    with pytest.raises(ValueError, match=f"{KEY}=4 must divide the model's num_key_value_heads=2"):
        check_sequence_parallel(model, 4, KEY, True, RMPAD)
    with pytest.raises(ValueError, match=f"{KEY}=2: Qwen2ForCausalLM does not attend per sequence"):
        check_sequence_parallel(_model(attn="eager"), 2, KEY, True, RMPAD)


def test_size_must_divide_the_world_and_copies_must_agree():
    with pytest.raises(ValueError, match=f"{KEY}=2 must divide the world size 1"):
        build_sequence_parallel(2, KEY)
    with pytest.raises(ValueError, match=f"{KEY}=0 must be at least 1"):
        build_sequence_parallel(0, KEY)
    assert build_sequence_parallel(1, KEY) is None

    def role(own: int, copy: int):
        return OmegaConf.create({"ulysses_sequence_parallel_size": own,
                                 "fsdp_config": {"ulysses_sequence_parallel_size": copy}})

    assert role_sp_size(role(2, 1), "fsdp_config", "actor_rollout_ref.actor") == 2
    assert role_sp_size(role(1, 4), "fsdp_config", "actor_rollout_ref.actor") == 4  # verl 0.9's engine copy
    assert role_sp_size(role(2, 2), "fsdp_config", "actor_rollout_ref.actor") == 2
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 and "
                                         "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4 differ"):
        role_sp_size(role(2, 4), "fsdp_config", "actor_rollout_ref.actor")
