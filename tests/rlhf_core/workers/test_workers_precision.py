"""``fsdp_config.mixed_precision`` (workers/precision.py): bf16 compute on fp32 master weights, through the worker."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.rlhf_core.workers.test_workers_fsdp import ppo_config, training_batch  # noqa: E402

from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402
from rlhf_core.workers.precision import mixed_precision_policy  # noqa: E402

MP = "actor_rollout_ref.actor.fsdp_config.mixed_precision."


def test_policy_from_keys():
    assert mixed_precision_policy(None) is None
    assert mixed_precision_policy({"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}) is None
    p = mixed_precision_policy({"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"})
    assert p.param_dtype == torch.bfloat16 and p.reduce_dtype == torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        mixed_precision_policy({"param_dtype": "fp8", "reduce_dtype": "fp32", "buffer_dtype": "fp32"})


def test_bf16_compute_keeps_fp32_master_weights_and_tracks_fp32(tiny_model_dir):
    out = {}
    for dtype in ("fp32", "bf16"):
        wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(
            tiny_model_dir, f"{MP}param_dtype={dtype}"), "role": "actor_rollout"})
        wg.execute_all("init_model")
        if dtype == "fp32":
            batch = training_batch(wg, seed=12)
        lp = wg.execute_dp("compute_log_prob", batch)["old_log_probs"]
        m = wg.execute_dp("update_actor", batch)[0]
        sd = wg.worker.get_state_dict()
        out[dtype] = (lp, m, sd)
    mask = batch["response_mask"].bool()
    lp32, m32, sd32 = out["fp32"]
    lp16, m16, sd16 = out["bf16"]
    assert all(v.dtype == torch.float32 for v in sd16.values())  # master weights stay fp32
    diff = (lp16 - lp32)[mask].abs()
    # bf16 has an 8-bit mantissa: relative error ~2^-8 per op; log-probs of a 1000-token vocab (~ -7) move by
    # a few 1e-2 but not by 1, and they are not bitwise equal (the cast did happen)
    assert 0 < diff.max() < 0.5
    assert m16["actor/grad_norm"] == pytest.approx(m32["actor/grad_norm"], rel=0.1)


def test_rollout_engine_generates_in_the_actors_compute_dtype(tiny_model_dir):
    # verl's HF rollout runs the FSDP module itself, so under param_dtype=bf16 it samples from bf16 numerics; our
    # engine copy must do the same (and stay fp32 when the actor computes in fp32)
    from rlhf_core.workers.rollout.engine_copy import build_engine_copy

    for dtype, want in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        arr = ppo_config(tiny_model_dir, f"{MP}param_dtype={dtype}").actor_rollout_ref
        engine = build_engine_copy(arr.model, arr.actor.fsdp_config)
        assert {p.dtype for p in engine.parameters()} == {want}
        # floating buffers follow buffer_dtype (fp32 by default), as in the actor's FSDP forward
        assert {b.dtype for b in engine.buffers() if b.is_floating_point()} == {torch.float32}
    arr = ppo_config(tiny_model_dir, f"{MP}param_dtype=bf16", f"{MP}buffer_dtype=bf16").actor_rollout_ref
    engine = build_engine_copy(arr.model, arr.actor.fsdp_config)
    assert {b.dtype for b in engine.buffers() if b.is_floating_point()} == {torch.bfloat16}
    # the weight sync casts the actor's fp32 state into the engine's dtype
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(tiny_model_dir, f"{MP}param_dtype=bf16"),
                                                  "role": "actor_rollout"})
    wg.execute_all("init_model")
    eng = wg.worker.rollout.module
    sd = wg.worker.get_state_dict()
    name, p = next(iter(eng.named_parameters()))
    assert p.dtype == torch.bfloat16 and torch.equal(p, sd[name].to(torch.bfloat16))
