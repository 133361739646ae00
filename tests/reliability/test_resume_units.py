"""The pieces of exact and elastic resume, in seconds, without Ray.

* the driver's RNGs: seeded on a fresh run, saved in ``trainer_state.pt``, restored on resume, and untouched by the
  validation a resumed run repeats (the PPO driver with the fake worker groups of ``tests/rlhf_core/trainer/test_trainer_ppo``);
* the data position from the global step when a checkpoint has no ``data.pt``;
* the rollout's seed index: validation never advances the training-call counter;
* ``FSDPCheckpointManager``: same world size restores the saved RNG states; another world size loads the counters
  and LR scheduler of rank 0 and re-derives the RNGs from the seed, rank and global step.
"""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch


from tests.rlhf_core.trainer.test_trainer_ppo import (  # noqa: E402
    DecodeTok, FakeActor, FakeGroup, make_config, make_dataset, reward_fn)

from rlhf_core.trainer.ppo_trainer import RayPPOTrainer  # noqa: E402
from rlhf_core.trainer.tracking import read_metrics_jsonl  # noqa: E402
from rlhf_core.workers.checkpoint import FSDPCheckpointManager, derive_seed, seed_all  # noqa: E402
from rlhf_core.workers.rollout.postprocess import VALIDATION_CALLS, sampling_call_index  # noqa: E402

TIMING = ("timing", "perf/time", "perf/throughput")


def noisy_reward_fn(batch, return_dict=False):
    """``reward_fn`` plus 0.01·(python + numpy + torch draws) on every sample: scores depend on the driver's RNGs."""
    out = reward_fn(batch, return_dict)
    noise = [random.random() + float(np.random.rand()) + float(torch.rand(())) for _ in range(len(batch))]
    out["reward_tensor"][:, 0] += 0.01 * torch.tensor(noise)
    return out


def _run(cfg) -> RayPPOTrainer:
    actor = FakeActor([])
    trainer = RayPPOTrainer(cfg, DecodeTok(), lambda c: {"actor_rollout": FakeGroup(actor)}, noisy_reward_fn,
                            noisy_reward_fn, make_dataset(), make_dataset(4))
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return trainer


def _metrics(cfg) -> dict[int, dict[str, float]]:
    rows = read_metrics_jsonl(os.path.join(cfg.trainer.default_local_dir, "metrics.jsonl"))
    return {s: {k: v for k, v in m.items() if not k.startswith(TIMING)} for s, m in rows.items()}


def _compare_resumed(tmp_path, stop: int, after_stop=None) -> None:
    """4 steps per epoch, 6 steps: uninterrupted vs stopped at ``stop`` and resumed; every training metric equal."""
    full = make_config(tmp_path / "full", total_training_steps=6, save_freq=-1, test_freq=-1)
    _run(full)
    part = make_config(tmp_path / "part", total_training_steps=6, save_freq=-1, test_freq=-1, stop_after_step=stop)
    assert _run(part).global_steps == stop
    if after_stop is not None:
        after_stop(os.path.join(part.trainer.default_local_dir, f"global_step_{stop}"))
    random.seed(12345)  # the resumed driver must not depend on what the process drew in between
    np.random.seed(12345)
    torch.manual_seed(12345)
    resumed = make_config(tmp_path / "part", total_training_steps=6, save_freq=-1, test_freq=-1)
    assert _run(resumed).global_steps == 6
    a, b = _metrics(full), _metrics(resumed)
    for step in range(1, 7):
        assert {k: b[step][k] for k in a[step]} == a[step], step  # exact: scores carry the driver's RNG draws
    assert "val-aux/toy/reward/mean@2" in b[stop]  # the resumed run validated again before its first step


def test_driver_rngs_are_seeded_saved_and_restored(tmp_path):
    _compare_resumed(tmp_path, stop=2)
    saved = torch.load(tmp_path / "part" / "ckpt" / "global_step_2" / "trainer_state.pt", weights_only=False)
    assert set(saved["driver_rng"]) == {"cpu", "numpy", "random"}  # the driver never touches CUDA


def test_without_data_pt_the_data_position_follows_the_global_step(tmp_path, caplog):
    # stop at 5 = (epoch 1, 1 batch done) with 4 steps per epoch: the resumed run starts with epoch 1's 2nd batch
    _compare_resumed(tmp_path, stop=5, after_stop=lambda step_dir: os.remove(os.path.join(step_dir, "data.pt")))
    assert "data position derived from global step 5 (epoch 1, batch 1)" in caplog.text


def test_validation_calls_never_advance_the_training_counter():
    assert sampling_call_index(3, {"validate": False, "global_steps": 9}) == (3, True)
    assert sampling_call_index(3, {}) == (3, True)
    # validation at step 9, 2nd validation batch: its own index, from the step and the batch, the counter kept
    assert sampling_call_index(3, {"validate": True, "global_steps": 9, "val_batch": 1}) == (
        VALIDATION_CALLS + 4096 * 9 + 1, False)


def test_derive_seed_depends_on_seed_rank_and_step():
    seeds = {derive_seed(s, r, t) for s in (0, 1) for r in (0, 1) for t in (0, 1, 2)}
    assert len(seeds) == 12 and all(0 <= x < 2**31 for x in seeds)
    assert derive_seed(7, 1, 3) == derive_seed(7, 1, 3)


def _manager(seed: int, counters: dict):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    return model, opt, sched, FSDPCheckpointManager(model, opt, sched, None, None, ("model", "optimizer", "extra"),
                                                    extra_state=lambda: dict(counters),
                                                    set_extra_state=counters.update, seed=seed)


def _train_step(model, opt, sched):
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def test_checkpoint_same_world_restores_rngs_other_world_rederives_them(tmp_path, caplog):
    model, opt, sched, mgr = _manager(seed=11, counters={"actor_update_calls": 4})
    _train_step(model, opt, sched)
    path = tmp_path / "global_step_3" / "actor"
    torch.manual_seed(99)
    mgr.save(str(path))
    expected = (torch.rand(4), np.random.rand(), random.random())  # what the run draws next

    counters: dict = {}
    model2, opt2, sched2, mgr2 = _manager(seed=11, counters=counters)
    mgr2.load(str(path))
    assert torch.equal(torch.rand(4), expected[0]) and np.random.rand() == expected[1]
    assert random.random() == expected[2]
    assert counters == {"actor_update_calls": 4} and sched2.last_epoch == sched.last_epoch == 1
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))

    # as if saved by 2 ranks and loaded by 1: rank 0's counters and scheduler, RNGs re-derived for (seed, rank 0, step 3)
    saved = (path / "extra_state_world_size_1_rank_0.pt").read_bytes()
    (path / "extra_state_world_size_1_rank_0.pt").unlink()
    for r in (0, 1):
        (path / f"extra_state_world_size_2_rank_{r}.pt").write_bytes(saved)
    counters.clear()
    model3, opt3, sched3, mgr3 = _manager(seed=11, counters=counters)
    with caplog.at_level("WARNING", logger="rlhf_core.workers.checkpoint"):
        mgr3.load(str(path))
    assert "saved with 2 ranks, loading with 1" in caplog.text and "seed 11 and global step 3" in caplog.text
    assert counters == {"actor_update_calls": 4} and sched3.last_epoch == 1
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model3.parameters()))
    drawn = torch.rand(4), np.random.rand(), random.random()
    seed_all(derive_seed(11, 0, 3))
    assert torch.equal(drawn[0], torch.rand(4)) and drawn[1] == np.random.rand() and drawn[2] == random.random()

    for f in path.glob("extra_state_*"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="extra_state_world_size_1_rank_0.pt is missing"):
        mgr3.load(str(path))
