"""The PPO driver loop (verl's ``RayPPOTrainer.fit``), one named method per stage of SEMANTICS "One PPO step".

The driver runs in the calling process and talks to worker groups (``RayWorkerGroup`` / ``LocalWorkerGroup`` or
anything with ``world_size``, ``execute_all``, ``execute_dp``, ``shutdown``, and optionally ``in_process``: False
when its ranks compute in other processes, so the driver keeps one thread; absent = True) built by an injected factory
``make_worker_groups(config) -> {"actor_rollout": wg, "critic": wg?, "ref": wg?}``. The factory is called by
:meth:`RayPPOTrainer.init_workers` *after* ``total_training_steps`` has been injected into
``actor_rollout_ref.actor.optim.total_training_steps`` and ``critic.optim.total_training_steps``.
Without a ``"ref"`` group, reference log-probs come from the actor group (role ``actor_rollout_ref``).
With an ``"rm"`` group (``reward_model.enable``), the [reward] stage (and validation) first adds its ``rm_scores``.
``adv_estimator: remax`` adds a [gen_max] stage after [gen]: one greedy response per prompt, scored, gives
``reward_baselines`` (see ``rlhf_core.trainer.reward_stage``).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterator

import torch
from omegaconf import DictConfig, open_dict

from rlhf_core.algos.kl_controller import get_kl_controller
from rlhf_core.algos.loss_agg import agg_loss
from rlhf_core.data.loader import build_dataloader
from rlhf_core.data.rl_dataset import collate_fn as default_collate
from rlhf_core.algos.pf_ppo import pf_ppo_resample_indices
from rlhf_core.config.validate import use_critic
from rlhf_core.data.sampler import create_rl_sampler
from rlhf_core.distributed.threads import use_driver_threads
from rlhf_core.faults import fault_point
from rlhf_core.protocol import Batch
from rlhf_core.trainer.advantage_stage import rewards_from_scores, run_adv_estimator
from rlhf_core.trainer.checkpoint_manager import CheckpointManager
from rlhf_core.trainer.dynamic_sampling import OutOfData, collect_kept_groups, prompts_per_batch, train_batches
from rlhf_core.trainer.driver_utils import (add_uids, after_step_hooks, balance_batch, compute_total_training_steps,
                                            dump_rollouts, ensure_response_mask, mean_rank_metrics, resample_rows,
                                            timer)
from rlhf_core.trainer.ppo_checkpoint import (driver_rng_fork, load_ppo_checkpoint, prepare_resume,
                                              save_ppo_checkpoint)
from rlhf_core.trainer.ppo_validation import Validator
from rlhf_core.trainer.profiling import StepProfiler
from rlhf_core.trainer.rollout_control import RolloutDump, abort_slowest
from rlhf_core.trainer.rollout_corr_step import rollout_correction_step
from rlhf_core.trainer.step_metrics import StepMetrics
from rlhf_core.trainer.reward_stage import add_reward_baselines, finish_reward, start_reward
from rlhf_core.trainer.checkpoint_callback import build_checkpoint_callback
from rlhf_core.trainer.esi import capacity_expiring
from rlhf_core.trainer.tracking import Tracking
from rlhf_core.workers.on_policy import skip_old_log_prob

logger = logging.getLogger(__name__)

WorkerGroupFactory = Callable[[DictConfig], dict[str, Any]]


class RayPPOTrainer:
    """PPO / GRPO / RLOO / REINFORCE++ driver.

    Args:
        config: the full ``ppo_trainer`` config (verl key layout), already validated.
        tokenizer: HF tokenizer (decoding validation samples).
        make_worker_groups: factory described in the module docstring.
        reward_fn, val_reward_fn: reward managers, ``fn(batch, return_dict=True) -> {"reward_tensor": (B, T),
            "reward_extra_info": dict[str, list]}``; ``val_reward_fn=None`` disables validation.
        train_dataset, val_dataset: ``RLHFDataset``-like datasets; ``collate_fn`` turns items into a ``Batch``.
        tracker: a ``Tracking`` (anything with ``log(data, step)``); ``None`` → built from ``trainer.logger``.
    """

    def __init__(self, config: DictConfig, tokenizer: Any, make_worker_groups: WorkerGroupFactory,
                 reward_fn: Callable, val_reward_fn: Callable | None, train_dataset: Any, val_dataset: Any = None,
                 collate_fn: Callable | None = None, tracker: Any = None):
        self.config = config
        self.tokenizer = tokenizer
        self.make_worker_groups = make_worker_groups
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn if val_dataset is not None else None
        self.tracker = tracker
        algo = config.algorithm
        self.use_critic = use_critic(config)  # critic.enable; null = only for gae (verl 0.6 need_critic)
        self.use_pf_ppo = bool(algo.use_pf_ppo) and algo.adv_estimator == "gae"
        if algo.use_pf_ppo and not self.use_pf_ppo:
            logger.warning("algorithm.use_pf_ppo=True has no effect with adv_estimator=%s: as in verl, PF-PPO "
                           "resamples the batch only with adv_estimator=gae", algo.adv_estimator)
        self.use_remax = algo.adv_estimator == "remax"
        self.use_reference_policy = bool(algo.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)
        self.use_distillation = bool(config.distillation.enabled)  # the actor's workers hold the teachers
        self.kl_ctrl = None
        if algo.use_kl_in_reward:
            kc = algo.kl_ctrl
            self.kl_ctrl = get_kl_controller(kc.type, kc.kl_coef, kc.horizon, kc.target_kl)
        self._build_dataloaders(train_dataset, val_dataset, collate_fn)
        self.checkpoints = CheckpointManager.from_config(config.trainer)
        self.step_metrics = StepMetrics(config, self.use_critic)  # data, timing, throughput, MFU of each step
        self.rollout_dump = RolloutDump.from_config(config)  # skip.rollout.enable
        self.global_steps = 0
        self._train_started: float | None = None  # time.monotonic() when fit's loop started (the budget clock)
        self._budget_stop = False  # the last train_step found the budget spent (it validated and checkpointed)
        self._max_step_s = 0.0  # the longest step so far (seconds), for the capacity-expiry save (esi.py)
        self.checkpoint_callback = build_checkpoint_callback(config)  # trainer.checkpoint_callback_class
        self.last_checkpoint_dir: str | None = None
        self.wgs: dict[str, Any] = {}
        self._driver_threads_before: int | None = None  # this driver's intra-op threads before init_workers

    # ---- setup -----------------------------------------------------------------------------------
    def _build_dataloaders(self, train_dataset, val_dataset, collate_fn) -> None:
        data = self.config.data
        collate = collate_fn or default_collate
        workers = int(data.dataloader_num_workers)
        seed = None if data.seed is None else int(data.seed)  # an explicit 0 stays 0
        self.train_dataloader = build_dataloader(train_dataset, prompts_per_batch(self.config),
                                                 shuffle=bool(data.shuffle), seed=seed,
                                                 drop_last=True, collate_fn=collate, num_workers=workers,
                                                 sampler=create_rl_sampler(data, train_dataset))
        self.val_dataloader = None
        if val_dataset is not None:
            val_bs = len(val_dataset) if data.val_batch_size is None else data.val_batch_size
            # data.validation_shuffle: a seeded (data.seed) shuffle of the validation set, as verl's val dataloader
            self.val_dataloader = build_dataloader(val_dataset, int(val_bs), shuffle=bool(data.validation_shuffle),
                                                   seed=seed, drop_last=False, collate_fn=collate)
        self.total_training_steps = compute_total_training_steps(self.config, len(self.train_dataloader))
        with open_dict(self.config):
            self.config.actor_rollout_ref.actor.optim.total_training_steps = self.total_training_steps
            self.config.critic.optim.total_training_steps = self.total_training_steps

    def init_workers(self) -> None:
        """Build the worker groups (critic, ref, reward model, then actor — verl's order) and call ``init_model``.
        When every group computes in other processes (Ray actors), this driver keeps one intra-op thread until
        :meth:`shutdown` (:func:`rlhf_core.distributed.threads.use_driver_threads`)."""
        self.wgs = dict(self.make_worker_groups(self.config))
        if not any(getattr(wg, "in_process", True) for wg in self.wgs.values()):  # a custom group: in-process
            self._driver_threads_before = use_driver_threads()
        for role in ("critic", "ref", "rm", "actor_rollout"):
            if role in self.wgs:
                self.wgs[role].execute_all("init_model")
        self.validator = Validator(self.config, self.tokenizer, self.wgs["actor_rollout"], self.val_reward_fn,
                                   self.val_dataloader, rm_wg=self.wgs.get("rm"))

    actor_wg = property(lambda self: self.wgs["actor_rollout"])

    # ---- the loop --------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Train until ``total_training_steps`` (or ``trainer.stop_after_step``, or until the wall-clock budget
        ``trainer.total_training_seconds`` is spent); returns the last step's metrics.

        The budget clock starts when the first training step starts (after ``val_before_train``; a resumed run
        starts a new clock). The step during which it runs out is treated as the last step: it validates (when
        ``test_freq > 0``) and checkpoints (when ``save_freq > 0``), then the loop stops.

        A run resumed at or beyond its last step (or its ``stop_after_step``) trains nothing and returns ``{}``
        (or the ``val_before_train`` metrics)."""
        resume_from = prepare_resume(self)  # default_local_dir locked, a complete checkpoint chosen: before workers
        if not self.wgs:
            self.init_workers()
        self._ensure_tracker()
        self._load_checkpoint(resume_from)
        last_metrics: dict[str, float] = {}
        if self.val_reward_fn is not None and self.config.trainer.val_before_train:
            with driver_rng_fork():  # a resumed run validates again here: the training steps' draws stay the same
                last_metrics = self.validator.validate(self.global_steps)
            self.tracker.log(last_metrics, step=self.global_steps)
            if self.config.trainer.val_only:
                return last_metrics
        stop_after = self.config.trainer.stop_after_step
        stop_at = self.total_training_steps if stop_after is None else min(self.total_training_steps, int(stop_after))
        if self.global_steps >= stop_at:
            return last_metrics
        steps_per_epoch = len(self.train_dataloader)
        n_epochs = -(-self.total_training_steps // steps_per_epoch)  # ceil: total_training_steps may be given
        profiler = StepProfiler(self.config.global_profiler, self.wgs)
        self._train_started = time.monotonic()
        batches = self.train_batches(n_epochs, stop_at)
        more = (b for _, b in batches)  # dynamic sampling's further gen batches: the same stream
        for epoch, batch in batches:
            self.global_steps += 1
            fault_point("driver", self.global_steps)  # test-only (RLHF_FAULT): between steps; free when unset
            profiler.begin(self.global_steps)
            try:
                last_metrics = self.train_step(batch, epoch, more)
            except OutOfData as exc:  # filter_groups: the data ended inside a step, which is not trained
                logger.warning("%s: step %d is not trained", exc, self.global_steps)
                self.global_steps -= 1
                profiler.end(self.global_steps + 1, last=True)
                break
            last = self.global_steps >= stop_at or self._budget_stop  # the step's own decision, not a new look
            profiler.end(self.global_steps, last=last)
            self.tracker.log(last_metrics, step=self.global_steps)
            if last:
                break
        self.checkpoints.finish_pending()
        return last_metrics

    def train_batches(self, n_epochs: int, stop_at: int) -> Iterator[tuple[int, Batch]]:
        """(epoch, prompts) per drawn batch, from the loader's position to the end of epoch ``n_epochs - 1``
        (``stop_at``: the last step; one-step off-policy looks ahead one batch)."""
        return train_batches(self.train_dataloader, n_epochs)

    def loader_state(self) -> dict[str, Any]:
        """The data position a checkpoint of this step records: the loader's (every batch drawn so far was trained;
        the one-step off-policy driver returns the position before the batch it drew ahead)."""
        return self.train_dataloader.state_dict()

    def budget_spent(self) -> bool:
        """True once ``trainer.total_training_seconds`` (wall clock, seconds) have passed since the training loop
        started; always False when the key is null or the loop has not started."""
        budget = self.config.trainer.total_training_seconds
        return (budget is not None and self._train_started is not None
                and time.monotonic() - self._train_started >= float(budget))

    def _ensure_tracker(self) -> None:
        if self.tracker is None:
            self.tracker = Tracking(self.config.trainer.project_name, self.config.trainer.experiment_name,
                                    self.config.trainer.logger, config=self.config)

    def train_step(self, batch: Batch, epoch: int, more: Iterator[Batch] = iter(())) -> dict[str, float]:
        """One PPO iteration on a batch of prompts (SEMANTICS "One PPO step"); returns its metrics. ``more``: the
        following batches of prompts, drawn from by dynamic sampling (``algorithm.filter_groups``)."""
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        is_last = self.global_steps >= self.total_training_steps
        with timer("step", timing):
            batch, pending_reward = self.sample(batch, more, timing, metrics)
            with timer("old_log_prob", timing):
                batch = self.compute_old_log_prob(batch, metrics)
                batch = self.compute_rollout_correction(batch, metrics)
            if self.use_reference_policy:
                with timer("ref", timing):
                    batch = self.compute_ref_log_prob(batch)
            if self.use_distillation:
                with timer("teacher", timing):
                    batch = self.compute_teacher_log_prob(batch)
            if self.use_critic:
                with timer("values", timing):
                    batch = self.compute_values(batch)
            with timer("adv", timing):
                batch = self.compute_advantage(finish_reward(batch, pending_reward), metrics)
            if self.config.trainer.rollout_data_dir:
                with timer("dump_rollout_generations", timing):
                    dump_rollouts(batch, self.tokenizer, str(self.config.trainer.rollout_data_dir), self.global_steps)
            if self.use_critic:
                with timer("update_critic", timing):
                    metrics.update(self.update_critic(batch))
            # SEMANTICS: the actor updates once step > critic_warmup (verl's `<=` gave one step too few of warmup).
            if self.global_steps > int(self.config.trainer.critic_warmup):
                with timer("update_actor", timing):
                    metrics.update(self.update_actor(batch))
            # the budget ran out during this step: it is the last. Decided once, here: fit stops on this decision, so a
            # budget that runs out between this check and the end of the step gets one more step, which validates and
            # checkpoints (a second look in fit stopped such a run with neither)
            self._budget_stop = self.budget_spent()
            is_last = is_last or self._budget_stop
            if self._should_test(is_last):
                with timer("testing", timing):
                    metrics.update(self.validator.validate(self.global_steps))
            after_step_hooks(self.train_dataloader, batch)  # before the save: the checkpoint holds the sampler state after its update
            if self._should_save(is_last):
                with timer("save_checkpoint", timing):
                    self.save_checkpoint()
        self._max_step_s = max(self._max_step_s, timing["step"])
        metrics.update(self.step_metrics(batch, timing, self.actor_wg, self.global_steps, epoch, self._train_started))
        return metrics

    # ---- stages ----------------------------------------------------------------------------------
    def sample(self, prompts: Batch, more: Iterator[Batch], timing: dict, metrics: dict) -> tuple[Batch, Any]:
        """[gen] [gen_max] [reward] on the prompts, rows balanced (``trainer.balance_batch``); with
        ``algorithm.filter_groups.enable``, DAPO dynamic sampling (:mod:`rlhf_core.trainer.dynamic_sampling`):
        gen batches until ``data.train_batch_size`` groups with a spread of the metric are kept, then balanced.
        Returns (batch, the pending reward for :func:`finish_reward`: None when the rewards are merged already, as
        dynamic sampling needs them to choose the groups)."""
        fg, balance = self.config.algorithm.filter_groups, bool(self.config.trainer.balance_batch)
        if not fg.enable:
            return self.rollout(prompts, timing, metrics, balance)
        batch, dynamic_metrics = collect_kept_groups(
            prompts, more, lambda p: finish_reward(*self.rollout(p, timing, metrics, False)), str(fg.metric),
            int(self.config.data.train_batch_size), int(self.config.actor_rollout_ref.rollout.n),
            int(fg.max_num_gen_batches))
        metrics.update(dynamic_metrics)
        return (self.balance(batch, metrics) if balance else batch), None

    def rollout(self, batch: Batch, timing: dict, metrics: dict, balance: bool) -> tuple[Batch, Any]:
        """One prompt batch: uids, ``rollout.n`` samples each, [gen], [gen_max] (remax), balance, [reward] started
        (``launch_reward_fn_async``: the manager runs on until [adv]); returns (batch, pending reward)."""
        prompts = add_uids(batch)
        batch = prompts.repeat_interleave(int(self.config.actor_rollout_ref.rollout.n))
        with timer("gen", timing):
            batch = self.generate(batch)
        if self.use_remax:
            with timer("gen_max", timing):
                batch = self.compute_reward_baselines(prompts, batch)
        batch = self.balance(batch, metrics) if balance else batch
        with timer("reward", timing):
            return self.start_reward(batch)

    def balance(self, batch: Batch, metrics: dict) -> Batch:
        """``trainer.balance_batch``: rows reordered so each actor rank gets a similar token count (whole uid groups
        with ``actor.use_prefix_grouper``, as verl)."""
        batch, balance_metrics = balance_batch(batch, self.actor_wg.world_size,
                                               bool(self.config.actor_rollout_ref.actor.use_prefix_grouper))
        metrics.update(balance_metrics)
        return batch

    def generate(self, batch: Batch, step: int | None = None) -> Batch:
        """[gen] rollout: adds ``prompts``, ``responses``, full ``input_ids``/masks, ``response_mask``.

        ``skip.rollout`` replays/dumps the engine output (its ``steps`` and ``action``) and ``rollout.over_sample_rate`` pads the slowest
        responses (``rlhf_core.trainer.rollout_control``). ``step``: the step it is for (default the current one;
        the fully async rollouter generates ahead)."""
        step = self.global_steps if step is None else step
        batch.meta.update({"global_steps": step, "validate": False})
        out = self.rollout_dump.load(step, len(batch)) if self.rollout_dump else None
        if out is None:
            out = self.rollout_generate(batch)
            if self.rollout_dump:
                self.rollout_dump.dump(step, out)  # only a step in skip.rollout.steps
        rate = float(self.config.actor_rollout_ref.rollout.over_sample_rate)
        if rate > 0:
            out, _ = abort_slowest(ensure_response_mask(out), rate, self.tokenizer.pad_token_id)
        batch = ensure_response_mask(batch.merge(out, "actor rollout generate_sequences"))
        batch.meta["global_token_num"] = batch["attention_mask"].sum(-1).tolist()
        return batch

    def rollout_generate(self, batch: Batch) -> Batch:
        """The engine's ``generate_sequences`` (here the actor group's colocated rollout)."""
        return self.actor_wg.execute_dp("generate_sequences", batch)

    def compute_reward_baselines(self, prompts: Batch, batch: Batch) -> Batch:
        """[gen_max] (remax only) ``reward_baselines (B,)``: the score of a greedy response to each prompt."""
        return add_reward_baselines(prompts, batch, self.actor_wg, self.reward_fn, self.wgs.get("rm"),
                                    self.global_steps)

    def start_reward(self, batch: Batch) -> tuple[Batch, Any]:
        """[reward] ``token_level_scores (B, T)`` (+ per-sample extra columns from the reward manager), merged by
        :func:`finish_reward`; a reward model's ``rm_scores (B, T)`` are added first and the manager passes them
        through. ``reward_model.launch_reward_fn_async``: the manager runs in the background meanwhile."""
        launch_async = bool(self.config.reward_model.launch_reward_fn_async)
        return start_reward(batch, self.reward_fn, self.wgs.get("rm"), launch_async)

    def compute_old_log_prob(self, batch: Batch, metrics: dict) -> Batch:
        """[old_log_prob] ``old_log_probs (B, T)``; logs ``actor/entropy`` (by ``loss_agg_mode``); skipped when on-policy."""
        if skip_old_log_prob(self.config, self.global_steps):
            return batch  # on-policy: the update's first forward provides them (rlhf_core/workers/on_policy.py)
        if self.config.algorithm.rollout_correction.bypass_mode or self.config.actor_rollout_ref.actor.use_rollout_log_probs:
            # verl 0.9 bypass / actor.use_rollout_log_probs: π_old = π_rollout (calculate_log_probs checked at load)
            return batch.merge(Batch({"old_log_probs": batch["rollout_log_probs"]}), "rollout old_log_probs")
        out = self.actor_wg.execute_dp("compute_log_prob", batch)
        if "entropys" in out:
            mode = self.config.actor_rollout_ref.actor.loss_agg_mode
            entropy = agg_loss(out["entropys"], batch["response_mask"].float(), mode)
            metrics["actor/entropy"] = float(entropy)
            out = Batch({k: v for k, v in out.tensors.items() if k != "entropys"}, out.non_tensors, out.meta)
        return batch.merge(out, "actor compute_log_prob")

    def compute_rollout_correction(self, batch: Batch, metrics: dict) -> Batch:
        """``algorithm.rollout_correction`` (verl 0.9.1): :func:`rollout_correction_step`."""
        return rollout_correction_step(self.config.algorithm, batch, metrics)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """[ref] ``ref_log_prob (B, T)`` from the ref group, or from the actor group in role actor_rollout_ref."""
        wg = self.wgs.get("ref", self.actor_wg)
        return batch.merge(wg.execute_dp("compute_ref_log_prob", batch), "reference compute_ref_log_prob")

    def compute_teacher_log_prob(self, batch: Batch) -> Batch:
        """[teacher] (``distillation.enabled``) the teachers' log-probs of the responses, from the actor group
        (``rlhf_core.workers.teacher``): ``teacher_log_probs (B, T)``, or for ``forward_kl_topk``
        ``teacher_topk_log_probs`` / ``teacher_topk_ids (B, T, k)``; the update adds the distillation loss."""
        return batch.merge(self.actor_wg.execute_dp("compute_teacher_log_prob", batch), "teacher log-probs")

    def compute_values(self, batch: Batch) -> Batch:
        """[values] ``values (B, T)`` from the critic."""
        return batch.merge(self.wgs["critic"].execute_dp("compute_values", batch), "critic compute_values")

    def compute_advantage(self, batch: Batch, metrics: dict) -> Batch:
        """[adv] KL-in-reward penalty (or rewards = scores), then the ``algorithm.adv_estimator`` over the responses
        that ``rollout.over_sample_rate`` did not abort (aborted ones get advantage 0 and stay out of group
        statistics; ``rlhf_core.trainer.advantage_stage``); then, with ``algorithm.use_pf_ppo`` (gae), the batch is
        resampled by :meth:`pf_ppo_resample`."""
        algo = self.config.algorithm
        rewards = rewards_from_scores(algo, batch, self.kl_ctrl, metrics)
        advantages, returns = run_adv_estimator(algo, batch, rewards, metrics)
        batch = batch.merge(Batch({"token_level_rewards": rewards, "advantages": advantages, "returns": returns}))
        return self.pf_ppo_resample(batch) if self.use_pf_ppo else batch

    def pf_ppo_resample(self, batch: Batch) -> Batch:
        """PF-PPO (``algorithm.use_pf_ppo``, with gae, as verl): the batch resampled with replacement, P(row) ∝ the
        ``algorithm.pf_ppo`` weight of its score Σ_t token_level_scores (``rlhf_core.algos.pf_ppo``). Per-row lists
        in ``meta`` (``global_token_num``) follow the rows. Seeded by the global step, so a resumed run draws the
        same rows (verl draws from the global RNG)."""
        pf = self.config.algorithm.pf_ppo
        idx = pf_ppo_resample_indices(batch["token_level_scores"].sum(-1), pf.reweight_method, float(pf.weight_pow),
                                      generator=torch.Generator().manual_seed(self.global_steps))
        return resample_rows(batch, idx)

    def update_critic(self, batch: Batch) -> dict[str, float]:
        """[update_critic] one critic update; per-rank metrics averaged."""
        return mean_rank_metrics(_as_list(self.wgs["critic"].execute_dp("update_critic", batch)))

    def update_actor(self, batch: Batch) -> dict[str, float]:
        """[update_actor] one actor update (the worker syncs the new weights to its rollout engine)."""
        batch.meta["global_steps"] = self.global_steps
        return mean_rank_metrics(_as_list(self.actor_wg.execute_dp("update_actor", batch)))

    # ---- testing and checkpoints -----------------------------------------------------------------
    def _should_test(self, is_last: bool) -> bool:
        freq = int(self.config.trainer.test_freq)  # > 0: every freq steps and the last
        return self.val_reward_fn is not None and freq > 0 and (is_last or self.global_steps % freq == 0)

    def _should_save(self, is_last: bool) -> bool:
        freq = int(self.config.trainer.save_freq)
        stop_after = self.config.trainer.stop_after_step
        at_stop = stop_after is not None and self.global_steps == int(stop_after)
        expiring = freq > 0 and capacity_expiring(self._max_step_s, float(self.config.trainer.esi_redundant_time))
        return at_stop or expiring or (freq > 0 and (is_last or self.global_steps % freq == 0))

    def save_checkpoint(self) -> str:
        """[save_checkpoint] see :func:`rlhf_core.trainer.ppo_checkpoint.save_ppo_checkpoint`."""
        return save_ppo_checkpoint(self)

    def _load_checkpoint(self, path: str | None) -> None:
        """Resume from ``path`` (:func:`rlhf_core.trainer.ppo_checkpoint.prepare_resume`'s choice; None: fresh)."""
        load_ppo_checkpoint(self, path)

    def shutdown(self) -> None:
        """Stop the workers and the tracker; the lock of ``default_local_dir`` is released even when that raises
        (a retry in this same process, e.g. a reused Ray worker, must be able to take it)."""
        try:
            self._stop()
        finally:
            self.checkpoints.lock.release()

    def _stop(self) -> None:
        if self.wgs:
            try:  # an async checkpoint still being written when fit raised: keep it if it completes
                self.checkpoints.finish_pending()
            except Exception as exc:  # the tracker keeps naming the last complete checkpoint
                logger.warning("pending async checkpoint not completed: %s", exc)
        for wg in self.wgs.values():
            wg.shutdown()
        if self._driver_threads_before is not None:
            torch.set_num_threads(self._driver_threads_before)
            self._driver_threads_before = None
        if self.tracker is not None and hasattr(self.tracker, "finish"):
            self.tracker.finish()


def _as_list(out: Any) -> list:
    return out if isinstance(out, list) else [out]
