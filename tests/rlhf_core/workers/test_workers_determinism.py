"""``fsdp_config.full_determinism`` + ``fsdp_config.seed`` (actor, reference; ``critic.fsdp``) and SFT's
``engine.full_determinism`` + ``engine.seed``: verl 0.9's FSDP engine calls ``enable_full_determinism(seed)`` before
it builds the model, and reads ``seed`` nowhere else."""
from __future__ import annotations

import os
import random

import pytest
import torch

from rlhf_core.trainer import sft_worker
from rlhf_core.workers import fsdp_workers
from rlhf_core.workers.determinism import _DETERMINISTIC_ENV, apply_engine_determinism

from tests.fixtures.config_fixtures import typed_config
from tests.rlhf_core.workers.test_workers_fsdp import ppo_config


@pytest.fixture
def restore_global_state(monkeypatch):
    """The process-wide settings enable_full_determinism changes, put back after the test."""
    for name in (*_DETERMINISTIC_ENV, "PYTHONHASHSEED"):
        monkeypatch.delenv(name, raising=False)  # records the value before, restored at teardown
    cudnn = torch.backends.cudnn
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              cudnn.deterministic, cudnn.benchmark, cudnn.enabled, torch.random.get_rng_state())
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    cudnn.deterministic, cudnn.benchmark, cudnn.enabled = before[2:5]
    torch.random.set_rng_state(before[5])


def test_full_determinism_seeds_and_forces_deterministic_kernels(restore_global_state):
    cfg = typed_config("ppo_trainer", "critic.fsdp.full_determinism=True", "critic.fsdp.seed=123").critic.fsdp
    assert apply_engine_determinism(cfg) is True
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.initial_seed() == 123 and not torch.backends.cudnn.benchmark
    first = (torch.rand(3), random.random())
    apply_engine_determinism(cfg)
    assert torch.equal(torch.rand(3), first[0]) and random.random() == first[1]  # the same draws from seed 123
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8" and os.environ["PYTHONHASHSEED"] == "123"


def test_without_full_determinism_nothing_changes(restore_global_state):
    torch.manual_seed(5)
    cfg = typed_config("ppo_trainer", "critic.fsdp.seed=123").critic.fsdp  # seed alone: read only with the flag
    assert apply_engine_determinism(cfg) is False
    assert torch.initial_seed() == 5 and not torch.are_deterministic_algorithms_enabled()


class _Built(Exception):
    pass


@pytest.mark.parametrize("role, section", [("actor_rollout", "actor_rollout_ref.actor.fsdp_config"),
                                           ("ref", "actor_rollout_ref.ref.fsdp_config"), ("critic", "critic.fsdp")])
def test_each_worker_applies_its_section_before_building_the_model(role, section, tiny_model_dir, monkeypatch):
    calls = []
    monkeypatch.setattr(fsdp_workers, "apply_engine_determinism",
                        lambda cfg: calls.append((cfg.full_determinism, int(cfg.seed))))

    def build_model(*a, **k):
        calls.append("build")
        raise _Built

    monkeypatch.setattr(fsdp_workers, "build_model", build_model)
    config = ppo_config(tiny_model_dir, f"{section}.full_determinism=True", f"{section}.seed=9")
    worker = (fsdp_workers.CriticWorker(config) if role == "critic"
              else fsdp_workers.ActorRolloutRefWorker(config, role=role))
    with pytest.raises(_Built):
        worker.init_model()
    assert calls == [(True, 9), "build"]


def test_sft_worker_applies_engine_determinism_after_trainer_seed(monkeypatch):
    calls = []
    monkeypatch.setattr(sft_worker, "apply_engine_determinism", lambda cfg: calls.append(int(cfg.seed)))

    def load(*a, **k):
        calls.append("load")
        raise _Built

    monkeypatch.setattr(sft_worker, "load_causal_lm", load)
    worker = sft_worker.SFTWorker(typed_config("sft_trainer", "data.micro_batch_size_per_gpu=1",
                                               "engine.full_determinism=True", "engine.seed=8"), 1)
    with pytest.raises(_Built):
        worker.init_model()
    assert calls == [8, "load"]
