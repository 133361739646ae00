"""The fully asynchronous driver (``async_training.mode=fully_async``, verl's fully_async_policy).

Fast: the queue's staleness rule on hand-derived sequences, the staleness bound under a real producer thread and
consumer thread, the config refusals. Slow (the tiny model through the real FSDP2 actor and HF rollout, in-process
worker groups as tests/rlhf_core/trainer/test_one_step_off_policy.py, 3 steps): (a) staleness_threshold=0 with a sync every step
equals the on-policy run (metrics and final weights); (b) staleness_threshold=1: every update's lag is within the
bound, and verl's metrics are logged; (c) the same through ``run_ppo`` on Ray worker groups (real Ray actors);
(d) partial_rollout=True: the chunks a sync interrupts are resumed under the new version (``fully_async/partial/*``).
"""
from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from tests.rlhf_core.trainer.test_one_step_off_policy import _config, _same, run_driver  # noqa: E402
from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, make_dataset, reward_fn  # noqa: E402
from tests.flows.test_verl09_examples_train import gsm8k_parquet  # noqa: E402,F401 (a fixture)

from rlhf_core.config import ConfigError  # noqa: E402
from rlhf_core.trainer.fully_async_queue import RolloutQueue, max_required_samples, max_staleness  # noqa: E402

pytestmark = pytest.mark.ray  # starts Ray: calls run_ppo

FA = ("async_training.mode=fully_async", "async_training.partial_rollout=False")


def test_max_required_samples_and_the_lag_bound_by_hand():
    # verl: int(required × (1 + threshold) × trigger); required = ppo_mini_batch_size × require_batches
    assert max_required_samples(2, 0.0, 1) == 2 and max_required_samples(16, 0.5, 4) == 96
    assert max_required_samples(2, 0.1, 4) == 8  # int(8.8)
    # bound = ceil(q / R), R = required × trigger consumed per version, q = max_required - R rounded down to chunks
    assert max_staleness(2, 0.0, 1, chunk=2) == 0  # q = 0: every sample trained by the version that made it
    assert max_staleness(2, 1.0, 1, chunk=2) == 1  # M = 4, q = 2, R = 2
    assert max_staleness(2, 0.5, 1, chunk=2) == 0  # M = 3, q = 1 → 0 whole chunks of 2
    assert max_staleness(2, 0.5, 2, chunk=2) == 1  # M = 6, R = 4, q = 2
    assert max_staleness(2, 2.0, 1, chunk=2) == 2  # M = 6, R = 2, q = 4
    assert max_staleness(2, 1.5, 1, chunk=1) == 2  # M = 5, R = 2, q = 3 → ceil(3 / 2)


def test_queue_pauses_at_max_required_samples_and_drops_the_oldest_when_full():
    q = RolloutQueue(required_samples=2, staleness_threshold=1.0, trigger_parameter_sync_step=1)  # max 4 samples
    assert q.acquire(2) and q.acquire(2)
    assert not q.acquire(2, timeout=0.05)  # 4 + 2 > 4: the rollouter pauses
    q.put(2, 0, "a")
    q.put(2, 0, "b")
    assert q.get() == (0, "a")  # FIFO
    assert not q.acquire(2, timeout=0.05)  # consuming does not free the budget: only a parameter sync does
    q.reset_staleness()  # after the sync: staleness = the 2 samples of "b" still queued
    assert q.staleness_samples == 2 and q.acquire(2) and q.staleness_samples == 4
    q.put(2, 1, "c")
    q.put(2, 1, "d")  # queue: b, c, d = 6 samples > max_queue_size 4: the oldest ("b") is dropped
    stats = q.stats()
    assert stats["fully_async/count/dropped_stale_samples"] == 2
    assert stats["fully_async/count/total_generated_samples"] == 8
    assert stats["fully_async/monitor/queue/mq_queue_size"] == 4
    assert [q.get(), q.get()] == [(1, "c"), (1, "d")]
    q.close()
    assert q.get() is None and not q.acquire(1)
    # release: the inverse of acquire (a fresh queue, budget 4); more than is acquired and not put is refused
    q = RolloutQueue(required_samples=2, staleness_threshold=1.0, trigger_parameter_sync_step=1)
    assert q.acquire(3) and not q.acquire(2, timeout=0.05)  # 3 + 2 > 4
    q.release(3)
    assert q.staleness_samples == 0 and q.acquire(4)
    with pytest.raises(ValueError, match=r"release\(5\): 4 samples are acquired and not yet put"):
        q.release(5)


@pytest.mark.parametrize("required,threshold,trigger", [(2, 0.0, 1), (2, 1.0, 1), (2, 0.5, 2), (1, 2.0, 3)])
def test_the_lag_stays_within_the_bound_with_real_threads(required, threshold, trigger):
    """A producer thread (the rollouter) and this thread (the trainer) at random speeds: each sample's lag
    (version at training - version that generated it) is at most max_staleness, and the bound is reached."""
    rng = random.Random(7)
    q = RolloutQueue(required, threshold, trigger)
    version = [0]
    lock = threading.Lock()  # the generation lock: a sync waits for the chunk in flight

    def rollouter():
        for i in range(60):
            if not q.acquire(required):
                return
            with lock:
                v = version[0]
                time.sleep(rng.random() * 0.002)
            q.put(required, v, i)
        q.close()

    thread = threading.Thread(target=rollouter)
    thread.start()
    lags = []
    for step in range(1, 61):
        item = q.get()
        if item is None:
            break
        lags.append(version[0] - item[0])
        time.sleep(rng.random() * 0.002)
        if step % trigger == 0:
            with lock:
                version[0] += 1
            q.reset_staleness()
    q.close()
    thread.join()
    bound = max_staleness(required, threshold, trigger, chunk=required)
    assert len(lags) == 60 and max(lags) <= bound and min(lags) >= 0
    assert q.stats()["fully_async/count/dropped_stale_samples"] == 0  # the pause rule keeps the queue from overflowing


def test_fully_async_refuses_what_it_cannot_run_when_the_config_loads(tmp_path):
    from rlhf_core.config.off_policy import fully_async_config_errors

    assert fully_async_config_errors(_config(tmp_path, *FA)) == []
    assert fully_async_config_errors(_config(tmp_path, "async_training.mode=fully_async")) == []  # partial: verl's
    # the trainer takes ppo_mini_batch_size 2 × require_batches 2 = 4 prompts per step; the loader gives 2
    with pytest.raises(ConfigError, match=r"data.train_batch_size=2: with async_training.mode=fully_async .* = 2 × 2 "
                                          r"= 4 prompts per step; set data.train_batch_size=4"):
        _config(tmp_path, *FA, "async_training.require_batches=2")
    with pytest.raises(ConfigError, match=r"async_training.staleness_threshold=-0.5 must be >= 0"):
        _config(tmp_path, *FA, "async_training.staleness_threshold=-0.5")
    with pytest.raises(ConfigError, match=r"async_training.trigger_parameter_sync_step=0 must be >= 1"):
        _config(tmp_path, *FA, "async_training.trigger_parameter_sync_step=0")
    with pytest.raises(ConfigError, match=r"async_training.concurrent_samples_per_replica=0 must be >= 1"):
        _config(tmp_path, *FA, "async_training.concurrent_samples_per_replica=0")
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator=remax: .* async_training.mode=fully_async does "):
        _config(tmp_path, *FA, "algorithm.adv_estimator=remax")
    with pytest.raises(ConfigError, match=r"async_training.use_trainer_do_validate=True moves the fully asynchronous "
                                          r"trainer's validation .* but async_training.mode=on_policy"):
        _config(tmp_path, "async_training.use_trainer_do_validate=True")
    assert _config(tmp_path, *FA, "actor_rollout_ref.hybrid_engine=False")  # verl's fully async scripts set it
    with pytest.raises(ConfigError, match=r"rollout.total_rollout_steps=1 samples is fewer than one trainer step "
                                          r"takes \(ppo_mini_batch_size × require_batches = 2\)"):
        _config(tmp_path, *FA, "rollout.total_rollout_steps=1")
    # verl's fully async scripts leave data.train_batch_size at 0 (verl ignores it): read as ppo_mini_batch_size ×
    # require_batches = 2 × 2 = 4, with one notice
    from rlhf_core.config.off_policy import FullyAsyncBatchNotice
    with pytest.warns(FullyAsyncBatchNotice, match=r"data.train_batch_size=0 .* = 2 × 2 = 4"):
        cfg = _config(tmp_path, *FA, "data.train_batch_size=0", "async_training.require_batches=2")
    assert cfg.data.train_batch_size == 4
    with pytest.raises(ConfigError, match=r"data.train_batch_size=0 must be > 0"):  # not fully async: refused
        _config(tmp_path, "data.train_batch_size=0")
    # the trainer's per-step sampler update / datagen growth would race the rollouter thread's draws
    with pytest.raises(ConfigError, match=r"data.sampler.class_path=s.py: the rollouter thread draws from the data "
                                          r"loader while the trainer updates the sampler"):
        _config(tmp_path, *FA, "data.sampler.class_path=s.py", "data.sampler.class_name=S")
    with pytest.raises(ConfigError, match=r"data.datagen.path=g.py: the rollouter thread draws"):
        _config(tmp_path, *FA, "data.datagen.path=g.py", "data.datagen.name=G")


def test_total_rollout_steps_caps_the_training_steps(tmp_path):
    from rlhf_core.trainer.fully_async import FullyAsyncTrainer

    # 6 prompts, 2 per step: 3 steps (trainer.total_training_steps=3); verl's rollouter stops after
    # total_rollout_steps=5 samples, which make 5 // 2 = 2 full trainer steps (the 5th prompt is never trained)
    cfg = _config(tmp_path, *FA, "rollout.total_rollout_steps=5")
    trainer = FullyAsyncTrainer(cfg, DecodeTok(), lambda c: {}, reward_fn, None, make_dataset(6), None)
    try:
        assert trainer.total_training_steps == 2 and cfg.actor_rollout_ref.actor.optim.total_training_steps == 2
    finally:
        trainer.shutdown()


class _FailingRolloutGroup:
    """A rollout group whose engine fails on the first generation (the rollouter thread's error path)."""

    def execute_dp(self, method, batch):
        raise ValueError(f"{method}: engine down")

    def execute_all(self, method, *args):
        raise ValueError(f"{method}: engine down")

    def shutdown(self):
        pass


def test_a_failing_rollouter_fails_the_step_waiting_for_samples(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from rlhf_core.trainer.fully_async import FullyAsyncTrainer

    trainer = FullyAsyncTrainer(_config(tmp_path, *FA), DecodeTok(), lambda c: {}, reward_fn, None, make_dataset(6))
    trainer.wgs, trainer._executor = {"rollout": _FailingRolloutGroup()}, ThreadPoolExecutor(max_workers=1)
    try:
        with pytest.raises(RuntimeError, match="the fully async rollouter failed") as info:
            next(trainer.train_batches(1, 3))
        # the engine's own error, chained (its first call: whether the ranks batch continuously)
        assert str(info.value.__cause__) == "stream_supported: engine down"
    finally:
        trainer.shutdown()


def _run(cfg, model_dir, fully_async: bool, validate: bool = False):
    """Train 3 steps in-process; returns (per-step metrics, final actor weights, trainer)."""
    from rlhf_core.trainer.fully_async import FullyAsyncTrainer
    from rlhf_core.trainer.ppo_trainer import RayPPOTrainer

    cls = FullyAsyncTrainer if fully_async else RayPPOTrainer
    return run_driver(cls, cfg, model_dir, fully_async, make_dataset(6),
                      (reward_fn, make_dataset(2)) if validate else (None, None))


@pytest.mark.slow
def test_no_staleness_and_a_sync_every_step_equals_the_on_policy_run(tiny_model_dir, tmp_path):
    # max_required_samples = 2 × (1 + 0) × 1 = 2 = one chunk: the rollouter generates step k's prompts and pauses
    # until the weights after update k-1 arrive, so each batch comes from the weights it updates (lag 0)
    torch.manual_seed(0)
    fa, fa_w, trainer = _run(_config(tmp_path, *FA, "async_training.staleness_threshold=0",
                                     "async_training.trigger_parameter_sync_step=1"), tiny_model_dir, True)
    on, on_w, _ = _run(_config(tmp_path), tiny_model_dir, False)
    assert trainer.versions == [(1, 0, 0), (2, 1, 1), (3, 2, 2)]
    assert sorted(fa) == sorted(on) == [1, 2, 3]
    for s in (1, 2, 3):
        assert _same(fa[s]) == _same(on[s]), s
    assert fa_w.keys() == on_w.keys() and all(torch.equal(fa_w[k], on_w[k]) for k in on_w)
    assert [fa[s]["fully_async/count/stale_trajectory_processed"] for s in (1, 2, 3)] == [0, 0, 0]
    # 3 steps × 2 prompts generated, none dropped; the bound: 2 samples between syncs
    assert fa[3]["fully_async/count/total_generated_samples"] == 6
    assert fa[3]["fully_async/count/dropped_stale_samples"] == 0
    assert fa[3]["fully_async/static/max_required_samples"] == 2
    assert all(0.0 <= fa[s]["fully_async/trainer/idle_ratio"] <= 1.0 for s in (1, 2, 3))


@pytest.mark.slow
def test_staleness_threshold_one_keeps_every_update_within_one_version(tiny_model_dir, tmp_path):
    # required 2, threshold 1, trigger 1: max_required_samples 4 (two chunks between syncs), bound 1 (max_staleness)
    torch.manual_seed(0)
    steps, weights, trainer = _run(_config(tmp_path, *FA, "async_training.staleness_threshold=1", "trainer.test_freq=2",
                                           "async_training.trigger_parameter_sync_step=1"), tiny_model_dir, True,
                                   validate=True)
    assert [s for s, _, _ in trainer.versions] == [1, 2, 3]
    assert [t for _, _, t in trainer.versions] == [0, 1, 2]  # a sync after every update
    lags = [t - g for _, g, t in trainer.versions]
    assert all(0 <= lag <= max_staleness(2, 1.0, 1, chunk=2) == 1 for lag in lags), trainer.versions
    assert [steps[s]["fully_async/staleness"] for s in (1, 2, 3)] == lags
    # responses (2 prompts × n=2 per step) trained at a newer version than generated them, cumulated
    assert steps[3]["fully_async/count/stale_trajectory_processed"] == 4 * sum(lag > 0 for lag in lags)
    assert steps[3]["fully_async/static/max_required_samples"] == 4
    assert steps[3]["fully_async/count/dropped_stale_samples"] == 0
    assert all(k in steps[s] for s in (2, 3) for k in ("timing_s/sync_rollout_weights",
                                                          "fully_async/count/current_param_version"))
    # validation (test_freq=2: steps 2 and the last, 3) on the rollout group between the rollouter's chunks
    assert [any(k.startswith("val-") for k in steps[s]) for s in (1, 2, 3)] == [False, True, True]


@pytest.mark.slow
def test_partial_rollout_resumes_the_chunk_a_sync_interrupted(tiny_model_dir, tmp_path, monkeypatch):
    """partial_rollout=True (verl's default), staleness_threshold=1, a sync every step: the rollouter runs one chunk
    ahead (continuous batching: chunk k+1's rows take the slots chunk k's rows free), so the syncs after steps 1 and
    2 find chunks 2 and 3 in flight. Once every row of chunk 2 (3) has its first token, the decode holds until the
    sync's interrupt is set (so the sync lands there, not by timing luck): each response that had not ended by
    then starts under version v and goes on under v + 1 (its cache recomputed)."""
    from rlhf_core.workers.rollout.hf_continuous import ContinuousDecoder
    from rlhf_core.workers.rollout.hf_stream import RolloutStream

    submit, step, held = RolloutStream.submit, ContinuousDecoder.step, set()

    def submit_noting_the_interrupt(self, batch):
        submit(self, batch)
        self.decoder.interrupt_event = self.engine._interrupt

    def step_then_hold(self):
        finished = step(self)
        for chunk in (1, 2):  # chunks 2 and 3: requests 4·chunk .. 4·chunk + 3 of the one rollout rank
            ids = range(4 * chunk, 4 * chunk + 4)
            if chunk not in held and len(self.requests) > ids[-1] and all(self.requests[i].tokens for i in ids):
                held.add(chunk)
                assert self.interrupt_event.wait(120), f"no sync interrupted chunk {chunk + 1}"
        return finished

    monkeypatch.setattr(RolloutStream, "submit", submit_noting_the_interrupt)
    monkeypatch.setattr(ContinuousDecoder, "step", step_then_hold)
    from rlhf_core.trainer.fully_async import FullyAsyncTrainer
    trained = {}  # step -> the batch its update used
    update = FullyAsyncTrainer.update_actor

    def record(self, batch):
        trained[self.global_steps] = batch
        return update(self, batch)

    monkeypatch.setattr(FullyAsyncTrainer, "update_actor", record)
    torch.manual_seed(0)
    cfg = _config(tmp_path, "async_training.mode=fully_async", "async_training.staleness_threshold=1",
                  "async_training.trigger_parameter_sync_step=1", "actor_rollout_ref.rollout.calculate_log_probs=True")
    steps, _, trainer = _run(cfg, tiny_model_dir, True)
    assert held == {1, 2}  # the continuous path ran, and both syncs landed after those chunks' first tokens
    # per response: chunk k (k = 2, 3) starts under version k-2, its rows hold after their first token (chunk 1's
    # rows all run to the response length, so chunk k's enter together) until the sync after step k-1, and the
    # rest runs under k-1. So min_global_steps = k-2 for every response; max_global_steps = k-1 for a response
    # longer than one token, k-2 for one that ended at its first token (EOS). Chunk 1 ran unbroken under version 0.
    for k in (1, 2, 3):
        b = trained[k]
        longer = (b["response_mask"].sum(-1) > 1).long()
        assert b["min_global_steps"].tolist() == [max(k - 2, 0)] * 4, k
        assert b["max_global_steps"].tolist() == ([0] * 4 if k == 1 else (k - 2 + longer).tolist()), k
        span, lag = b["max_global_steps"] - b["min_global_steps"], (k - 1) - b["max_global_steps"]
        assert steps[k]["fully_async/partial/total_partial_num"] == int((span > 0).sum())
        assert steps[k]["training/off_policy/trajectory_spans/mean"] == pytest.approx(1 + span.double().mean().item())
        assert steps[k]["training/off_policy/trajectory_staleness/mean"] == pytest.approx(lag.double().mean().item())
        assert steps[k]["training/off_policy/trajectory_staleness_worst/min"] == (1 if k > 1 else 0)
    # verl's count: responses whose last token's version is older than the trained one (those that ended at once)
    assert steps[3]["fully_async/count/stale_trajectory_processed"] == sum(
        int((trained[k]["max_global_steps"] < k - 1).sum()) for k in (1, 2, 3))
    # (step, version of the chunk's first tokens, trained-at version): chunks 2, 3 began under the version before
    assert trainer.versions == [(1, 0, 0), (2, 0, 1), (3, 1, 2)]
    partial = [steps[s]["fully_async/partial/total_partial_num"] for s in (1, 2, 3)]
    assert partial[0] == 0 and all(1 <= p <= 4 for p in partial[1:]), partial  # of 2 prompts × 2 responses
    assert [steps[s]["fully_async/partial/partial_ratio"] for s in (1, 2, 3)] == [p / 4 for p in partial]
    assert [steps[s]["fully_async/partial/max_partial_span"] for s in (1, 2, 3)] == [0, 1, 1]
    assert all("actor/pg_loss" in steps[s] for s in (1, 2, 3))


@pytest.mark.slow
def test_rlhf_ppo_runs_fully_async_on_ray_worker_groups(tiny_model_dir, gsm8k_parquet, tmp_path, monkeypatch):
    """``rlhf ppo async_training.mode=fully_async`` end to end (run_ppo): Ray actors for the actor and rollout
    groups, the rollouter thread calling the rollout group while the trainer calls the actor group; verl's default
    partial_rollout=True, so a sync reaches a generating rank through its second actor thread."""
    from rlhf_core.config import load_config
    from rlhf_core.trainer.main_ppo import run_ppo
    from rlhf_core.trainer.tracking import read_metrics_jsonl
    from tests.flows.test_verl09_examples_train import LENGTH_REWARD, SMOKE  # noqa: I001

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    train, test = gsm8k_parquet
    reward = tmp_path / "length_reward.py"
    reward.write_text(LENGTH_REWARD)
    out = tmp_path / "run"
    sizes = dict(SMOKE, **{"trainer.total_training_steps": "3", "trainer.default_local_dir": str(out),
                           "trainer.validation_data_dir": str(out / "val")})
    cfg = load_config("ppo_trainer", [
        f"data.train_files=['{train}']", f"data.val_files=['{test}']", f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.rollout.name=hf", "algorithm.adv_estimator=grpo", f"custom_reward_function.path={reward}",
        "actor_rollout_ref.actor.use_kl_loss=False", "algorithm.use_kl_in_reward=False", "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1", "async_training.mode=fully_async", "async_training.staleness_threshold=1",
        "async_training.trigger_parameter_sync_step=1", *[f"{k}={v}" for k, v in sizes.items()]])
    assert run_ppo(cfg)["global_step"] == 3
    m = read_metrics_jsonl(str(out / "metrics.jsonl"))
    # a sync after every update: steps 1..3 train at versions 0, 1, 2; each lag within the bound (1 here)
    assert [m[s]["fully_async/count/current_param_version"] for s in (1, 2, 3)] == [0, 1, 2]
    assert all(0 <= m[s]["fully_async/staleness"] <= 1 for s in (1, 2, 3))
    assert m[3]["fully_async/static/max_required_samples"] == 4 and m[3]["fully_async/count/dropped_stale_samples"] == 0
    assert all("actor/pg_loss" in m[s] and "fully_async/trainer/idle_ratio" in m[s] for s in (1, 2, 3))
    assert all(0 <= m[s]["fully_async/partial/max_partial_span"] <= 1 for s in (1, 2, 3))


@pytest.mark.slow
def test_a_checkpoint_records_the_chunk_trained_and_resuming_trains_the_queued_ones(tiny_model_dir, tmp_path):
    # 6 prompts in chunks of 2: 3 chunks an epoch. staleness_threshold=1 lets the rollouter run one chunk ahead, so
    # when step k's checkpoint is written the loader itself may stand at k+1; data.pt must say k (the position the
    # rollouter read as it drew the chunk step k trained), else resuming skips a chunk generated but never trained
    torch.manual_seed(0)
    ckpt = ("async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=1",
            "trainer.save_freq=1")
    _run(_config(tmp_path, *FA, *ckpt), tiny_model_dir, True)
    for k in (1, 2, 3):
        state = torch.load(tmp_path / "ckpt" / f"global_step_{k}" / "data.pt", weights_only=False)
        assert (state["epoch"], state["batches_done"]) == divmod(k, 3), (k, state)
    # resumed from step 1: steps 2 and 3 train chunks 2 and 3, and the loader ends at the end of epoch 0 as the
    # uninterrupted run's did
    resumed = _config(tmp_path, *FA, *ckpt, "trainer.resume_mode=resume_path",
                      f"trainer.resume_from_path={tmp_path / 'ckpt' / 'global_step_1'}",
                      f"trainer.default_local_dir={tmp_path / 'ckpt2'}")
    steps, _, trainer = _run(resumed, tiny_model_dir, True)
    assert sorted(steps) == [2, 3]
    state = torch.load(tmp_path / "ckpt2" / "global_step_3" / "data.pt", weights_only=False)
    assert (state["epoch"], state["batches_done"]) == (1, 0), state


@pytest.mark.slow
def test_streaming_mixes_versions_in_a_step(tiny_model_dir, tmp_path, monkeypatch):
    """concurrent_samples_per_replica=1 on one rollout rank: the rollouter generates one prompt (its n=2 responses)
    at a time and queues each group. required 2, staleness_threshold 0.5, a sync every step: max_required_samples
    = int(2 × 1.5 × 1) = 3, so one prompt of the next loader batch is generated before each sync. Each update first
    waits until that prompt is queued (so it is generated by the weights before the sync, not by timing luck):
    prompt 3 under version 0 and prompt 4 (acquired after the sync's reset) under 1 make step 2; prompts 5 (version
    1) and 6 (version 2) make step 3. Every prompt is trained once, also across a resume: a step is still one
    loader batch, so the checkpoint's loader position (data.pt) lies between batches."""
    from rlhf_core.trainer.fully_async import FullyAsyncTrainer

    trained, offset = {}, [0]  # step -> the batch its update used; prompts before the run's first step
    update = FullyAsyncTrainer.update_actor

    def record(self, batch):
        trained[self.global_steps] = batch
        wanted, deadline = min(2 * self.global_steps + 1, 6) - offset[0], time.monotonic() + 120
        while self.queue.stats()["fully_async/count/total_generated_samples"] < wanted:
            assert time.monotonic() < deadline, f"step {self.global_steps}: prompt {wanted} never queued"
            time.sleep(0.01)
        return update(self, batch)

    monkeypatch.setattr(FullyAsyncTrainer, "update_actor", record)
    torch.manual_seed(0)
    stream = (*FA, "async_training.concurrent_samples_per_replica=1", "async_training.staleness_threshold=0.5",
              "async_training.trigger_parameter_sync_step=1", "trainer.save_freq=1")
    steps, _, trainer = _run(_config(tmp_path, *stream), tiny_model_dir, True)
    # per response (prompt-major, n=2): the version of its first and last token (no partial rollout: equal)
    expected = {1: [0, 0, 0, 0], 2: [0, 0, 1, 1], 3: [1, 1, 2, 2]}
    for k, versions in expected.items():
        assert trained[k]["min_global_steps"].tolist() == versions, k
        assert trained[k]["max_global_steps"].tolist() == versions, k
    # (step, oldest group's version, trained-at version); lag per response = trained-at − version
    assert trainer.versions == [(1, 0, 0), (2, 0, 1), (3, 1, 2)]
    assert [steps[s]["fully_async/staleness"] for s in (1, 2, 3)] == [0, 1, 1]
    assert [steps[s]["training/off_policy/trajectory_staleness/mean"] for s in (1, 2, 3)] == [0.0, 0.5, 0.5]
    assert [steps[s]["training/off_policy/trajectory_staleness/max"] for s in (1, 2, 3)] == [0, 1, 1]
    # cumulated: the 2 responses of prompt 3 (step 2) and of prompt 5 (step 3) were trained one version late
    assert [steps[s]["fully_async/count/stale_trajectory_processed"] for s in (1, 2, 3)] == [0, 2, 4]
    assert max(t - g for _, g, t in trainer.versions) <= max_staleness(2, 0.5, 1, chunk=1) == 1
    # every prompt once (6 prompts, 3 steps of 2)
    order = [int(i) for k in (1, 2, 3) for i in trained[k].non_tensors["index"][::2]]
    assert sorted(order) == list(range(6)), order
    assert all(len(set(trained[k].non_tensors["uid"].tolist())) == 2 for k in (1, 2, 3))  # 2 whole groups a step
    assert steps[3]["fully_async/static/max_concurrent_samples"] == 1
    assert steps[3]["fully_async/static/max_required_samples"] == 3
    assert steps[3]["fully_async/count/total_generated_samples"] == 6
    assert steps[3]["fully_async/count/dropped_stale_samples"] == 0
    # step 2's checkpoint: after loader batch 2 (the rollouter had drawn batch 3 already, for prompt 5)
    state = torch.load(tmp_path / "ckpt" / "global_step_2" / "data.pt", weights_only=False)
    assert (state["epoch"], state["batches_done"]) == (0, 2), state
    # resumed there: step 3 trains prompts 5 and 6 again, the same as the uninterrupted step 3, nothing else
    trained.clear()
    offset[0] = 4
    resumed = _config(tmp_path, *stream, "trainer.resume_mode=resume_path",
                      f"trainer.resume_from_path={tmp_path / 'ckpt' / 'global_step_2'}",
                      f"trainer.default_local_dir={tmp_path / 'ckpt2'}")
    steps, _, _ = _run(resumed, tiny_model_dir, True)
    assert sorted(steps) == [3] and [int(i) for i in trained[3].non_tensors["index"][::2]] == order[4:]
