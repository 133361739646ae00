"""``model.tiled_mlp`` (verl 0.9 TiledMLP): the MLP over sequence tiles gives the untiled outputs and gradients while
keeping fewer activations for backward; wired into the actor, reference, critic and SFT models."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rlhf_core.models.tiled_mlp import apply_tiled_mlp  # noqa: E402


def _pair(lora: bool = False):
    """Two copies of one small random Qwen2 LM (float32), the second tiled in 4."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlhf_core.models.lora import apply_lora

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    plain = Qwen2ForCausalLM(cfg)
    tiled = Qwen2ForCausalLM(cfg)
    tiled.load_state_dict(plain.state_dict())
    if lora:  # the adapters' B start at 0: make them non-zero (the same in both) so they count in the output
        plain, tiled = apply_lora(plain, 4), apply_lora(tiled, 4)
        with torch.no_grad():
            for (name, p), (_, q) in zip(plain.named_parameters(), tiled.named_parameters()):
                if "lora_B" in name:
                    p.normal_(0, 0.1)
                    q.copy_(p)
    assert apply_tiled_mlp(tiled, 4, "model.tiled_mlp") == 2  # one MLP per decoder layer
    return plain, tiled


def _forward(model, ids):
    """(logits, bytes of the tensors saved for backward in that forward)."""
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(input_ids=ids).logits
    return logits, saved[0]


@pytest.mark.parametrize("lora", [False, True])
def test_tiled_outputs_and_gradients_equal_untiled_with_fewer_saved_activations(lora):
    plain, tiled = _pair(lora)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    seen = []  # the sequence lengths the MLP's down_proj sees
    layer0 = tiled.get_decoder().layers[0].mlp.down_proj
    layer0.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[-2]))
    want, saved_plain = _forward(plain, ids)
    got, saved_tiled = _forward(tiled, ids)
    assert seen == [4, 4, 4, 4]  # 16 positions in 4 tiles of 4
    # token-wise MLP: the same numbers up to the rounding of smaller products
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # only each tile's input is kept, the (…, 64) gate/up activations are recomputed in backward
    assert saved_tiled < 0.7 * saved_plain
    (want.square().sum()).backward()
    (got.square().sum()).backward()
    for (name, p), (_, q) in zip(plain.named_parameters(), tiled.named_parameters()):
        if p.grad is not None or q.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert seen[4:] == [4, 4, 4, 4]  # backward recomputed each tile


def test_uneven_tiles_and_no_grad_forward():
    plain, tiled = _pair()
    ids = torch.randint(0, 100, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():  # 10 positions in 4 chunks of 3, 3, 3, 1: still the same output
        torch.testing.assert_close(tiled(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=0, atol=1e-6)


def test_bad_shards_and_a_model_without_a_swiglu_mlp_are_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tiled = _pair()
    with pytest.raises(ValueError, match=r"critic.model.tiled_mlp.num_shards=0 must be >= 1"):
        apply_tiled_mlp(tiled, 0, "critic.model.tiled_mlp")
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=32))
    with pytest.raises(ValueError, match=r"model.tiled_mlp.enabled=True: model type 'gpt2' has no SwiGLU MLP"):
        apply_tiled_mlp(gpt2, 4, "model.tiled_mlp")


def _tiles_seen(model) -> list[int]:
    """Run a 12-token forward through ``model`` and return the sequence lengths its first MLP's down_proj saw."""
    mlp = next(m for m in model.modules() if hasattr(m, "down_proj") and hasattr(m, "gate_proj"))
    seen = []
    handle = mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[-2]))
    with torch.no_grad():
        model(input_ids=torch.arange(3, 15).view(1, 12), attention_mask=torch.ones(1, 12, dtype=torch.long))
    handle.remove()
    return seen


def test_actor_ref_and_critic_read_their_tiled_mlp(tiny_model_dir, monkeypatch):
    from tests.rlhf_core.workers.test_workers_fsdp import ppo_config

    from rlhf_core.workers import model_setup
    from rlhf_core.workers.model_setup import build_model

    monkeypatch.setattr(model_setup, "apply_fsdp2", lambda model, fsdp_cfg, role: model)  # one process, unsharded

    cfg = ppo_config(tiny_model_dir, "actor_rollout_ref.model.tiled_mlp.enabled=True",
                     "actor_rollout_ref.model.tiled_mlp.num_shards=3", "critic.model.tiled_mlp.enabled=True",
                     "critic.model.tiled_mlp.num_shards=2")
    arr = cfg.actor_rollout_ref
    assert _tiles_seen(build_model(arr.model, arr.actor.fsdp_config, "actor")) == [4, 4, 4]
    assert _tiles_seen(build_model(arr.model, arr.ref.fsdp_config, "ref")) == [4, 4, 4]
    assert _tiles_seen(build_model(cfg.critic.model, cfg.critic.fsdp, "critic", value_head=True)) == [6, 6]
    untiled = ppo_config(tiny_model_dir)
    assert _tiles_seen(build_model(untiled.critic.model, untiled.critic.fsdp, "critic", value_head=True)) == [12]
