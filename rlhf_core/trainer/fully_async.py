"""The fully asynchronous PPO driver (verl 0.9's ``verl.experimental.fully_async_policy``), chosen with
``async_training.mode=fully_async`` on ``rlhf ppo``; a minimal version of verl's, on the one-step driver's resources.

Resources: as :mod:`rlhf_core.trainer.one_step_off_policy` (a rollout group of role ``rollout`` apart from the
actor group; the weight push ``actor_weights`` → ``load_rollout_weights``).

Schedule (verl's ``FullyAsyncRollouter`` / ``FullyAsyncTrainer``), parameter version v = parameter syncs so far
(verl's ``current_param_version``):

* the *rollouter*, a driver thread over the rollout group, draws the prompts one loader batch
  (``data.train_batch_size`` samples) at a time and streams them prompt by prompt
  (:mod:`rlhf_core.trainer.fully_async_stream`): it cuts each loader batch into sub-batches of ``k =
  min(rollout ranks × concurrent_samples_per_replica, required_samples)`` prompts (verl's
  ``max_concurrent_samples``), generates ``rollout.n`` responses each with the version the rollout group holds,
  and puts each prompt's group, tagged with its earliest token's version, into the bounded
  :class:`~rlhf_core.trainer.fully_async_queue.RolloutQueue` as soon as its sub-batch is done — on the HF engine
  without agent loops as soon as its last response ends, the ranks batching continuously
  (:mod:`rlhf_core.trainer.fully_async_rollouter`); before a sub-batch
  it pauses while the samples generated since the last sync would pass ``max_required_samples`` (verl's rule,
  ``staleness_threshold``);
* the *trainer* takes ``require_batches × ppo_mini_batch_size`` groups per step (one loader batch: the config check
  requires ``data.train_batch_size`` to equal it, and the queue is first in, first out; a sync between two
  sub-batches gives the step groups of two versions), computes rewards, log-probs (the actor's: no bypass),
  advantages, rollout correction as configured, and updates the actor; every ``trigger_parameter_sync_step`` steps
  it pushes the weights (version v → v+1) and resets the queue's staleness count. With ``partial_rollout`` (verl's
  default) the push first interrupts the sub-batch being generated at its next token; the rollouter then resumes
  the open responses under v+1 from prompt + prefix (:meth:`FullyAsyncTrainer._partial_generate`,
  ``rlhf_core/workers/rollout/hf_partial.py``); without it the push waits for the sub-batch. Agent loops (as in the
  one-step driver) with ``partial_rollout``: the push loads between two decoding steps of the sub-batch in flight,
  whose trajectories go on with v+1 (:meth:`FullyAsyncTrainer._agent_partial_generate`,
  ``rlhf_core/agent/pause.py``).

With ``trainer.v1.trainer_mode=separate_async`` (verl 0.9's v1 loop, rlhf_core/config/v1_trainer.py) verl's v1
sampler rule applies when the trainer takes a step's groups: with ``max_off_policy_strategy=drop`` a group whose span
(trained-at version − its first token's version + 1) exceeds ``max_off_policy_threshold`` is evicted and its prompt
generated again with the current weights (:meth:`FullyAsyncTrainer._evict_stale`,
:mod:`rlhf_core.trainer.off_policy_sampler`).

A sample is trained at a version at most :func:`~rlhf_core.trainer.fully_async_queue.max_staleness` above the
version that generated it; ``staleness_threshold=0, trigger_parameter_sync_step=1`` gives 0: the run equals the
on-policy trainer's. ``versions`` lists ``(step, generating version, trained-at version)``.

Each response carries the versions of its first and last token (``min_global_steps`` / ``max_global_steps``,
:mod:`rlhf_core.trainer.response_versions`: different only when a partial rollout spanned a sync). Metrics, besides
the on-policy trainer's: verl's ``fully_async/count/current_param_version``,
``fully_async/count/stale_trajectory_processed`` (responses whose last token's version is older than the one that
trains them, so far: verl's ``current - max_global_steps >= 1``), the queue's ``fully_async/count/*``,
``fully_async/static/*``, ``fully_async/monitor/queue/mq_queue_size``, ``fully_async/total_wait_time`` (seconds the
step waited for samples), ``fully_async/trainer/idle_ratio`` (that wait ÷ (wait + ``timing_s/step``): verl's
``timing_s/gen / timing_s/step``, its step including the wait), ``timing_s/sync_rollout_weights``,
``timing_s/overlap_gen_update`` (ours: seconds of the update during which the rollouter generated,
:mod:`rlhf_core.trainer.overlap_clock`), verl's ``fully_async/partial/total_partial_num``, ``partial_ratio``,
``max_partial_span`` and
``training/off_policy/trajectory_{spans,staleness,staleness_worst}/{mean,max,min}`` from the per-response versions;
verl's ``fully_async/static/max_concurrent_samples`` (``k``); ours: ``fully_async/generation_param_version`` and
``fully_async/staleness`` (of the step's oldest group's first tokens).
``rollout.total_rollout_steps`` (samples) caps the run at ``total_rollout_steps // required_samples`` steps, as
verl's rollouter stops there. Validation (``trainer.test_freq``) runs on the rollout group between two sub-batches, with
the weights it holds: the last pushed version, up to ``trigger_parameter_sync_step - 1`` updates behind the actor
(verl's rollouter validates with its own weights too); with ``async_training.use_trainer_do_validate`` it runs on the
actor group instead, with the actor's current weights, while the rollouter goes on (:meth:`FullyAsyncTrainer.init_workers`). A checkpoint records the loader's position after the loader
batch its step trained (read by the rollouter thread as it drew that batch): a resumed run regenerates the groups
that were queued but not trained. Not built: dynamic resource scheduling, a curriculum
sampler or ``data.datagen`` (refused: the trainer's per-step update would race the rollouter's draws), resuming
the rollouter's queue itself.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any, Iterator

import torch
from omegaconf import DictConfig, open_dict

from rlhf_core.agent.registry import uses_agent_loop
from rlhf_core.config import ConfigError
from rlhf_core.config.off_policy import fully_async_config_errors
from rlhf_core.config.v1_trainer import v1_async_settings
from rlhf_core.protocol import Batch
from rlhf_core.trainer.driver_utils import add_uids, timer
from rlhf_core.trainer.fully_async_queue import RolloutQueue
from rlhf_core.trainer.fully_async_skip import AsyncRolloutDump, generate_with_dumps
from rlhf_core.trainer.fully_async_rollouter import (can_stream, hold_for_sync, init_stream_state,
                                                     stream_rollout_loop, sync_ended)
from rlhf_core.trainer.fully_async_stream import Group, assemble_step, split_groups, sub_batch_bounds, sub_batch_size
from rlhf_core.trainer.overlap_clock import OverlapClock
from rlhf_core.trainer.off_policy_sampler import eviction_metrics, spans, stale_groups
from rlhf_core.trainer.one_step_off_policy import OneStepOffPolicyTrainer
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer
from rlhf_core.trainer.ppo_validation import Validator
from rlhf_core.trainer.response_versions import (MIN_KEY, segment_versions, tag_versions,
                                                  version_metrics)


def check_fully_async_config(config: DictConfig) -> None:
    """Raise ConfigError listing :func:`rlhf_core.config.off_policy.fully_async_config_errors` (nothing when
    runnable); ``load_config`` already refuses them, this guards a config built otherwise."""
    errors = fully_async_config_errors(config)
    if errors:
        raise ConfigError("async_training.mode=fully_async:\n  - " + "\n  - ".join(errors))


class _LockedValidator:
    """The validator on the rollout group while the rollouter is not generating (it holds the generation lock)."""

    def __init__(self, trainer: "FullyAsyncTrainer", inner: Validator) -> None:
        self.trainer, self.inner = trainer, inner

    def validate(self, global_step: int) -> dict[str, float]:
        with self.trainer.gen_lock:
            return self.inner.validate(global_step)


class FullyAsyncTrainer(OneStepOffPolicyTrainer):
    """The fully asynchronous driver (module docstring) on the one-step driver's worker groups
    (:func:`~rlhf_core.trainer.one_step_off_policy.build_one_step_worker_groups`).

    Raises:
        ConfigError: from :func:`check_fully_async_config`, before any worker starts.
        RuntimeError: the rollouter thread failed (its exception chained), raised by the step waiting for samples.
    """

    def __init__(self, config: DictConfig, *args: Any, **kwargs: Any) -> None:
        check_fully_async_config(config)
        at = config.async_training
        self.trigger = int(at.trigger_parameter_sync_step)
        self.required_samples = int(config.actor_rollout_ref.actor.ppo_mini_batch_size) * int(at.require_batches)
        RayPPOTrainer.__init__(self, config, *args, **kwargs)
        self.queue = RolloutQueue(self.required_samples, float(at.staleness_threshold), self.trigger)
        rollout_ranks = int(config.rollout.nnodes) * int(config.rollout.n_gpus_per_node)
        # k: prompts generated at once (verl's max_concurrent_samples, within one loader batch)
        self.sub_batch = sub_batch_size(rollout_ranks, int(at.concurrent_samples_per_replica), self.required_samples)
        self.gen_lock = threading.Lock()  # held by one generation, a weight push or a validation at a time
        self.gen_clock = OverlapClock()  # the rollouter's chunks, for timing_s/overlap_gen_update
        self.param_version = 0  # verl's current_param_version: parameter syncs so far
        self.rollout_version = -1
        self.local_trigger_step = 0  # actor updates since the last sync
        self.versions: list[tuple[int, int, int]] = []
        self.stale_trajectory_processed = 0
        self._rollouter: Future | None = None
        self._executor = None
        self._timing: dict[str, float] = {}
        self._wait_s = 0.0
        self._gen_version = 0
        self._trained_state: dict[str, Any] | None = None  # the loader's position after the chunk being trained
        self.partial = bool(at.partial_rollout)  # interrupt the chunk in flight at a sync, resume it after
        self._sync_idle = threading.Event()  # cleared while a sync waits: the rollouter starts no segment
        self._sync_idle.set()
        # agent loops: the sync loads between two decoding steps of the chunk in flight (rlhf_core/agent/pause.py);
        # entry g = the parameter version of the rollout ranks' g-th weight load (0: their initial weights)
        self.partial_agent = self.partial and uses_agent_loop(config.actor_rollout_ref.rollout)
        self._load_versions: list[int] = [self.rollout_version]
        # trainer.v1.trainer_mode=separate_async: verl's v1 sampler rule (threshold, strategy); None otherwise
        sampler = config.trainer.v1.sampler
        self.v1_sampler = ((int(sampler.max_off_policy_threshold), str(sampler.max_off_policy_strategy))
                           if v1_async_settings(config) else None)
        self._keep_prompts = self.v1_sampler is not None and self.v1_sampler[1] == "drop"
        self.rollout_ranks = rollout_ranks
        self._plain = threading.local()  # .on: generate without the partial-rollout segments (_regenerate)
        self._evicted: dict[str, float] = {}
        self.async_dump = AsyncRolloutDump.from_config(config)  # skip.async_rollout (rlhf_core/trainer/fully_async_skip.py)
        self._feed = 0  # prompts fed so far: the next prompt's feed index is _feed + 1
        init_stream_state(self)  # continuous batching (fully_async_rollouter.py)

    def _build_dataloaders(self, train_dataset, val_dataset, collate_fn) -> None:
        """As the base, then verl's cap: the rollouter generates at most ``rollout.total_rollout_steps`` samples
        (prompts), so the trainer runs at most ``total_rollout_steps // required_samples`` steps."""
        super()._build_dataloaders(train_dataset, val_dataset, collate_fn)
        cap = int(self.config.rollout.total_rollout_steps) // self.required_samples
        if cap < self.total_training_steps:
            self.total_training_steps = cap
            with open_dict(self.config):
                self.config.actor_rollout_ref.actor.optim.total_training_steps = cap
                self.config.critic.optim.total_training_steps = cap

    def init_workers(self) -> None:
        """As the one-step driver; validation runs on the rollout group between two sub-batches
        (:class:`_LockedValidator`), or with ``async_training.use_trainer_do_validate`` on the actor group (role
        ``actor_rollout``: its colocated engine gets the actor's weights after every update) while the rollouter
        goes on generating (verl's ``_trainer_side_validate``, which validates on the trainer's devices switched to
        rollout mode with the trainer's current weights)."""
        super().init_workers()
        if self.config.async_training.use_trainer_do_validate:
            self.validator = Validator(self.config, self.tokenizer, self.actor_wg, self.val_reward_fn,
                                       self.val_dataloader, rm_wg=self.wgs.get("rm"))
        else:
            self.validator = _LockedValidator(self, self.validator.inner)

    def sync_rollout(self) -> None:
        """Push the actor's weights to the rollout group when it holds an older version, after the generation in
        flight; with ``partial_rollout`` that generation is first interrupted at its next token (it resumes with
        the new weights: :meth:`_partial_generate`). The queue's staleness count restarts (verl's
        ``_fit_update_weights`` + ``reset_staleness``)."""
        interrupt = self.partial and self.rollout_version != self.param_version
        if interrupt and self.partial_agent:  # no generation lock: the chunk in flight pauses for the load
            self._load_versions.append(self.param_version)  # before the load: a token sampled under it maps
            self.rollout_wg.execute_all("interrupt_generation")
            try:
                super().sync_rollout()
            except BaseException:
                self.rollout_wg.execute_all("release_generation")  # the chunk in flight must not wait forever
                raise
            self.queue.reset_staleness()
            return
        streaming = self._stream_active and self.rollout_version != self.param_version
        if interrupt:
            self._sync_idle.clear()
            self.rollout_wg.execute_all("interrupt_generation")  # a second thread of each rank's actor
        elif streaming:  # no partial rollouts: the rows in flight end under the weights that started them
            hold_for_sync(self)
        try:
            with self.gen_lock:
                before = self.rollout_version
                super().sync_rollout()  # load_rollout_weights clears the interrupt on every rank
                if self._stream_versions is not None and self.rollout_version != before:
                    self._stream_versions.append(self.rollout_version)  # the ranks' sessions counted this load
        except BaseException:
            if interrupt:  # the load did not come: the chunk in flight must not stop after every token
                self.rollout_wg.execute_all("release_generation")
            raise
        finally:
            self._sync_idle.set()
            sync_ended(self)
        self.queue.reset_staleness()

    # ---- the rollouter -----------------------------------------------------------------------------
    def _rollout_loop(self, stream: Iterator[tuple[int, Batch]], first_step: int) -> None:
        """The rollouter thread: each loader batch cut into sub-batches of ``k`` prompts
        (:mod:`rlhf_core.trainer.fully_async_stream`), each generated with ``rollout.n`` responses per prompt under
        the version the rollout group holds; every prompt's group is queued as soon as its sub-batch is done."""
        n = int(self.config.actor_rollout_ref.rollout.n)
        self._feed = first_step * int(self.config.data.train_batch_size)  # a resumed run goes on counting
        try:
            if can_stream(self):  # continuous batching on the rollout ranks (fully_async_rollouter.py)
                stream_rollout_loop(self, stream, first_step)
                return
            for i, (epoch, prompts) in enumerate(stream):
                # the loader's position right after this batch was drawn, read on the thread that draws (a
                # checkpoint of the step training this batch resumes after it, not after the batches queued since)
                position = self.train_dataloader.state_dict()
                prompts = add_uids(prompts)
                for lo, hi in sub_batch_bounds(len(prompts), self.sub_batch):
                    if not self.queue.acquire(hi - lo):
                        return
                    sub = prompts.index(slice(lo, hi))
                    groups, seconds = self._generate_sub_batch(sub, n, first_step + i + 1)
                    for g, group in enumerate(groups):
                        version = int(group[MIN_KEY].min())  # the group's earliest token's version
                        last = g == len(groups) - 1
                        prompt = sub.index(slice(g, g + 1)) if self._keep_prompts else None  # for a v1 drop
                        self.queue.put(1, version, Group(group, epoch, i, seconds if last else 0.0, position, prompt,
                                                         lo + g))
        finally:
            self.queue.close()

    def _generate_sub_batch(self, prompts: Batch, n: int, step: int) -> tuple[list[Batch], float]:
        """``prompts`` (with uids) → their groups of ``n`` responses, each response tagged with its versions; and
        the generation's seconds. ``skip.async_rollout``: prompts with a dump are replayed, the others generated
        and dumped (:func:`~rlhf_core.trainer.fully_async_skip.generate_with_dumps`)."""
        feeds = list(range(self._feed + 1, self._feed + len(prompts) + 1))
        self._feed += len(prompts)
        start = time.perf_counter()
        if self.async_dump is None:
            groups = self._generate_groups(prompts, n, step)
        else:
            groups = generate_with_dumps(self.async_dump, prompts, feeds, n, step, lambda: self.rollout_version,
                                         lambda todo: self._generate_groups(todo, n, step))
        return groups, time.perf_counter() - start

    def _generate_groups(self, prompts: Batch, n: int, step: int) -> list[Batch]:
        """``prompts`` → their groups of ``n`` responses from the rollout group, tagged with their versions."""
        batch = prompts.repeat_interleave(n)
        span = self.gen_clock.start()
        if self.partial_agent:
            with self.gen_lock:  # a sync loads inside the generation (no lock), validation waits
                batch = self._agent_partial_generate(batch, step=step)
        elif self.partial:  # _partial_generate takes the generation lock per segment
            batch = self.generate(batch, step=step)
        else:
            with self.gen_lock:
                version = self.rollout_version
                batch = tag_versions(self.generate(batch, step=step), version)
        self.gen_clock.stop(span)
        return split_groups(batch, n)

    def rollout_generate(self, batch: Batch) -> Batch:
        if self.partial and not self.partial_agent and not getattr(self._plain, "on", False):
            return self._partial_generate(batch)
        return self.rollout_wg.execute_dp("generate_sequences", batch)

    def _agent_partial_generate(self, batch: Batch, step: int) -> Batch:
        """``partial_rollout`` with agent loops: one generation call; a sync in its course loads between two decoding
        steps and the trajectories go on (:mod:`rlhf_core.agent.pause`). Each trajectory's ``min_global_steps`` /
        ``max_global_steps``: the versions of its first and last token (:mod:`rlhf_core.trainer.response_versions`)."""
        batch.meta["report_weight_versions"] = True
        out = self.generate(batch, step=step)
        out.meta.pop("report_weight_versions", None)
        versions = torch.tensor(self._load_versions)
        return tag_versions(out, versions[out.tensors.pop("rollout_min_version")],
                            versions[out.tensors.pop("rollout_max_version")])

    def _partial_generate(self, batch: Batch) -> Batch:
        """``partial_rollout``: the chunk in segments, each under the generation lock with the version the rollout
        group holds; a sync interrupts a segment at a token (:meth:`sync_rollout`), the next segment resumes the
        open responses with the new weights (``rlhf_core/workers/rollout/hf_partial.py``). Each response's
        ``min_global_steps`` = the first segment's version, ``max_global_steps`` = its last token's segment's
        (:func:`~rlhf_core.trainer.response_versions.segment_versions`)."""
        versions: list[int] = []
        done = False
        while not done:
            self._sync_idle.wait()
            with self.gen_lock:
                versions.append(self.rollout_version)
                if len(versions) == 1:
                    done = all(self.rollout_wg.execute_dp("start_partial_generation", batch))
                else:
                    done = all(self.rollout_wg.execute_all("resume_partial_generation"))
        out = Batch.concat(self.rollout_wg.execute_all("finish_partial_generation"))
        return tag_versions(out, *segment_versions(versions, out.tensors.pop("rollout_last_segment")))

    # ---- the trainer -------------------------------------------------------------------------------
    def train_batches(self, n_epochs: int, stop_at: int) -> Iterator[tuple[int, Batch]]:
        """Starts the rollouter over the base order (one loader batch per step up to ``stop_at``) and yields each
        step's ``required_samples`` groups as they come out of the queue, concatenated
        (:func:`~rlhf_core.trainer.fully_async_stream.assemble_step`; the wait is ``fully_async/total_wait_time``)."""
        stream = RayPPOTrainer.train_batches(self, n_epochs, stop_at)
        left = stop_at - self.global_steps
        limited = (item for _, item in zip(range(left), stream))
        self._rollouter = self._executor.submit(self._rollout_loop, limited, self.global_steps)
        while True:
            groups, versions, waited = [], [], 0.0
            while len(groups) < self.required_samples:
                start = time.perf_counter()
                item = self.queue.get()
                waited += time.perf_counter() - start
                if item is None:  # closed by the rollouter's end (only _stop closes it otherwise, never here)
                    break
                versions.append(item[0])
                groups.append(item[1])
            if len(groups) < self.required_samples:
                error = self._rollouter.exception()  # waits for the thread to finish
                if error is not None:
                    raise RuntimeError("the fully async rollouter failed") from error
                if not groups:
                    return
            if self.v1_sampler and len(groups) == self.required_samples:
                groups, versions, self._evicted = self._evict_stale(groups, versions)
            batch, epoch, self._trained_state, seconds = assemble_step(groups, self.required_samples)
            self._wait_s, self._gen_version = waited, min(versions)
            self._timing["generate_async"] = seconds
            yield epoch, batch

    def _evict_stale(self, groups: list[Group], versions: list[int]) -> tuple[list[Group], list[int], dict]:
        """verl's v1 ``drop`` (:mod:`rlhf_core.trainer.off_policy_sampler`): the groups whose span ``current - version
        + 1`` exceeds ``max_off_policy_threshold`` are evicted and their prompts generated again with the weights the
        rollout group holds (verl draws a fresh prompt instead: here a step stays one loader batch, every prompt
        trained once). Returns the groups, their versions and verl's eviction metrics (empty when none)."""
        current = self.param_version
        threshold, strategy = self.v1_sampler
        stale = stale_groups(versions, current, threshold, strategy)
        if not stale:
            return groups, versions, {}
        evicted = [spans(versions, current)[i] for i in stale]
        fresh = self._regenerate([groups[i].prompt for i in stale])
        groups, versions = list(groups), list(versions)
        for i, group in zip(stale, fresh):
            old = groups[i]
            groups[i] = Group(group, old.epoch, old.loader_batch, old.seconds, old.position, old.prompt, old.index)
            versions[i] = int(group[MIN_KEY].min())
        return groups, versions, eviction_metrics(evicted)

    def _regenerate(self, prompts: list[Batch]) -> list[Batch]:
        """One group of ``rollout.n`` responses per prompt row, generated in one call under the generation lock with
        the version the rollout group holds (not in partial-rollout segments: the rollouter's own partial
        generation may be open between two segments). The rows are padded with repeats of the prompts to split
        over the rollout ranks; the extra groups are discarded."""
        n = int(self.config.actor_rollout_ref.rollout.n)
        rows = len(prompts)
        while rows * n % self.rollout_ranks:
            rows += 1
        batch = Batch.concat([prompts[i % len(prompts)] for i in range(rows)]).repeat_interleave(n)
        self._plain.on = True
        try:
            with self.gen_lock:
                version = self.rollout_version
                out = tag_versions(self.generate(batch, step=self.global_steps), version)
        finally:
            self._plain.on = False
        return split_groups(out, n)[:len(prompts)]

    def sample(self, prompts: Batch, more: Iterator[Batch], timing: dict, metrics: dict) -> tuple[Batch, Any]:
        """The queued chunk (already generated) balanced and its reward started; ``timing_s/gen`` = the wait."""
        timing["gen"] = self._wait_s
        batch = self.balance(prompts, metrics) if self.config.trainer.balance_batch else prompts
        with timer("reward", timing):
            return self.start_reward(batch)

    def train_step(self, batch: Batch, epoch: int, more: Iterator[Batch] = iter(())) -> dict[str, float]:
        current, gen = self.param_version, self._gen_version
        version_stats, stale = version_metrics(batch, current, partial=True)  # the chunk, generated already
        metrics = RayPPOTrainer.train_step(self, batch, epoch, more)
        self.stale_trajectory_processed += stale  # verl's rule: current - max_global_steps >= 1
        step_s = metrics.get("timing_s/step", 0.0)
        metrics.update(self.queue.stats())
        metrics.update({"fully_async/count/current_param_version": current,
                        "fully_async/static/max_concurrent_samples": self.sub_batch,
                        "fully_async/count/stale_trajectory_processed": self.stale_trajectory_processed,
                        "fully_async/generation_param_version": gen,
                        "fully_async/staleness": current - gen,
                        "fully_async/total_wait_time": self._wait_s,
                        "fully_async/trainer/idle_ratio": self._wait_s / max(self._wait_s + step_s, 1e-9)})
        metrics.update(version_stats)
        metrics.update(self._evicted)
        self._evicted = {}
        metrics.update({f"timing_s/{k}": v for k, v in self._timing.items()})
        self._timing = {}
        return metrics

    def update_actor(self, batch: Batch) -> dict[str, float]:
        self.versions.append((self.global_steps, self._gen_version, self.param_version))
        start = time.perf_counter()
        metrics = RayPPOTrainer.update_actor(self, batch)
        metrics["timing_s/overlap_gen_update"] = self.gen_clock.overlap(start, time.perf_counter())
        self.local_trigger_step += 1
        if self.local_trigger_step == self.trigger:  # verl's _fit_update_local_step + _fit_update_weights
            self.local_trigger_step = 0
            self.param_version += 1
            self.sync_rollout()
        return metrics

    def _stop(self) -> None:
        self.queue.close()  # a paused or waiting rollouter returns
        super()._stop()
