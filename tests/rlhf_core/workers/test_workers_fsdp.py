"""FSDP2 workers in one process (LocalWorkerGroup, single-rank gloo group): log-probs, updates, rollout.

The Ray / 2-rank equivalence lives in ``test_distributed_ray.py``.
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rlhf_core.config import load_config  # noqa: E402
from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402

P, T = 8, 6


def ppo_config(model_dir: str, *overrides: str):
    """A real ``ppo_trainer`` config for the tiny model: 4 prompts, one mini-batch, world size 1, HF rollout."""
    base = [f"actor_rollout_ref.model.path={model_dir}", f"critic.model.path={model_dir}",
            "trainer.n_gpus_per_node=1", "data.train_batch_size=4", f"data.max_prompt_length={P}",
            f"data.max_response_length={T}", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.optim.total_training_steps=10",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
            "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=2",
            "critic.forward_micro_batch_size_per_gpu=2", "critic.optim.lr=1e-3",
            "critic.model.enable_gradient_checkpointing=False"]
    return load_config("ppo_trainer", base + list(overrides))


def prompt_batch(b: int = 4, seed: int = 0) -> Batch:
    """``b`` left-padded prompts of length P (row 0 has 3 pads)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (b, P), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ids[0, :3] = 0
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)})


def training_batch(wg, seed: int = 0, b: int = 4) -> Batch:
    """A rollout from ``wg`` plus old log-probs, ref log-probs and random advantages."""
    out = wg.execute_dp("generate_sequences", prompt_batch(b, seed))
    out = out.merge(wg.execute_dp("compute_log_prob", out))
    if wg.execute_all("has_ref")[0]:
        out = out.merge(wg.execute_dp("compute_ref_log_prob", out))
    out.tensors["advantages"] = torch.randn(out["responses"].shape, generator=torch.Generator().manual_seed(seed))
    return out


@pytest.fixture(scope="module")
def actor_group(tiny_model_dir):
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, "actor_rollout_ref.rollout.calculate_log_probs=True"),
                                                  "role": "actor_rollout_ref"})
    wg.execute_all("init_model")
    return wg


def test_generate_shapes_padding_and_mask(actor_group, tiny_tokenizer):
    out = actor_group.execute_dp("generate_sequences", prompt_batch())
    pad = tiny_tokenizer.pad_token_id
    assert out["responses"].shape == (4, T) and out["input_ids"].shape == (4, P + T)
    assert torch.equal(out["prompts"], prompt_batch()["input_ids"])
    assert torch.equal(out["input_ids"][:, P:], out["responses"])
    mask = out["response_mask"]
    assert torch.equal(out["attention_mask"][:, P:], mask)
    assert torch.all(out["responses"][mask == 0] == pad)  # right-padded with the pad id
    # the mask is a prefix: 1…1 0…0 per row
    assert torch.all(mask[:, 1:] <= mask[:, :-1])
    assert torch.equal(out["position_ids"], torch.clamp(out["attention_mask"].cumsum(-1) - 1, min=0))
    # trainer log-probs equal the engine's on valid tokens (same weights, same temperature 1)
    lp = actor_group.execute_dp("compute_log_prob", out)["old_log_probs"]
    assert torch.allclose(lp * mask, out["rollout_log_probs"], atol=1e-5)


def test_sampling_is_seeded_but_advances(actor_group):
    w = actor_group.worker
    calls = w.rollout.calls
    a = actor_group.execute_dp("generate_sequences", prompt_batch())
    w.rollout.calls = calls  # replay the same call index
    b = actor_group.execute_dp("generate_sequences", prompt_batch())
    c = actor_group.execute_dp("generate_sequences", prompt_batch())
    assert torch.equal(a["responses"], b["responses"])
    assert not torch.equal(b["responses"], c["responses"])


def test_greedy_equals_hf_generate(actor_group, tiny_model_dir):
    from transformers import AutoModelForCausalLM, GenerationConfig

    batch = prompt_batch()
    batch.meta.update({"validate": True, "do_sample": False})
    out = actor_group.execute_dp("generate_sequences", batch)
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ref.load_state_dict(actor_group.worker.get_state_dict())
    seq = ref.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       generation_config=GenerationConfig(do_sample=False, max_new_tokens=T, pad_token_id=0,
                                                          eos_token_id=ref.generation_config.eos_token_id))
    expected = seq[:, P:]
    got = out["responses"][:, :expected.shape[1]]
    # HF pads finished rows with the pad id as well, so the two agree token for token
    assert torch.equal(got, expected)


def test_ignore_eos_generates_full_length(tiny_model_dir):
    from rlhf_core.workers.rollout.postprocess import response_mask_from

    responses = torch.tensor([[5, 2, 7, 0], [5, 6, 7, 8]])
    lengths = torch.tensor([4, 4])
    assert response_mask_from(responses, lengths, [2]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert response_mask_from(responses, lengths, [2], ignore_eos=True).tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    assert response_mask_from(responses, torch.tensor([2, 3]), [2]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]


def test_log_prob_applies_temperature(actor_group, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    out = actor_group.execute_dp("generate_sequences", prompt_batch())
    out.meta["temperature"] = 0.5
    lp = actor_group.execute_dp("compute_log_prob", out)
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ref.load_state_dict(actor_group.worker.get_state_dict())
    with torch.no_grad():
        logits = ref(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                     position_ids=out["position_ids"]).logits[:, P - 1:P + T - 1] / 0.5
    expected = torch.log_softmax(logits, -1).gather(-1, out["responses"][..., None])[..., 0]
    assert torch.allclose(lp["old_log_probs"], expected, atol=1e-5)
    probs = torch.softmax(logits, -1)
    assert torch.allclose(lp["entropys"], -(probs * torch.log_softmax(logits, -1)).sum(-1), atol=1e-4)


def _update_with(model_dir, batch: Batch, *overrides: str):
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(model_dir, *overrides), "role": "actor"})
    wg.execute_all("init_model")
    metrics = wg.execute_dp("update_actor", batch)[0]
    return metrics, wg.worker.get_state_dict()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_split_does_not_change_the_update(actor_group, tiny_model_dir, agg):
    batch = training_batch(actor_group, seed=3)
    # eps=1 makes Adam's first step ≈ lr·g/(|g|+1), i.e. proportional to the gradient, so comparing weights after
    # one step compares gradients (with eps=1e-8 the step is lr·sign(g) and float noise in tiny gradients shows).
    common = ["actor_rollout_ref.actor.optim.eps=1.0", "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.1",
              "actor_rollout_ref.actor.entropy_coeff=0.01", f"actor_rollout_ref.actor.loss_agg_mode={agg}"]
    runs = [_update_with(tiny_model_dir, batch, *common, f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={m}")
            for m in (1, 2, 4)]
    runs.append(_update_with(tiny_model_dir, batch, *common, "actor_rollout_ref.actor.use_dynamic_bsz=True",
                             "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30"))
    m0, sd0 = runs[0]
    for m, sd in runs[1:]:
        for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/ppo_kl"):
            assert m[k] == pytest.approx(m0[k], abs=1e-5), k
        for k in sd0:
            assert torch.allclose(sd[k], sd0[k], atol=1e-7), k  # steps are ~1e-4
    init = actor_group.worker.get_state_dict()
    assert any(not torch.allclose(init[k], sd0[k]) for k in sd0)  # the update did change the weights
    assert set(m0) >= {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower",
                       "actor/kl_loss", "actor/kl_coef", "actor/grad_norm", "actor/lr"}
    assert m0["actor/lr"] == pytest.approx(1e-3)  # no warmup: the first step runs at the full LR


def test_non_finite_gradient_skips_the_step(actor_group, tiny_model_dir):
    batch = training_batch(actor_group, seed=4)
    batch.tensors["advantages"] = torch.full_like(batch["advantages"], float("nan"))
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir), "role": "actor"})
    wg.execute_all("init_model")
    before = wg.worker.get_state_dict()
    metrics = wg.execute_dp("update_actor", batch)[0]
    after = wg.worker.get_state_dict()
    assert metrics["actor/skipped_steps"] == 1.0
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_critic_values_and_update(actor_group, tiny_model_dir):
    batch = training_batch(actor_group, seed=5)
    wg = LocalWorkerGroup(CriticWorker, {"config": ppo_config(tiny_model_dir)})
    wg.execute_all("init_model")
    values = wg.execute_dp("compute_values", batch)["values"]
    assert values.shape == (4, T) and torch.all(values[batch["response_mask"] == 0] == 0)
    batch.tensors["values"] = values
    batch.tensors["returns"] = torch.ones_like(values)
    first = wg.execute_dp("update_critic", batch)[0]
    # V ≈ 0 at init, R = 1 → vf_loss ≈ ½·mean((V−1)²) ≈ 0.5 (token-mean over valid tokens)
    mask = batch["response_mask"].bool()
    assert first["critic/vf_loss"] == pytest.approx(0.5 * ((values[mask] - 1) ** 2).mean().item(), rel=1e-4)
    assert set(first) >= {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"}
    for _ in range(5):
        last = wg.execute_dp("update_critic", batch)[0]
    assert last["critic/vf_loss"] < first["critic/vf_loss"]


def test_rollout_is_weights_scale_the_policy_loss(actor_group, tiny_model_dir):
    batch = training_batch(actor_group, seed=6)
    batch.tensors["advantages"] = torch.ones_like(batch["advantages"])
    # first step: log π = log π_old, so the per-token loss is −A·1 = −1 and pg_loss (token-mean) = −1.
    # rollout log-probs 0.5 below → w = e^0.5 = 1.6487, truncated at U = 1.2 → pg_loss = −1.2.
    batch.tensors["rollout_log_probs"] = batch["old_log_probs"] - 0.5
    is_on = ["actor_rollout_ref.actor.rollout_is=True", "actor_rollout_ref.actor.rollout_is_threshold=1.2",
             "actor_rollout_ref.rollout.calculate_log_probs=True"]
    m_off, _ = _update_with(tiny_model_dir, batch)
    m_on, _ = _update_with(tiny_model_dir, batch, *is_on)
    assert m_off["actor/pg_loss"] == pytest.approx(-1.0, abs=1e-5)
    assert m_on["actor/pg_loss"] == pytest.approx(-1.2, abs=1e-5)


@pytest.mark.parametrize("loss_type", ["reinforce", "ppo_clip"])
def test_bypass_mode_loss_in_the_actor(actor_group, tiny_model_dir, loss_type):
    batch = training_batch(actor_group, seed=6)
    batch.tensors["advantages"] = torch.ones_like(batch["advantages"])
    # bypass (as the trainer sets it up): old_log_probs = rollout log-probs, 0.5 below log π_θ (first step), so the
    # ratio π_θ/π_rollout = e^0.5 = 1.6487 and the IS weight min(1.6487, 1.2) = 1.2. A = 1.
    # ppo_clip: min(r·A, clip(r, 0.8, 1.2)·A) = 1.2 per token → pg_loss = −1.2, no IS weight on top.
    # reinforce: L_t = −A·log π_t·1.2 → pg_loss = token mean of −1.2·log π.
    lp = batch["old_log_probs"]
    batch.tensors["rollout_log_probs"] = lp - 0.5
    batch.tensors["old_log_probs"] = lp - 0.5
    batch.meta["rollout_correction"] = {"rollout_is": "token", "rollout_is_threshold": 1.2, "rollout_rs": None,
                                        "rollout_rs_threshold": None, "bypass_mode": True, "loss_type": loss_type,
                                        "rollout_is_batch_normalize": False}
    m, _ = _update_with(tiny_model_dir, batch, "actor_rollout_ref.rollout.calculate_log_probs=True")
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.2, abs=1e-4)  # e^0.5 truncated at 1.2
    if loss_type == "ppo_clip":
        assert m["actor/pg_loss"] == pytest.approx(-1.2, abs=1e-4)
    else:  # −A·log π·1.2 averaged over tokens, log π = lp on the first forward
        mask = batch["response_mask"].float()
        assert m["actor/pg_loss"] == pytest.approx(float(-(lp * 1.2 * mask).sum() / mask.sum()), rel=1e-4)
    assert m["actor/ppo_kl"] == pytest.approx(-0.5, abs=1e-4)  # mean(log π_rollout − log π_θ)


def test_vllm_engine_kwargs_and_missing_vllm_message(tiny_model_dir):
    from rlhf_core.workers.rollout import vllm_rollout

    cfg = ppo_config(tiny_model_dir, "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=2")
    kw = vllm_rollout.engine_kwargs(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout, seed=3)
    assert kw["max_model_len"] == P + T and kw["tensor_parallel_size"] == 1 and kw["swap_space"] == 2
    assert kw["gpu_memory_utilization"] == 0.5 and kw["enforce_eager"] is True and kw["seed"] == 3
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="rollout.name=hf"):
            vllm_rollout.VLLMRollout(cfg.actor_rollout_ref.model, None, cfg.actor_rollout_ref.rollout)
