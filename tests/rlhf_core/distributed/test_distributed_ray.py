"""Two FSDP2 ranks on Ray (gloo) reproduce one in-process rank: log-probs, losses, updated weights, critic.

One Ray session for the module (≈ 6 s start); the actor group and the critic group coexist on 2 CPUs with
0.5 CPU per rank (fractional resources).
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from tests.rlhf_core.workers.test_workers_fsdp import ppo_config, training_batch  # noqa: E402

from rlhf_core.distributed import LocalWorkerGroup, RayWorkerGroup, init_ray  # noqa: E402
from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402

pytestmark = pytest.mark.ray  # starts Ray: calls init_ray

# 8 sequences, mini-batch 4 → 2 optimizer steps; micro-batch 1 per rank. eps=1: Adam's first steps are
# proportional to the gradient, so equal weights after the update mean equal gradients (see test_workers_fsdp).
OVERRIDES = ["data.train_batch_size=8", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.optim.eps=1.0",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.use_kl_loss=True",
             "actor_rollout_ref.actor.kl_loss_coef=0.1", "actor_rollout_ref.actor.entropy_coeff=0.01",
             "critic.ppo_micro_batch_size_per_gpu=1", "critic.optim.eps=1.0"]


@pytest.fixture(scope="module")
def ray_session():
    import ray

    init_ray(num_cpus=2)
    init_ray(num_cpus=2)  # idempotent: a second call keeps the running instance
    assert ray.cluster_resources()["CPU"] == 2
    yield
    ray.shutdown()


def _global_minibatch_order(batch: Batch) -> Batch:
    """Rank r holds rows [4r, 4r+4) and takes mini-batches of 2 in order, so global mini-batch i is
    rows {2i, 2i+1, 4+2i, 4+2i+1}; reorder for the single rank so it sees the same mini-batches."""
    return batch.index([0, 1, 4, 5, 2, 3, 6, 7])


def test_two_ray_ranks_match_one_local_rank(ray_session, tiny_model_dir):
    cfg = ppo_config(tiny_model_dir, *OVERRIDES)
    local = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout_ref"})
    local.execute_all("init_model")
    batch = training_batch(local, seed=11, b=8)
    batch.tensors["values"] = torch.zeros_like(batch["advantages"])
    batch.tensors["returns"] = torch.randn(batch["advantages"].shape, generator=torch.Generator().manual_seed(1))

    actor = RayWorkerGroup(ActorRolloutRefWorker, 2, {"config": cfg, "role": "actor_rollout_ref"},
                           num_cpus_per_worker=0.5, name_prefix="actor")
    critic = RayWorkerGroup(CriticWorker, 2, {"config": cfg}, num_cpus_per_worker=0.5, name_prefix="critic")
    try:
        assert actor.backend == "gloo"
        actor.execute_all("init_model")
        critic.execute_all("init_model")
        with pytest.raises(ValueError, match="equal parts"):
            actor.execute_dp("compute_log_prob", batch.index(slice(0, 3)))

        # forward passes: the same numbers on 2 shards as on the whole batch
        lp2 = actor.execute_dp("compute_log_prob", batch)
        assert torch.allclose(lp2["old_log_probs"], batch["old_log_probs"], atol=1e-5)
        ref2 = actor.execute_dp("compute_ref_log_prob", batch)
        assert torch.allclose(ref2["ref_log_prob"], batch["ref_log_prob"], atol=1e-5)

        # the update: identical metrics on both ranks, equal to the single rank's, and equal weights
        ordered = _global_minibatch_order(batch)
        sd0 = local.worker.get_state_dict()
        m1 = local.execute_dp("update_actor", ordered)[0]
        m2 = actor.execute_dp("update_actor", batch)
        # every metric but wall-clock timings (timing_s/weight_sync) is identical on both ranks
        same = [{k: v for k, v in m.items() if not k.startswith("timing_s/")} for m in m2]
        assert same[0] == pytest.approx(same[1], abs=1e-7)
        for k in ("actor/pg_loss", "actor/kl_loss", "actor/ppo_kl", "actor/grad_norm", "actor/lr"):
            assert m2[0][k] == pytest.approx(m1[k], abs=1e-5), k
        sd1 = local.worker.get_state_dict()
        sd2 = actor.execute_all("get_state_dict")[0]
        moved = max((sd1[k] - sd0[k]).abs().max().item() for k in sd0)
        assert moved > 1e-5  # the weights did move (two steps of ~1e-4)
        for k in sd1:
            assert torch.allclose(sd2[k], sd1[k], atol=2e-7), k

        # the critic group on the same cluster: values and one update match a single local rank
        local_critic = LocalWorkerGroup(CriticWorker, {"config": cfg})
        local_critic.execute_all("init_model")
        v1 = local_critic.execute_dp("compute_values", batch)["values"]
        v2 = critic.execute_dp("compute_values", batch)["values"]
        assert torch.allclose(v1, v2, atol=1e-5)
        c1 = local_critic.execute_dp("update_critic", ordered)[0]
        c2 = critic.execute_dp("update_critic", batch)[0]
        for k in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"):
            assert c2[k] == pytest.approx(c1[k], abs=1e-5), k
    finally:
        actor.shutdown()
        critic.shutdown()


def test_hsdp_mesh_and_size_based_wrap_match_one_rank(ray_session, tiny_model_dir):
    """fsdp_size=1 on 2 ranks = 2 replicas of an unsharded model (HSDP mesh (2, 1)); min_num_params wraps MLPs."""
    cfg = ppo_config(tiny_model_dir, *OVERRIDES, "actor_rollout_ref.actor.fsdp_config.fsdp_size=1",
                     "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=20000")
    local = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    local.execute_all("init_model")
    batch = training_batch(local, seed=12, b=8)
    batch.tensors["ref_log_prob"] = batch["old_log_probs"].clone()
    group = RayWorkerGroup(ActorRolloutRefWorker, 2, {"config": cfg, "role": "actor"}, num_cpus_per_worker=0.5)
    try:
        group.execute_all("init_model")
        assert torch.allclose(group.execute_dp("compute_log_prob", batch)["old_log_probs"], batch["old_log_probs"],
                              atol=1e-5)
        m1 = local.execute_dp("update_actor", _global_minibatch_order(batch))[0]
        m2 = group.execute_dp("update_actor", batch)[0]
        assert m2["actor/pg_loss"] == pytest.approx(m1["actor/pg_loss"], abs=1e-5)
        sd1, sd2 = local.worker.get_state_dict(), group.execute_all("get_state_dict")[1]
        for k in sd1:
            assert torch.allclose(sd2[k], sd1[k], atol=2e-7), k
    finally:
        group.shutdown()


def test_shared_prefix_update_on_two_ray_ranks_matches_one_local_rank(ray_session, tiny_model_dir, monkeypatch):
    # each prompt twice (rollout.n = 2), micro-batches of 2 rows: every micro-batch on both sides runs its prompt
    # once (kernels/shared_prefix.py), so FSDP2 sees two forwards of the model before one backward; the 2-rank
    # update must still equal the single rank's (gradients of both passes reduced)
    from tests.rlhf_core.workers.test_workers_fsdp import prompt_batch

    from rlhf_core.workers import actor as actor_module
    from rlhf_core.kernels.shared_prefix import shared_prefix_logits

    used = []

    def counting(*args, **kwargs):
        out = shared_prefix_logits(*args, **kwargs)
        used.append(out is not None)
        return out

    monkeypatch.setattr(actor_module, "shared_prefix_logits", counting)
    overrides = [o for o in OVERRIDES if "micro_batch_size_per_gpu" not in o] + [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"]
    cfg = ppo_config(tiny_model_dir, *overrides)
    local = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout_ref"})
    local.execute_all("init_model")
    prompts = prompt_batch(4, seed=5)
    batch = local.execute_dp("generate_sequences",
                             Batch({k: v.repeat_interleave(2, 0) for k, v in prompts.tensors.items()}))
    batch = batch.merge(local.execute_dp("compute_log_prob", batch))
    batch = batch.merge(local.execute_dp("compute_ref_log_prob", batch))  # use_kl_loss
    batch.tensors["advantages"] = torch.randn(batch["responses"].shape, generator=torch.Generator().manual_seed(5))
    assert used and all(used)  # counted in this process (the local rank); the Ray ranks run the same code
    actor = RayWorkerGroup(ActorRolloutRefWorker, 2, {"config": cfg, "role": "actor_rollout_ref"},
                           num_cpus_per_worker=0.5, name_prefix="actor_shared")
    try:
        actor.execute_all("init_model")
        m1 = local.execute_dp("update_actor", _global_minibatch_order(batch))[0]
        m2 = actor.execute_dp("update_actor", batch)
        for k in ("actor/pg_loss", "actor/kl_loss"):
            assert m2[0][k] == pytest.approx(m1[k], abs=1e-5), k
        # a gradient reduced from two passes per rank: float noise of a few 1e-6 relative; one pass's gradient
        # missing from the reduction would change it by tens of percent
        assert m2[0]["actor/grad_norm"] == pytest.approx(m1["actor/grad_norm"], rel=1e-5)
        sd1 = local.worker.get_state_dict()  # after the update (eps=1: steps ~ lr × gradient)
        sd2 = actor.execute_all("get_state_dict")[0]
        for k in sd1:
            assert torch.allclose(sd2[k], sd1[k], atol=2e-7), k
    finally:
        actor.shutdown()


def test_ray_timeline_is_written(ray_session, tmp_path):
    """ray_init.timeline_json_file: after a task ran, the file is a chrome-trace JSON list naming that task."""
    import json

    import ray

    from rlhf_core.distributed.ray_init import write_ray_timeline

    @ray.remote(num_cpus=0.1)
    def timeline_probe():
        return 1

    assert ray.get(timeline_probe.remote()) == 1
    write_ray_timeline(None)  # null: nothing written
    path = tmp_path / "sub" / "timeline.json"
    write_ray_timeline(str(path))
    events = json.loads(path.read_text())
    assert isinstance(events, list) and any("timeline_probe" in str(e.get("name", "")) for e in events)


def test_max_concurrency_two_lets_a_call_reach_a_rank_busy_in_another(ray_session):
    """The fully async rollout group's ``max_concurrency=2`` (partial rollouts): ``interrupt_generation`` must run
    while the rank is inside a generation call. A rank blocked waiting for an event gets it from a second call;
    with the default (one call at a time) the second call queues behind the first, which times out."""
    import threading

    import ray

    class Waiter:
        def __init__(self) -> None:
            self.event = threading.Event()

        def wait(self, seconds: float) -> bool:
            return self.event.wait(seconds)

        def set(self) -> None:
            self.event.set()

    for concurrency, seconds, reached in ((2, 60.0, True), (1, 2.0, False)):
        group = RayWorkerGroup(Waiter, 1, {}, num_cpus_per_worker=0.1, name_prefix="waiter",
                               max_concurrency=concurrency)
        try:
            waiting = group._actors[0].call.remote("wait", seconds)  # submitted first (Ray keeps a caller's order)
            group.execute_all("set")  # concurrency 1: runs only after wait() returned
            assert ray.get(waiting) is reached, concurrency
        finally:
            group.shutdown()
