"""``actor.kl_loss_type: full`` and ``algorithm.kl_penalty: full``: the exact vocabulary KL(π_θ ‖ π_ref) from both
models' full logits.

One single-rank FSDP2 worker in role ``actor_rollout_ref`` (LocalWorkerGroup). The expected values come from plain
Hugging Face models loaded with the worker's weights, and the KL from ``torch.distributions`` (an enumeration over
the vocabulary independent of ``kl_penalty_full``).
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.workers.fsdp_utils import full_state_dict  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402
from tests.rlhf_core.workers.test_workers_fsdp import P, T, ppo_config, prompt_batch  # noqa: E402

TEMP, COEF = 0.7, 0.5
FULL_KL = ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=full",
           f"actor_rollout_ref.actor.kl_loss_coef={COEF}", "actor_rollout_ref.actor.entropy_coeff=0.0",
           f"actor_rollout_ref.rollout.temperature={TEMP}", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
           "algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=full"]


def _zero_adv_batch(wg, seed: int):
    """A rollout with old log-probs and A = 0: the PPO term then has value and gradient 0, so the actor's
    loss and gradient are the KL term's alone."""
    out = wg.execute_dp("generate_sequences", prompt_batch(4, seed))
    out = out.merge(wg.execute_dp("compute_log_prob", out))
    out.tensors["advantages"] = torch.zeros(out["responses"].shape)
    out.meta["temperature"] = TEMP
    return out


def _hf(model_dir, state_dict):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.load_state_dict(state_dict)
    return model


def _response_logits(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"])
    return out.logits[:, P - 1:P + T - 1].float() / TEMP  # the logits predicting response tokens 0..T-1


def _expected_kl_loss_and_grad_norm(model_dir, actor_sd, ref_sd, batch):
    """COEF · token-mean over valid tokens of KL(softmax(actor/τ) ‖ softmax(ref/τ)), and its ‖∇‖₂."""
    actor, ref = _hf(model_dir, actor_sd), _hf(model_dir, ref_sd)
    with torch.no_grad():
        ref_logits = _response_logits(ref, batch)
    logits = _response_logits(actor, batch)
    kl = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=logits),
                                           torch.distributions.Categorical(logits=ref_logits))  # (B, T)
    mask = batch["response_mask"].float()
    kl_loss = (kl * mask).sum() / mask.sum()
    (COEF * kl_loss).backward()
    grads = [p.grad for p in actor.parameters() if p.grad is not None]
    return float(kl_loss.detach()), float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads)))


@pytest.fixture(scope="module")
def full_kl_group(tiny_model_dir):
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, *FULL_KL),
                                                  "role": "actor_rollout_ref"})
    wg.execute_all("init_model")
    return wg


def test_full_kl_loss_is_zero_when_ref_equals_actor(full_kl_group):
    batch = _zero_adv_batch(full_kl_group, seed=11)
    assert "ref_log_prob" not in batch  # 'full' does not need the sampled-token ref log-probs
    metrics = full_kl_group.execute_dp("update_actor", batch)[0]
    # π_ref = π_θ before the step: Σ_v π_v (log π_v − log π_v) = 0 on every token; A = 0 → no gradient at all
    assert metrics["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/grad_norm"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/kl_coef"] == pytest.approx(COEF)


def _perturb_ref(worker, seed: int):
    """Add N(0, 0.05²) noise to the reference weights in place; returns (actor, ref) full state dicts."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in worker.ref.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.add_(0.05 * torch.randn(local.shape, generator=gen))
    actor_sd = worker.get_state_dict()
    ref_sd = {k: v.detach().cpu().clone() for k, v in full_state_dict(worker.ref.model).items()}
    assert any(not torch.equal(actor_sd[k], ref_sd[k]) for k in actor_sd)
    return actor_sd, ref_sd


def test_full_kl_loss_matches_enumerated_kl_with_a_perturbed_ref(full_kl_group, tiny_model_dir):
    actor_sd, ref_sd = _perturb_ref(full_kl_group.worker, seed=0)
    batch = _zero_adv_batch(full_kl_group, seed=12)
    expected_loss, expected_norm = _expected_kl_loss_and_grad_norm(tiny_model_dir, actor_sd, ref_sd, batch)
    metrics = full_kl_group.execute_dp("update_actor", batch)[0]
    assert expected_loss > 1e-3  # the perturbation is visible, so the comparison below can fail
    assert metrics["actor/kl_loss"] == pytest.approx(expected_loss, rel=1e-4)
    # the gradient flows through the actor's logits only (the ref is frozen), scaled by kl_loss_coef
    assert metrics["actor/grad_norm"] == pytest.approx(expected_norm, rel=1e-3)


def test_full_kl_loss_does_not_depend_on_the_micro_batch_split(full_kl_group, tiny_model_dir):
    batch = _zero_adv_batch(full_kl_group, seed=14)
    runs = []
    for micro in (1, 4):
        wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(
            tiny_model_dir, *FULL_KL, f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
            # eps=1: Adam's first step ≈ lr·g/(|g|+1) ∝ g, so equal weights mean equal gradients (eps=1e-8 → sign(g))
            "actor_rollout_ref.actor.optim.eps=1.0"),
            "role": "actor_rollout_ref"})
        wg.execute_all("init_model")
        _perturb_ref(wg.worker, seed=2)  # the same reference for both splits
        metrics = wg.execute_dp("update_actor", batch)[0]
        runs.append((metrics, wg.worker.get_state_dict()))
    (m1, sd1), (m4, sd4) = runs
    assert m1["actor/kl_loss"] > 1e-3
    for k in ("actor/kl_loss", "actor/grad_norm"):
        assert m4[k] == pytest.approx(m1[k], rel=1e-4), k
    assert all(torch.allclose(sd1[k], sd4[k], atol=1e-6) for k in sd1)


def test_kl_penalty_full_in_reward_comes_from_the_ref_stage(full_kl_group, tiny_model_dir):
    actor_sd, ref_sd = _perturb_ref(full_kl_group.worker, seed=1)
    batch = _zero_adv_batch(full_kl_group, seed=13)
    out = full_kl_group.execute_dp("compute_ref_log_prob", batch)
    actor, ref = _hf(tiny_model_dir, actor_sd), _hf(tiny_model_dir, ref_sd)
    with torch.no_grad():  # KL(π_old ‖ π_ref) per token: the actor before its update vs the reference, at τ
        expected = torch.distributions.kl_divergence(
            torch.distributions.Categorical(logits=_response_logits(actor, batch)),
            torch.distributions.Categorical(logits=_response_logits(ref, batch)))
    assert out["ref_kl_full"].shape == (4, T) and float(expected.min()) > 1e-4
    assert torch.allclose(out["ref_kl_full"], expected, rtol=1e-4, atol=1e-6)
    assert "ref_log_prob" in out


def test_full_kl_loss_needs_the_ref_in_the_same_worker(tiny_model_dir):
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, *FULL_KL), "role": "actor"})
    with pytest.raises(ValueError, match="actor_rollout_ref"):
        wg.execute_all("init_model")
