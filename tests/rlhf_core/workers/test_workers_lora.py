"""LoRA actor (peft): only adapters train, the rollout copy follows, the merger folds the adapters in."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.rlhf_core.workers.test_workers_fsdp import P, ppo_config, training_batch  # noqa: E402

from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402
from rlhf_core.workers.merger import merge_checkpoint  # noqa: E402


def test_lora_actor_update_sync_and_merge(tiny_model_dir, tmp_path):
    cfg = ppo_config(tiny_model_dir, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8")  # the schema takes a str for now

    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    wg.execute_all("init_model")
    before = wg.worker.get_state_dict()
    assert any("lora_A" in k for k in before)
    batch = training_batch(wg, seed=2)
    # step 2 after the first update: lora_B starts at 0, so only the second update moves the merged weights
    wg.execute_dp("update_actor", batch)
    wg.execute_dp("update_actor", batch)
    after = wg.worker.get_state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)  # the base weights are frozen
    engine = wg.worker.rollout.module.state_dict()
    assert all(torch.equal(engine[k], after[k]) for k in changed)  # rollout copy synced

    ckpt = str(tmp_path / "actor")
    wg.execute_all("save_checkpoint", ckpt)
    target = merge_checkpoint(ckpt, str(tmp_path / "merged"))
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(target)
    with torch.no_grad():
        got = merged(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     position_ids=batch["position_ids"]).logits[:, P - 1:-1]
        want = wg.worker.rollout.module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                        position_ids=batch["position_ids"]).logits[:, P - 1:-1]
    assert torch.allclose(got, want, atol=1e-5)


def test_lora_critic_trains_head_and_merges(tiny_model_dir, tmp_path):
    from transformers import AutoModelForTokenClassification

    from rlhf_core.workers.fsdp_workers import CriticWorker

    actor = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir), "role": "actor_rollout"})
    actor.execute_all("init_model")
    batch = training_batch(actor, seed=8)
    cfg = ppo_config(tiny_model_dir, "critic.model.lora_rank=4", "critic.model.enable_gradient_checkpointing=True")
    wg = LocalWorkerGroup(CriticWorker, {"config": cfg})
    wg.execute_all("init_model")
    batch.tensors["values"] = wg.execute_dp("compute_values", batch)["values"]
    batch.tensors["returns"] = torch.ones_like(batch["values"])
    losses = [wg.execute_dp("update_critic", batch)[0]["critic/vf_loss"] for _ in range(3)]
    assert losses[2] < losses[0]
    wg.execute_all("save_checkpoint", str(tmp_path / "critic"))
    merged = AutoModelForTokenClassification.from_pretrained(merge_checkpoint(str(tmp_path / "critic"),
                                                                              str(tmp_path / "merged")))
    with torch.no_grad():
        got = merged(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     position_ids=batch["position_ids"]).logits[:, P - 1:-1, 0] * batch["response_mask"]
    assert torch.allclose(got, wg.execute_dp("compute_values", batch)["values"], atol=1e-5)


@pytest.mark.parametrize("lora", [False, True])
def test_enable_activation_checkpointing_without_the_deprecated_call(tiny_model_dir, lora):
    import warnings

    from rlhf_core.models.loading import enable_activation_checkpointing, load_causal_lm
    from rlhf_core.models.lora import apply_lora

    torch.manual_seed(0)
    plain = load_causal_lm(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir)
    if lora:
        plain, model = (apply_lora(m, 4, 8, "all-linear", "CAUSAL_LM") for m in (plain, model))
        model.load_state_dict(plain.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # transformers 5.24 warns on gradient_checkpointing_enable
        enable_activation_checkpointing(model)
    base = model.get_base_model() if lora else model
    assert base.is_activation_checkpointing
    plain.train(), model.train()
    ids = torch.randint(3, 200, (2, 12))
    grads = []
    for m in (plain, model):
        m(input_ids=ids).logits.square().mean().backward()
        grads.append([p.grad for p in m.parameters() if p.requires_grad])
    # recomputing the activations in the backward gives the same gradients as keeping them
    assert len(grads[0]) == len(grads[1]) > 0
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def test_lora_adapters_are_the_same_in_every_build(tiny_model_dir):
    # two workers built from the same config, from different global RNG states, start from the same adapters
    # (peft draws lora_A at random): runs with LoRA are reproducible, and ranks agree
    cfg = ppo_config(tiny_model_dir, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8")
    states = []
    for draw_before in (0, 5):
        torch.manual_seed(123)
        torch.rand(draw_before)  # a different global RNG state before each build
        wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
        wg.execute_all("init_model")
        states.append(wg.worker.get_state_dict())
        wg.shutdown()
    a, b = states
    lora_a = [k for k in a if "lora_A" in k]
    assert lora_a and all(torch.equal(a[k], b[k]) for k in a)
    assert any(a[k].abs().sum() > 0 for k in lora_a)  # drawn, not zero
