"""trainer.esi_redundant_time: a checkpoint is saved once the cloud capacity block ends within 60 s (a save) + the
longest step + esi_redundant_time (verl 0.9's should_save_ckpt_esi), with save_freq > 0."""
from __future__ import annotations

import pytest

from rlhf_core.trainer.esi import EXPIRY_VARS, capacity_expiring

VOLCANO, SAGEMAKER = EXPIRY_VARS


@pytest.fixture(autouse=True)
def _no_expiry(monkeypatch):
    for name in EXPIRY_VARS:
        monkeypatch.delenv(name, raising=False)


def test_volcano_expiry_within_save_step_and_margin(monkeypatch):
    monkeypatch.setenv(VOLCANO, "1100")  # 100 s left at now=1000
    assert not capacity_expiring(30, 0, now=1000)  # 100 > 60 + 30
    assert capacity_expiring(30, 20, now=1000)  # 100 <= 60 + 30 + 20: the margin decides
    assert not capacity_expiring(0, 500, now=1000)  # no step measured yet
    assert not capacity_expiring(30, 20, now=1200)  # already expired
    monkeypatch.setenv(VOLCANO, "soon")
    assert not capacity_expiring(30, 1000, now=1000)


def test_sagemaker_expiry_and_no_variable(monkeypatch):
    assert not capacity_expiring(30, 10**6, now=1000)  # no capacity block: never
    monkeypatch.setenv(SAGEMAKER, "1100")
    assert not capacity_expiring(10, 20, now=1000)  # 100 s left >= 90
    assert capacity_expiring(10, 40, now=1000)  # < 110
    monkeypatch.setenv(SAGEMAKER, "soon")  # not a number: no expiry known, the run goes on (it raised ValueError)
    assert not capacity_expiring(10, 10**6, now=1000)


def test_trainer_saves_off_schedule_when_the_block_expires(tmp_path, monkeypatch):
    from tests.rlhf_core.config.test_config_explicit_values import _ppo_trainer
    from tests.rlhf_core.trainer.test_trainer_ppo import make_config

    cfg = make_config(tmp_path)
    cfg.trainer.save_freq, cfg.trainer.esi_redundant_time = 5, 3600
    trainer = _ppo_trainer(cfg)
    trainer.global_steps, trainer._max_step_s = 1, 2.0  # step 1 of save_freq 5: not a save step
    assert not trainer._should_save(False)
    import time

    monkeypatch.setenv(VOLCANO, str(time.time() + 1800))  # 30 min left < 60 s + 2 s + 1 h
    assert trainer._should_save(False)
    cfg.trainer.esi_redundant_time = 0  # 30 min left > 62 s: no save
    assert not trainer._should_save(False)
    cfg.trainer.save_freq, cfg.trainer.esi_redundant_time = -1, 3600  # save_freq <= 0: never (verl's)
    assert not trainer._should_save(False)
