"""Ray-hosted FSDP2 workers (verl ``fsdp_workers.ActorRolloutRefWorker`` / ``CriticWorker``).

Every method runs on every rank with this rank's shard of the batch (``RayWorkerGroup.execute_dp``);
collective methods (``init_model``, ``update_*``, ``save/load_checkpoint``) must be called on all ranks.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import torch
from omegaconf import OmegaConf

from rlhf_core.algos.advantages_token_baseline import needs_sum_pi_squared
from rlhf_core.workers.ulysses import role_sequence_parallel, sp_size_of
from rlhf_core.faults import fault_point
from rlhf_core.models.loading import load_tokenizer, model_tokenizer_path
from rlhf_core.protocol import Batch
from rlhf_core.trainer.mfu import rank_peak_flops
from rlhf_core.workers.actor import DataParallelPPOActor
from rlhf_core.workers.checkpoint import FSDPCheckpointManager, run_seed, seed_rank
from rlhf_core.workers.critic import DataParallelPPOCritic
from rlhf_core.workers.determinism import apply_engine_determinism
from rlhf_core.workers.fsdp_utils import full_state_dict, is_sharded
from rlhf_core.workers.model_setup import build_model, build_optim, micro_per_rank, note_unsupported, update_sizes
from rlhf_core.workers.profiler import ProfiledWorker, profiled_stage, union_profiler_configs
from rlhf_core.workers.rollout.engine_copy import compute_dtype
from rlhf_core.workers.rollout.hf_rollout import HFRollout
from rlhf_core.workers.rollout_setup import build_rollout
from rlhf_core.workers.on_policy import first_forward_is_old_log_prob, merge_old_log_probs
from rlhf_core.user_code import import_extensions

logger = logging.getLogger(__name__)
ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


def _listed(value: Any) -> list | None:
    return None if value is None else list(value)


class ActorRolloutRefWorker(ProfiledWorker):
    """Actor (FSDP2 + AdamW), rollout engine (hybrid: its own full copy of the policy) and/or reference.

    Args:
        config: the full PPO config (verl key layout; ``actor_rollout_ref.*``, ``data.*``).
        role: ``actor_rollout``, ``actor_rollout_ref``, ``ref`` (also ``actor``/``rollout`` alone).
    Raises ``ValueError`` for an unknown role.
    """

    def __init__(self, config, role: str = "actor_rollout") -> None:
        if role not in ROLES:
            raise ValueError(f"role={role!r}: use one of {list(ROLES)}")
        import_extensions(config.trainer.extensions)  # a registered policy loss, in this worker process too
        self.config = config
        self.role = role
        self.arr = config.actor_rollout_ref
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        self.actor = self.ref = self.rollout = None
        self.actor_module = self.optimizer = self.lr_scheduler = self.ckpt = None
        self.profiler_role = "actor" if self._is_actor or self._is_rollout else "ref"  # names the trace file

    def profiler_config(self):
        """The union of the ``profiler`` blocks of the roles this worker holds (actor, rollout, ref)."""
        held = [r for r, on in (("actor", self._is_actor), ("rollout", self._is_rollout), ("ref", self._is_ref)) if on]
        return union_profiler_configs([OmegaConf.select(self.arr, f"{r}.profiler") for r in held])

    # ---- set-up --------------------------------------------------------------------------------------------
    def init_model(self) -> None:
        """Load tokenizer and models; shard with FSDP2; build optimizer, LR schedule, rollout; push weights."""
        mcfg, acfg = self.arr.model, self.arr.actor
        if (self._is_actor and acfg.use_kl_loss and acfg.kl_loss_type == "full"
                and not self._is_ref):
            raise ValueError(f"actor_rollout_ref.actor.kl_loss_type='full' needs the reference model in the actor's "
                             f"worker (role 'actor_rollout_ref'), got role {self.role!r}")
        self.tokenizer = load_tokenizer(model_tokenizer_path(mcfg), bool(mcfg.trust_remote_code),
                                        mcfg.custom_chat_template)
        n = int(self.arr.rollout.n)
        self.actor_sp = self.ref_sp = None  # ulysses_sequence_parallel_size > 1: workers/ulysses.py
        if self._is_actor:
            note_unsupported(mcfg, bool(acfg.use_torch_compile), "actor")
            apply_engine_determinism(acfg.fsdp_config)
            self.actor_module = build_model(mcfg, acfg.fsdp_config, "actor")
            self.optimizer, self.lr_scheduler = build_optim(self.actor_module, acfg.optim)
            self.actor_sp = role_sequence_parallel(self.actor_module, acfg, "fsdp_config", "actor_rollout_ref.actor",
                                                   mcfg)
            self.actor = DataParallelPPOActor(acfg, self.actor_module, self.optimizer,
                                              use_remove_padding=bool(mcfg.use_remove_padding), sp=self.actor_sp,
                                              prefix_grouper=bool(acfg.use_prefix_grouper),
                                              **update_sizes(acfg, mcfg, "actor_rollout_ref.actor", n,
                                                             sp_size_of(self.actor_sp)))
            self.ckpt = FSDPCheckpointManager(
                self.actor_module, self.optimizer, self.lr_scheduler, self.tokenizer,
                getattr(self.actor_module, "config", None),
                save_contents=list(acfg.checkpoint.save_contents), load_contents=_listed(acfg.checkpoint.load_contents),
                extra_state=self._extra_state, set_extra_state=self._set_extra_state,
                generation_config=getattr(self.actor_module, "generation_config", None),
                async_save=bool(acfg.checkpoint.async_save), seed=run_seed(self.config))
        if self._is_rollout:
            self._init_rollout()
        if self._is_ref:
            rcfg = self.arr.ref
            apply_engine_determinism(rcfg.fsdp_config)
            ref_model = build_model(mcfg, rcfg.fsdp_config, "ref")
            self.ref_sp = role_sequence_parallel(ref_model, rcfg, "fsdp_config", "actor_rollout_ref.ref", mcfg,
                                                 reuse=self.actor_sp)
            self.ref = DataParallelPPOActor(rcfg, ref_model, use_remove_padding=bool(mcfg.use_remove_padding),
                                            prefix_grouper=bool(acfg.use_prefix_grouper),  # verl: the actor's key
                                            sp=self.ref_sp)
        if self.actor is not None and self.ref is not None:
            if sp_size_of(self.actor_sp) != sp_size_of(self.ref_sp) and self.actor.config.kl_loss_type == "full":
                raise ValueError("kl_loss_type='full' runs the reference inside the actor's forward: "
                                 "actor_rollout_ref.ref.ulysses_sequence_parallel_size must equal the actor's "
                                 f"({sp_size_of(self.ref_sp)} != {sp_size_of(self.actor_sp)})")
            self.actor.ref_model = self.ref.model  # kl_loss_type / kl_penalty 'full' need the ref's full logits
        if self.actor is not None and self.config.distillation.enabled:
            self._init_teachers()
        seed_rank(self.config)

    def _init_teachers(self) -> None:
        """``distillation.enabled``: load the teachers on this rank (``teacher.build_teachers``) and hand the actor
        its distillation loss settings."""
        from rlhf_core.workers.teacher import build_teachers

        self.teachers = build_teachers(self.config, bool(self.arr.model.use_remove_padding))
        self.actor.distillation = self.config.distillation.distillation_loss

    def _init_rollout(self) -> None:
        """This rank's rollout engine (``rollout_setup.build_rollout``), loaded with the actor's weights."""
        self.rollout = build_rollout(self.config, self.tokenizer, run_seed(self.config),  # both seeds null: 0
                                     weights_from_actor=self.actor_module is not None)
        self.sync_rollout_weights()

    def sync_rollout_weights(self) -> None:
        """Gather the actor's FSDP weights (full state dict on every rank) and load them into the rollout engine."""
        if self.rollout is not None and self.actor_module is not None:
            self.rollout.sync_weights(full_state_dict(self.actor_module))

    def actor_weights(self) -> dict:
        """The actor's full state dict (HF key names, on CPU; collective on the actor ranks): what a standalone
        rollout group loads with :meth:`load_rollout_weights` (one-step off-policy trainer). A copy: on one rank the
        plain module's state dict holds the live parameters, which the next update changes."""
        state = full_state_dict(self.actor_module)
        if is_sharded(self.actor_module):  # gathered: already fresh tensors
            return {k: v.detach().cpu() for k, v in state.items()}
        return {k: v.detach().cpu().clone() for k, v in state.items()}

    def load_rollout_weights(self, state_dict: dict) -> None:
        """Load ``state_dict`` (from :meth:`actor_weights`) into this worker's rollout engine (clears an
        :meth:`interrupt_generation`)."""
        self.rollout.sync_weights(state_dict)

    # ---- partial rollouts (fully async, async_training.partial_rollout; HFRollout.start_partial...) -------------
    def start_partial_generation(self, batch: Batch) -> bool:
        """Start an interruptible rollout of this rank's prompts; True when it ended, False when interrupted."""
        fault_point("generate", batch.meta.get("global_steps"))  # test-only (RLHF_FAULT); free when unset
        return self._partial_engine().start_partial(batch)

    def resume_partial_generation(self) -> bool:
        """Resume this rank's interrupted rollout with the weights loaded since; True when it ended."""
        return self._partial_engine().resume_partial()

    def finish_partial_generation(self) -> Batch:
        """This rank's ended rollout: ``generate_sequences``' batch plus ``rollout_last_segment (B,)``."""
        return self._partial_engine().finish_partial()

    # ---- continuous batching (fully async rollouter on the hf engine; hf_stream.RolloutStream) -------------------
    def stream_supported(self) -> bool:
        """Whether this rank's engine batches continuously: the hf engine without agent loops, on a model
        ``ContinuousDecoder`` runs (SDPA, full attention only, the lean decode's forward)."""
        from rlhf_core.kernels.grouped_attention import sdpa_full_attention

        engine = self.rollout
        return isinstance(engine, HFRollout) and engine.lean_decode and sdpa_full_attention(engine.module)

    def stream_submit(self, batch: Batch, slots: int) -> None:
        """Queue this rank's rows in its continuous-batching session (``hf_stream.RolloutStream``, opened with
        ``slots`` rows at the first call): one sampling call of the engine, as ``generate_sequences``."""
        fault_point("generate", batch.meta.get("global_steps"))  # test-only (RLHF_FAULT); free when unset
        from rlhf_core.workers.rollout.hf_stream import RolloutStream

        engine = self._partial_engine()
        if engine.stream is None:
            engine.stream = RolloutStream(engine, slots)
        engine.stream.submit(batch)

    def stream_advance(self) -> tuple[Batch | None, int, int]:
        """Decode this rank's session until a row ends or :meth:`interrupt_generation` (the rows that ended or None,
        rows still open, rows waiting for a slot)."""
        stream = self._partial_engine().stream
        if stream is None:
            return None, 0, 0
        rows = stream.advance(self.rollout._interrupt.is_set)
        return rows, stream.open, len(stream.decoder.waiting) if stream.decoder is not None else 0

    def interrupt_generation(self) -> None:
        """Stop this rank's partial rollout after its current token (called from another thread of the actor while
        it generates: the rollout group runs with ``max_concurrency=2``); cleared by the next weight load. An agent-loop
        rollout stops before its next decoding step instead, its trajectories open (``rlhf_core/agent/pause.py``)."""
        from rlhf_core.workers.rollout.agent_rollout import AgentRollout

        if isinstance(self.rollout, AgentRollout):
            self.rollout.interrupt()
            return
        self._partial_engine().interrupt()

    def release_generation(self) -> None:
        """Undo :meth:`interrupt_generation` when the weight load will not come (the sync failed): an agent-loop
        rollout goes on with the weights it holds instead of waiting forever; a partial hf rollout stops cutting
        every segment after one token."""
        self.rollout.release()

    def _partial_engine(self) -> HFRollout:
        if not isinstance(self.rollout, HFRollout):
            raise RuntimeError(f"role {self.role!r}: partial rollouts need the hf rollout engine (actor_rollout_ref."
                               f"rollout.name=hf without agent loops), this worker has {type(self.rollout).__name__}")
        return self.rollout

    def _extra_state(self) -> dict:
        return {"actor_update_calls": self.actor.update_calls if self.actor else 0,
                "rollout_calls": getattr(self.rollout, "calls", 0)}

    def _set_extra_state(self, state: dict) -> None:
        if self.actor is not None:
            self.actor.update_calls = int(state.get("actor_update_calls", 0))
        if self.rollout is not None and hasattr(self.rollout, "calls"):
            self.rollout.calls = int(state.get("rollout_calls", 0))

    def peak_rss_kib(self) -> int:
        """Peak resident memory of this worker's process in KiB (Linux ``ru_maxrss``), for the benchmark."""
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)

    def peak_flops(self) -> float | None:
        """Peak dense-matmul FLOP/s of this rank in the actor's compute dtype (``fsdp_config.mixed_precision.
        param_dtype`` when not fp32, else ``model_dtype``), for ``perf/mfu/actor``: the CUDA device's table entry,
        or on CPU measured once per process at this rank's thread count (``rlhf_core.trainer.mfu.rank_peak_flops``,
        about 0.2 s the first time); ``None`` when unknown.

        Raises:
            RuntimeError: when this worker holds no actor.
        """
        if self.actor is None:
            raise RuntimeError(f"role {self.role!r} has no actor")
        return rank_peak_flops(compute_dtype(self.arr.actor.fsdp_config))

    def has_ref(self) -> bool:
        """Whether this worker holds a reference model (role ``ref`` / ``actor_rollout_ref``)."""
        return self.ref is not None

    # ---- compute -------------------------------------------------------------------------------------------
    @profiled_stage("generate_sequences")
    def generate_sequences(self, batch: Batch) -> Batch:
        """Rollout on this rank's prompts (see ``HFRollout.generate_sequences``)."""
        if self.rollout is None:
            raise RuntimeError(f"role {self.role!r} has no rollout engine")
        if not batch.meta.get("validate"):
            fault_point("generate", batch.meta.get("global_steps"))  # test-only (RLHF_FAULT); free when unset
        return self.rollout.generate_sequences(batch)

    def _temperature(self, batch: Batch) -> Batch:
        batch.meta.setdefault("temperature", float(self.arr.rollout.temperature))
        return batch

    @profiled_stage("compute_log_prob")
    def compute_log_prob(self, batch: Batch) -> Batch:
        """``Batch{old_log_probs (B,T), entropys (B,T)}`` from the current actor (rollout.log_prob_* batching), and
        ``sum_pi_squared (B,T)`` when ``actor.calculate_sum_pi_squared`` or the advantage estimator needs it."""
        if self.actor is None:
            raise RuntimeError(f"role {self.role!r} has no actor")
        rcfg = self.arr.rollout
        dynamic = bool(rcfg.log_prob_use_dynamic_bsz)
        micro = micro_per_rank(rcfg, "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size", dynamic,
                               sp_size_of(self.actor_sp))
        batch = self._temperature(batch)
        spp = needs_sum_pi_squared(self.config.algorithm.adv_estimator, self.arr.actor.calculate_sum_pi_squared)
        lp, ent, *rest = self.actor.compute_log_prob(batch, micro, dynamic, rcfg.log_prob_max_token_len_per_gpu,
                                                     calculate_sum_pi_squared=spp)
        return Batch({"old_log_probs": lp, "entropys": ent, **({"sum_pi_squared": rest[0]} if spp else {})},
                     meta={"temperature": batch.meta["temperature"]})

    def _full_kl_in_reward(self) -> bool:
        algo = self.config.algorithm
        return bool(algo.use_kl_in_reward) and algo.kl_penalty == "full"

    @profiled_stage("compute_ref_log_prob")
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """``Batch{ref_log_prob (B,T)}`` from the frozen reference model (ref.log_prob_* batching).

        With ``algorithm.use_kl_in_reward`` and ``algorithm.kl_penalty: full`` also ``ref_kl_full (B,T)``: the exact
        KL(π_old ‖ π_ref) per response token from the current (pre-update) actor's and the reference's full logits.

        Raises:
            RuntimeError: without a reference model, or for ``kl_penalty: full`` without the actor in this worker.
        """
        if self.ref is None:
            raise RuntimeError(f"role {self.role!r} has no reference model")
        rcfg = self.arr.ref
        dynamic = bool(rcfg.log_prob_use_dynamic_bsz)
        micro = micro_per_rank(rcfg, "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size", dynamic,
                               sp_size_of(self.ref_sp))
        max_tok = rcfg.log_prob_max_token_len_per_gpu
        batch = self._temperature(batch)
        lp, _ = self.ref.compute_log_prob(batch, micro, dynamic, max_tok, calculate_entropy=False)
        out = {"ref_log_prob": lp}
        if self._full_kl_in_reward():
            if self.actor is None:
                raise RuntimeError("algorithm.kl_penalty='full' needs the actor and the reference in one worker "
                                   f"(role 'actor_rollout_ref'), got role {self.role!r}")
            out["ref_kl_full"] = self.actor.compute_full_kl(batch, micro, dynamic, max_tok)
        return Batch(out)

    @profiled_stage("compute_teacher_log_prob")
    def compute_teacher_log_prob(self, batch: Batch) -> Batch:
        """The distillation teachers' log-probs of this rank's responses (``teacher_log_probs (B, T)``, or
        ``teacher_topk_log_probs``/``teacher_topk_ids (B, T, k)`` for ``forward_kl_topk``), batched as
        :meth:`compute_log_prob` (``rollout.log_prob_micro_batch_size[_per_gpu]``, or ``log_prob_use_dynamic_bsz``
        with ``log_prob_max_token_len_per_gpu``; ``TeacherScorer.score``).

        Raises:
            RuntimeError: when this worker has no teacher (``distillation.enabled`` false, or no actor).
            ValueError: from ``micro_per_rank`` / ``TeacherScorer.score``, naming the key.
        """
        if getattr(self, "teachers", None) is None:
            raise RuntimeError(f"role {self.role!r} has no distillation teacher (distillation.enabled and an actor)")
        rcfg = self.arr.rollout
        dynamic = bool(rcfg.log_prob_use_dynamic_bsz)
        micro = micro_per_rank(rcfg, "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size", dynamic,
                               sp_size_of(self.actor_sp))
        return self.teachers.score(batch, micro, dynamic, rcfg.log_prob_max_token_len_per_gpu)

    @profiled_stage("update_actor", scheduled=True)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """One PPO update on this rank's shard, one LR-scheduler step, then a weight sync to the rollout.

        Without ``old_log_probs`` in ``batch`` (the driver's on-policy shortcut, ``workers/on_policy.py``) the
        update's first forward provides them; when this rank's shard does not allow it they are computed first.

        Returns the actor metrics (identical on every rank) plus ``actor/lr`` (the LR the update used) and
        ``timing_s/weight_sync`` (seconds of the rollout weight sync, inside ``timing_s/update_actor``)."""
        if self.actor is None:
            raise RuntimeError(f"role {self.role!r} has no actor")
        fault_point("update_actor", batch.meta.get("global_steps"))  # test-only (RLHF_FAULT); free when unset
        batch = self._temperature(batch)
        if "old_log_probs" not in batch and not first_forward_is_old_log_prob(
                self.actor_module, len(batch), self.actor.mini_batch_size, int(self.arr.actor.ppo_epochs)):
            batch = merge_old_log_probs(batch, self.compute_log_prob(batch))  # the shortcut does not hold here
        metrics = self.actor.update_policy(batch)
        metrics["actor/lr"] = float(self.lr_scheduler.get_last_lr()[0])
        self.lr_scheduler.step()
        start = time.perf_counter()
        self.sync_rollout_weights()
        metrics["timing_s/weight_sync"] = time.perf_counter() - start  # logged so its share of the step shows
        return metrics

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0) -> str:
        """Save the actor (collective). ``hdfs_path`` is not supported yet (logged). Returns ``local_path``."""
        if self.ckpt is None:
            raise RuntimeError(f"role {self.role!r} has no trainable model to checkpoint")
        if hdfs_path:
            logger.warning("save_checkpoint: hdfs_path=%s is ignored (copy the local checkpoint instead)", hdfs_path)
        return self.ckpt.save(local_path)

    def wait_checkpoint(self) -> str | None:
        """Block until an ``async_save`` checkpoint is on disk (collective); returns its path (None: none pending)."""
        return self.ckpt.wait() if self.ckpt is not None else None

    def load_checkpoint(self, local_path: str) -> None:
        """Restore actor (+ optimizer, scheduler, RNG per ``load_contents``) and re-sync the rollout."""
        if self.ckpt is None:
            raise RuntimeError(f"role {self.role!r} has no trainable model to checkpoint")
        self.ckpt.load(local_path)
        self.sync_rollout_weights()

    def get_state_dict(self) -> dict[str, torch.Tensor]:
        """The actor's full weights on CPU (every rank). For tests and tools."""
        return {k: v.detach().cpu().clone() for k, v in full_state_dict(self.actor_module).items()}


class CriticWorker(ProfiledWorker):
    """The PPO value model on FSDP2 (``critic.*`` config section)."""

    profiler_role, profiler_key = "critic", "critic.profiler"

    def __init__(self, config) -> None:
        import_extensions(config.trainer.extensions)
        self.config = config
        self.ccfg = config.critic
        self.critic = self.module = self.optimizer = self.lr_scheduler = self.ckpt = None

    def init_model(self) -> None:
        ccfg = self.ccfg
        mcfg = ccfg.model
        self.tokenizer = load_tokenizer(mcfg.tokenizer_path, bool(mcfg.trust_remote_code), mcfg.custom_chat_template)
        n = int(ccfg.rollout_n)
        note_unsupported(mcfg, False, "critic")
        apply_engine_determinism(ccfg.fsdp)
        self.module = build_model(mcfg, ccfg.fsdp, "critic", value_head=True)
        self.optimizer, self.lr_scheduler = build_optim(self.module, ccfg.optim)
        sp = role_sequence_parallel(self.module, ccfg, "fsdp", "critic", mcfg)
        self.critic = DataParallelPPOCritic(ccfg, self.module, self.optimizer,
                                            **update_sizes(ccfg, mcfg, "critic", n, sp_size_of(sp)),
                                            use_remove_padding=bool(mcfg.use_remove_padding), sp=sp)
        self.ckpt = FSDPCheckpointManager(
            self.module, self.optimizer, self.lr_scheduler, self.tokenizer, getattr(self.module, "config", None),
            save_contents=list(ccfg.checkpoint.save_contents), load_contents=_listed(ccfg.checkpoint.load_contents),
            extra_state=lambda: {"critic_update_calls": self.critic.update_calls},
            set_extra_state=lambda s: setattr(self.critic, "update_calls", int(s.get("critic_update_calls", 0))),
            async_save=bool(ccfg.checkpoint.async_save), seed=run_seed(self.config))
        seed_rank(self.config)

    @profiled_stage("compute_values")
    def compute_values(self, batch: Batch) -> Batch:
        """``Batch{values (B,T)}`` (masked by ``response_mask``)."""
        return Batch({"values": self.critic.compute_values(batch)})

    @profiled_stage("update_critic", scheduled=True)
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """One critic update + LR step; metrics incl. ``critic/lr``."""
        metrics = self.critic.update_critic(batch)
        metrics["critic/lr"] = float(self.lr_scheduler.get_last_lr()[0])
        self.lr_scheduler.step()
        return metrics

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0) -> str:
        if hdfs_path:
            logger.warning("save_checkpoint: hdfs_path=%s is ignored", hdfs_path)
        return self.ckpt.save(local_path)

    def wait_checkpoint(self) -> str | None:
        """Block until an ``async_save`` checkpoint is on disk (collective); returns its path (None: none pending)."""
        return self.ckpt.wait()

    def load_checkpoint(self, local_path: str) -> None:
        self.ckpt.load(local_path)

    def get_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in full_state_dict(self.module).items()}
