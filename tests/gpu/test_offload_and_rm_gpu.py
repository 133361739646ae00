"""GPU checks: an FSDP2 actor step with param + optimizer offload on CUDA, and the reward model on CUDA.
Skipped without CUDA (``gpu`` marker, see ``tests/conftest.py``).

Run: ``pytest -m gpu tests/gpu -q``.
"""
from __future__ import annotations

import math

import pytest
import torch


pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fsdp_helpers():
    import tests.rlhf_core.workers.test_workers_fsdp as h

    return h


@pytest.fixture(scope="module")
def rm_helpers():
    import tests.rlhf_core.workers.test_workers_reward_model as h

    return h


def _actor_group(helpers, model_dir, *overrides):
    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = helpers.ppo_config(model_dir, "actor_rollout_ref.actor.optim.eps=1.0", *overrides)
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    wg.execute_all("init_model")
    return wg


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def test_actor_step_with_param_and_optimizer_offload(fsdp_helpers, tiny_model_dir):
    """With both offloads the sharded weights and AdamW state stay in host memory, the rollout copy on the GPU,
    and one update gives the same loss and weights as the same update without offload."""
    plain = _actor_group(fsdp_helpers, tiny_model_dir)
    assert plain.backend == "nccl"
    batch = fsdp_helpers.training_batch(plain, seed=3)
    before = plain.worker.get_state_dict()
    m_plain = plain.execute_dp("update_actor", batch)[0]
    sd_plain = plain.worker.get_state_dict()

    off = _actor_group(fsdp_helpers, tiny_model_dir, "actor_rollout_ref.actor.fsdp_config.param_offload=True",
                       "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True")
    m_off = off.execute_dp("update_actor", batch)[0]
    sd_off = off.worker.get_state_dict()

    params = list(off.worker.actor_module.parameters())
    assert params and all(_local(p).device.type == "cpu" for p in params)
    states = [s for s in off.worker.optimizer.state.values() if "exp_avg" in s]
    assert states and all(_local(s["exp_avg"]).device.type == "cpu" for s in states)
    assert next(off.worker.rollout.module.parameters()).is_cuda  # the HF rollout's unsharded copy (hybrid engine)

    assert math.isfinite(m_off["actor/pg_loss"]) and math.isfinite(m_off["actor/grad_norm"])
    assert m_off["actor/pg_loss"] == pytest.approx(m_plain["actor/pg_loss"], abs=1e-5)
    assert any(not torch.equal(before[k], sd_off[k]) for k in before), "the update changed no weight"
    for k in sd_plain:
        assert torch.allclose(sd_plain[k], sd_off[k], atol=1e-6), k


@pytest.mark.parametrize("offload", [False, True])
def test_reward_model_on_cuda_matches_hf_on_cpu(rm_helpers, tiny_model_dir, tiny_tokenizer, tmp_path, offload):
    """The RM worker on CUDA (optionally param-offloaded) scores each row as a plain CPU HF forward does."""
    rm_dir = rm_helpers._save_rm(tiny_model_dir, tmp_path / "rm")
    wg = rm_helpers._rm_group(tiny_model_dir, rm_dir, f"reward_model.model.fsdp_config.param_offload={offload}")
    assert wg.backend == "nccl"
    if not offload:
        assert all(_local(p).is_cuda for p in wg.worker.module.parameters())
    batch = rm_helpers._generated_batch(tiny_tokenizer)
    out = wg.execute_dp("compute_rm_score", batch)["rm_scores"]
    expected = [rm_helpers._hf_score(rm_dir, batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist())
                for i in range(4)]
    assert out.device.type == "cpu" and out.shape == (4, rm_helpers.T)
    for i, n in enumerate(rm_helpers.LENGTHS):
        # fp32 on both sides; a GPU kernel's summation order moves the 5th-6th digit at most
        assert float(out[i, n - 1]) == pytest.approx(expected[i], abs=1e-4)
        assert torch.all(torch.cat([out[i, : n - 1], out[i, n:]]) == 0)
