"""verl 0.9's ``trainer.v1.trainer_mode`` and ``trainer.v1.separate_async.*`` (rlhf_core/config/v1_trainer.py):
separate_async runs the fully asynchronous driver with the keys verl's v1 values mean; sync the on-policy driver;
colocate_async is refused naming why. Fast: config loads, and the driver ``make_trainer`` builds (no worker starts).
The fully async driver's runs with the same resolved keys are tests/rlhf_core/trainer/test_fully_async.py's (its
``staleness_threshold=1, trigger_parameter_sync_step=1`` run is ``num_warmup_batches=1, parameter_sync_step=1``)."""
from __future__ import annotations

import pytest

from rlhf_core.config import ConfigError
from tests.rlhf_core.trainer.test_one_step_off_policy import _config
from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, make_dataset, reward_fn

SA = "trainer.v1.trainer_mode=separate_async"
AT_KEYS = ("mode", "require_batches", "trigger_parameter_sync_step", "staleness_threshold", "partial_rollout",
           "concurrent_samples_per_replica")


def _at(cfg) -> dict:
    return {k: cfg.async_training[k] for k in AT_KEYS}


def test_separate_async_sets_the_fully_async_keys_it_means(tmp_path):
    # _config: data.train_batch_size=2, ppo_mini_batch_size=2, so verl's invariant needs parameter_sync_step=1
    v1 = _config(tmp_path, SA, "trainer.v1.separate_async.parameter_sync_step=1",
                 "trainer.v1.separate_async.num_warmup_batches=1")
    fa = _config(tmp_path, "async_training.mode=fully_async", "async_training.require_batches=1",
                 "async_training.trigger_parameter_sync_step=1", "async_training.staleness_threshold=1")
    assert _at(v1) == _at(fa) and v1.async_training.mode == "fully_async"
    assert (v1.async_training.staleness_threshold, v1.async_training.trigger_parameter_sync_step) == (1.0, 1)
    # num_warmup_batches=0: the rollouter never runs ahead (threshold 0, a push per step: the on-policy run)
    v0 = _config(tmp_path, SA, "trainer.v1.separate_async.parameter_sync_step=1",
                 "trainer.v1.separate_async.num_warmup_batches=0")
    assert v0.async_training.staleness_threshold == 0.0
    # parameter_sync_step=2 with mini-batch 2: 4 prompts a step, two mini-batch updates, then one push
    v2 = _config(tmp_path, SA, "trainer.v1.separate_async.parameter_sync_step=2", "data.train_batch_size=4")
    assert (v2.async_training.require_batches, v2.data.train_batch_size) == (2, 4)
    # verl's fully async spelling data.train_batch_size=0 is derived from them: 2 × 3 = 6
    v3 = _config(tmp_path, SA, "trainer.v1.separate_async.parameter_sync_step=3", "data.train_batch_size=0")
    assert (v3.async_training.require_batches, v3.data.train_batch_size) == (3, 6)
    # the async_training key set to what the v1 key means: accepted
    assert _config(tmp_path, SA, "trainer.v1.separate_async.parameter_sync_step=1",
                   "async_training.mode=fully_async", "async_training.trigger_parameter_sync_step=1").async_training.mode \
        == "fully_async"


def test_sync_and_use_v1_false_leave_the_driver_alone(tmp_path):
    assert _config(tmp_path).async_training.mode == "on_policy"  # trainer_mode=sync (verl's default)
    # trainer.use_v1=False: verl runs its legacy main_ppo_v0, which reads no trainer.v1 key
    assert _config(tmp_path, SA, "trainer.use_v1=False").async_training.mode == "on_policy"
    # sync with async_training.mode set: that key still chooses
    assert _config(tmp_path, "async_training.mode=fully_async").async_training.mode == "fully_async"


def test_separate_async_refuses_disagreeing_keys_naming_both(tmp_path):
    sa1 = (SA, "trainer.v1.separate_async.parameter_sync_step=1")
    with pytest.raises(ConfigError, match=r"async_training.mode='one_step_off_policy' and "
                                          r"trainer.v1.trainer_mode='separate_async' disagree"):
        _config(tmp_path, *sa1, "async_training.mode=one_step_off_policy")
    with pytest.raises(ConfigError, match=r"async_training.trigger_parameter_sync_step=2 and "
                                          r"trainer.v1.trainer_mode='separate_async' \(one weight push per step\)"):
        _config(tmp_path, *sa1, "async_training.trigger_parameter_sync_step=2")
    with pytest.raises(ConfigError, match=r"async_training.staleness_threshold=0.5 and "
                                          r"trainer.v1.separate_async.num_warmup_batches=1 disagree"):
        _config(tmp_path, *sa1, "async_training.staleness_threshold=0.5")
    with pytest.raises(ConfigError, match=r"async_training.require_batches=2 and "
                                          r"trainer.v1.separate_async.parameter_sync_step=1 disagree"):
        _config(tmp_path, *sa1, "async_training.require_batches=2")
    # verl's invariant, with the default parameter_sync_step=4: 4 × 2 = 8 prompts a step, the loader gives 2
    with pytest.raises(ConfigError, match=r"data.train_batch_size=2: trainer.v1.trainer_mode=separate_async trains "
                                          r".*parameter_sync_step × .*ppo_mini_batch_size = 4 × 2 = 8 prompts"):
        _config(tmp_path, SA)
    with pytest.raises(ConfigError, match=r"trainer.v1.separate_async.num_warmup_batches=-1 must be an integer >= 0"):
        _config(tmp_path, *sa1, "trainer.v1.separate_async.num_warmup_batches=-1")
    with pytest.raises(ConfigError, match=r"trainer.v1.separate_async.parameter_sync_step=0 must be an integer >= 1"):
        _config(tmp_path, SA, "trainer.v1.separate_async.parameter_sync_step=0")


def test_colocate_async_is_refused_naming_why(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.v1.trainer_mode='colocate_async' needs verl's colocate_async: "
                                          r"rollout replicas on the actor's own devices"):
        _config(tmp_path, "trainer.v1.trainer_mode=colocate_async")
    with pytest.raises(ConfigError, match=r"trainer.v1.colocate_async.num_warmup_batches=2 is not supported yet "
                                          r"\(read only by trainer.v1.trainer_mode=colocate_async"):
        _config(tmp_path, "trainer.v1.colocate_async.num_warmup_batches=2")


def test_separate_async_builds_the_fully_async_driver(tmp_path):
    from rlhf_core.trainer.fully_async import FullyAsyncTrainer
    from rlhf_core.trainer.main_ppo import make_trainer
    from rlhf_core.trainer.ppo_trainer import RayPPOTrainer

    cfg = _config(tmp_path, SA, "trainer.v1.separate_async.parameter_sync_step=1")
    trainer = make_trainer(cfg, DecodeTok(), reward_fn, None, make_dataset(6), None)
    try:
        assert type(trainer) is FullyAsyncTrainer
        # what only that driver records: its queue's static bound, max_required_samples = int(required 2 ×
        # (1 + staleness_threshold 1) × trigger 1) = 4, i.e. num_warmup_batches=1 batch of 2 beyond the step's own
        stats = trainer.queue.stats()
        assert stats["fully_async/static/max_required_samples"] == 4
        assert stats["fully_async/static/required_samples"] == 2
    finally:
        trainer.shutdown()
    on = make_trainer(_config(tmp_path), DecodeTok(), reward_fn, None, make_dataset(6), None)
    try:
        assert type(on) is RayPPOTrainer  # trainer_mode=sync
    finally:
        on.shutdown()
