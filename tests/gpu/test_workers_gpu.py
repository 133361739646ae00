"""GPU checks for the workers: nccl FSDP2 (with CPU offload) and the vLLM hybrid engine. Skipped without CUDA.

Run: ``pytest -m gpu tests/gpu/test_workers_gpu.py`` (about a minute on one GPU; vLLM tests need the ``vllm`` extra).
"""
from __future__ import annotations


import pytest
import torch


pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def helpers():
    import tests.rlhf_core.workers.test_workers_fsdp as h

    return h


def test_fsdp_actor_on_cuda_with_offload_matches_without(helpers, tiny_model_dir):
    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    results = []
    for offload in ("False", "True"):
        cfg = helpers.ppo_config(tiny_model_dir, "actor_rollout_ref.actor.optim.eps=1.0",
                                 f"actor_rollout_ref.actor.fsdp_config.param_offload={offload}")
        wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
        wg.execute_all("init_model")
        assert wg.backend == "nccl"
        batch = helpers.training_batch(wg, seed=1)
        if not results:
            fixed = batch
        metrics = wg.execute_dp("update_actor", fixed)[0]
        results.append((metrics, wg.worker.get_state_dict()))
    (m0, sd0), (m1, sd1) = results
    assert m1["actor/pg_loss"] == pytest.approx(m0["actor/pg_loss"], abs=1e-5)
    for k in sd0:
        assert torch.allclose(sd0[k], sd1[k], atol=1e-6), k


def test_vllm_greedy_equals_hf_and_follows_weight_updates(helpers, tiny_model_dir):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM, GenerationConfig

    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = helpers.ppo_config(tiny_model_dir, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
                             "actor_rollout_ref.rollout.gpu_memory_utilization=0.2",
                             "actor_rollout_ref.rollout.calculate_log_probs=True")
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    wg.execute_all("init_model")
    batch = helpers.training_batch(wg, seed=0)
    wg.execute_dp("update_actor", batch)  # pushes the new weights into vLLM

    prompts = helpers.prompt_batch()
    prompts.meta.update({"validate": True, "do_sample": False})
    out = wg.execute_dp("generate_sequences", prompts)
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir).cuda()
    ref.load_state_dict(wg.worker.get_state_dict())
    seq = ref.generate(input_ids=prompts["input_ids"].cuda(), attention_mask=prompts["attention_mask"].cuda(),
                       generation_config=GenerationConfig(do_sample=False, max_new_tokens=helpers.T, pad_token_id=0,
                                                          eos_token_id=ref.generation_config.eos_token_id)).cpu()
    expected = seq[:, helpers.P:]
    assert torch.equal(out["responses"][:, :expected.shape[1]] * out["response_mask"][:, :expected.shape[1]],
                       expected * out["response_mask"][:, :expected.shape[1]])
    # sampled log-probs from vLLM agree with the trainer's teacher-forced ones (temperature 1)
    sampled = wg.execute_dp("generate_sequences", helpers.prompt_batch(seed=5))
    lp = wg.execute_dp("compute_log_prob", sampled)["old_log_probs"]
    assert torch.allclose(lp * sampled["response_mask"], sampled["rollout_log_probs"], atol=1e-3)
