"""Exact and elastic resume of a PPO (GRPO) run, end to end through ``run_ppo`` on Ray (one Ray session here).

Exact: an uninterrupted run of 4 steps (2 epochs of 2 steps) against a run interrupted three times — after step 1,
after step 2 (the epoch boundary) and after step 3 (the middle of epoch 2) — each part a new ``run_ppo`` with new
worker processes, resumed with ``trainer.resume_mode=auto``. Every per-step metric except wall-clock timings, and
every tensor of the final parameters, must be bit-identical. The config (``resume_fixtures.resume_config``) makes
each RNG matter: sampled rollouts, attention dropout on the workers, the shuffled data order, and a reward function
drawing from the driver's python/numpy/torch RNGs; ``val_before_train`` validates again at every resume.

Elastic: the step-1 checkpoint (1 rank) resumes with 2 ranks for one step, and that step-2 checkpoint (2 ranks)
resumes with 1 rank for one more step. Not bit-identical to a 1-rank run (docs/RESUME.md): the test asserts that the
parameters right after the load equal the saved ones, that the global step and the data position continue (the step
trains on the same prompts as the uninterrupted run's step), and that the continued run writes its checkpoint.
"""
from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch

from resume_fixtures import (assert_params_equal, checkpoint_params, resume_config, run_metrics, step_prompts,
                             write_prompts)

pytestmark = [pytest.mark.slow, pytest.mark.ray]

STEPS = 4  # 4 prompts, 2 per step: 2 steps per epoch, 2 epochs
INTERRUPTIONS = (1, 2, 3)  # step 1; step 2 = the end of epoch 1 (an epoch boundary); step 3 = the middle of epoch 2


@pytest.fixture(scope="module")
def files(tmp_path_factory, gsm8k_dir):
    return write_prompts(gsm8k_dir, tmp_path_factory.mktemp("resume_data"), n_train=4, n_val=1)


@pytest.fixture(scope="module")
def runs(tiny_model_dir, files, tmp_path_factory):
    """The uninterrupted run and the interrupted one: ``(full_dir, chain_dir, [global_step of each part])``.

    ``save_freq=100`` saves only at the last step (with ``hf_model``: the full weights to compare); a
    ``stop_after_step`` part also saves at the step where it stops."""
    from rlhf_core.trainer.main_ppo import run_ppo

    root = tmp_path_factory.mktemp("resume_runs")
    old = os.environ.pop("RLHF_METRICS_FILE", None)
    try:
        full, chain = root / "full", root / "chain"
        assert run_ppo(resume_config(tiny_model_dir, files, full, "trainer.save_freq=100"))["global_step"] == STEPS
        parts = []
        for k in (*INTERRUPTIONS, None):
            if k == 3:  # as a part killed during step 3 leaves the file: step 3's first metric and a torn line
                (root / "through_step_2.jsonl").write_bytes((chain / "metrics.jsonl").read_bytes())
                with open(chain / "metrics.jsonl", "ab") as fh:
                    fh.write(b'{"step": 3, "name": "critic/score/mean", "value": 99.0, "timestamp": 0}\n{"step": 3')
            parts.append(run_ppo(resume_config(tiny_model_dir, files, chain, "trainer.save_freq=100",
                                               *([f"trainer.stop_after_step={k}"] if k else [])))["global_step"])
    finally:
        if old is not None:
            os.environ["RLHF_METRICS_FILE"] = old
    return full, chain, parts


def test_resume_at_step_1_epoch_boundary_and_mid_epoch_is_bit_identical(runs):
    full, chain, parts = runs
    assert parts == [1, 2, 3, 4]
    # where each part stopped in the data: (epoch, batches done in it) = divmod(step, 2 steps per epoch)
    for step in INTERRUPTIONS:
        data = torch.load(chain / f"global_step_{step}" / "data.pt", weights_only=False)
        assert (data["epoch"], data["batches_done"]) == divmod(step, 2), step
    a, b = run_metrics(full), run_metrics(chain)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4]
    # the metrics file holds each (step, metric) once: the part resumed at step 2 dropped the killed attempt's lines
    # of step 3 (rlhf_core/trainer/metrics_file.py) and kept those of steps <= 2 byte for byte
    text = (chain / "metrics.jsonl").read_bytes()
    assert text.startswith((chain.parent / "through_step_2.jsonl").read_bytes())
    keys = [(r["step"], r["name"]) for r in map(json.loads, text.splitlines())]
    assert len(keys) == len(set(keys)) and b"99.0" not in text
    for step in range(STEPS + 1):
        assert a[step], step
        assert {k: b[step].get(k) for k in a[step]} == a[step], step  # exact float equality, every metric
    # the resumed parts validated again before their first step (val_before_train), without shifting any RNG
    for step in INTERRUPTIONS:
        assert "val-core/openai/gsm8k/reward/mean@1" in b[step] and "val-core/openai/gsm8k/reward/mean@1" not in a[step]
    # the reward noise came from the driver RNGs: scores are not all multiples of 1/4 (the length reward alone)
    assert any(v * 4 != round(v * 4) for v in (a[s]["critic/score/max"] for s in range(1, STEPS + 1)))
    for step in range(1, STEPS + 1):  # the same prompts and the same sampled responses
        assert (chain / "rollouts" / f"{step}.jsonl").read_text() == (full / "rollouts" / f"{step}.jsonl").read_text()
    assert_params_equal(checkpoint_params(full / f"global_step_{STEPS}"), checkpoint_params(chain / f"global_step_{STEPS}"))


def _trainer(config):
    """A ``RayPPOTrainer`` built as ``run_ppo`` builds it (so the test can look at it between load and fit)."""
    from rlhf_core.config import validate_ppo_config
    from rlhf_core.distributed.ray_init import init_ray
    from rlhf_core.reward import load_reward_manager
    from rlhf_core.trainer.main_ppo import build_datasets, build_worker_groups, load_driver_tokenizer
    from rlhf_core.trainer.ppo_trainer import RayPPOTrainer

    validate_ppo_config(config, int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node))
    tokenizer = load_driver_tokenizer(config)
    train, val = build_datasets(config, tokenizer)
    init_ray(config.ray_init.address, config.ray_init.num_cpus)
    return RayPPOTrainer(config, tokenizer, build_worker_groups, load_reward_manager(config, tokenizer, num_examine=0),
                         load_reward_manager(config, tokenizer, num_examine=1), train, val)


def _resume_elastic(config, saved_step: int, ranks_before: int, caplog) -> dict:
    """Load the checkpoint of ``saved_step`` with the config's ranks; check the load; train to ``stop_after_step``."""
    from rlhf_core.trainer.ppo_checkpoint import prepare_resume

    trainer = _trainer(config)
    try:
        trainer.init_workers()
        with caplog.at_level(logging.WARNING, logger="rlhf_core.trainer.ppo_checkpoint"):
            trainer._load_checkpoint(prepare_resume(trainer))  # as fit does: lock, pick the step
        ranks = int(config.trainer.n_gpus_per_node)
        assert f"saved with {ranks_before} ranks and resumes with {ranks}" in caplog.text
        assert trainer.global_steps == saved_step
        loader = trainer.train_dataloader
        assert (loader.epoch, loader.batches_done) == divmod(saved_step, 2)
        saved = checkpoint_params(os.path.join(str(config.trainer.default_local_dir), f"global_step_{saved_step}"))
        per_rank = trainer.actor_wg.execute_all("get_state_dict")
        assert len(per_rank) == ranks
        for params in per_rank:  # DCP resharded the saved shards onto the new ranks: the full weights are unchanged
            assert_params_equal(params, saved)
        return trainer.fit()  # loads the same checkpoint again (idempotent), then trains
    finally:
        trainer.shutdown()


def test_elastic_resume_1_to_2_to_1_ranks(runs, tiny_model_dir, files, tmp_path, caplog):
    full, chain, _ = runs
    out = tmp_path / "elastic"
    out.mkdir()
    shutil.copytree(chain / "global_step_1", out / "global_step_1")  # saved by 1 rank
    (out / "latest_checkpointed_iteration.txt").write_text("1")
    common = ("trainer.val_before_train=false", "trainer.save_freq=100")
    up = resume_config(tiny_model_dir, files, out, *common, "trainer.n_gpus_per_node=2", "trainer.stop_after_step=2")
    last = _resume_elastic(up, 1, 1, caplog)
    assert last["training/global_step"] == 2 and last["training/epoch"] == 0
    assert sorted(f for f in os.listdir(out / "global_step_2" / "actor") if f.startswith("extra_state")) == [
        "extra_state_world_size_2_rank_0.pt", "extra_state_world_size_2_rank_1.pt"]
    caplog.clear()
    down = resume_config(tiny_model_dir, files, out, *common, "trainer.n_gpus_per_node=1", "trainer.stop_after_step=3")
    last = _resume_elastic(down, 2, 2, caplog)
    assert last["training/global_step"] == 3 and last["training/epoch"] == 1
    a, b = run_metrics(full), run_metrics(out)
    # the data position continued: steps 2 and 3 trained on the uninterrupted run's prompts
    for step in (2, 3):
        assert step_prompts(out, step) == step_prompts(full, step), step
        assert b[step]["prompt_length/mean"] == a[step]["prompt_length/mean"], step
        assert b[step]["training/global_step"] == step
    assert step_prompts(full, 2) != step_prompts(full, 3)  # 2 prompts each: the check above can tell steps apart
    assert sorted(b) == [2, 3]  # nothing logged for the steps before the resumed checkpoint
