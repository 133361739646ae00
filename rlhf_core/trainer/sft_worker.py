"""One SFT rank: an FSDP2-sharded causal LM, AdamW, the SFT LR schedule, gradient accumulation, checkpoints.

Runs inside a worker group (``LocalWorkerGroup`` for one rank in-process, ``RayWorkerGroup`` for more); every
method takes this rank's shard of the batch. Loss (verl's ``fsdp_sft_trainer``): cross-entropy of
``logits[:, :-1]`` against ``input_ids[:, 1:]`` weighted by ``loss_mask[:, :-1]``, **token-mean over the whole
global batch** — the valid-token count is summed over micro-batches and ranks first, each micro-batch contributes
``Σ CE·m / N_global`` (× world size, since FSDP averages gradients over ranks), so the loss and gradient do not
depend on ``micro_batch_size_per_gpu`` or the number of ranks. The accumulation, clipping, finite check and step
are the shared :func:`rlhf_core.workers.update_loop.run_update` (one mini-batch, one epoch per step).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from rlhf_core.config.structured import full_key
from rlhf_core.workers.ulysses import (build_sequence_parallel, check_sequence_parallel, gather_rows,
                                           sp_size_of, ulysses_next_token_ce)
from rlhf_core.kernels.packing import packed_next_token_ce
from rlhf_core.models.loading import enable_activation_checkpointing, load_causal_lm, local_path, to_torch_dtype
from rlhf_core.models.lora import check_lora_adapter, lora_from_config, merge_lora
from rlhf_core.models.tiled_mlp import tile_from_config
from rlhf_core.protocol import Batch
from rlhf_core.workers.batching import all_reduce_sum, global_counts, micro_batches
from rlhf_core.workers.checkpoint import FSDPCheckpointManager
from rlhf_core.workers.fsdp_utils import device, full_state_dict, rank, world_size
from rlhf_core.workers.lr_schedule import build_sft_lr_scheduler
from rlhf_core.workers.model_setup import prepare_role_model
from rlhf_core.workers.determinism import apply_engine_determinism
from rlhf_core.workers.optim import build_optimizer
from rlhf_core.workers.profiler import ProfiledWorker, profiled_stage
from rlhf_core.workers.pad_to_length import pad_bucket_of, pad_pack_to_bucket
from rlhf_core.workers.update_loop import UpdateSchedule, run_update

logger = logging.getLogger(__name__)


class SFTWorker(ProfiledWorker):
    """``SFTWorker(config)`` with ``config`` the whole ``sft_trainer`` config; call :meth:`init_model` first.

    Profiling (``profiler`` block, tool torch; the driver calls ``start_profile``/``stop_profile`` around
    ``trainer.profile_interval``): one trace ``<save_path>/step_<first>/sft_rank_<rank>.json`` for the interval, or
    with ``discrete`` one per training step (``sft_train_step[_<i>]_rank_<rank>.json``); a ``schedule`` counts
    training steps (:mod:`rlhf_core.workers.profiler`)."""

    profiler_role, profiler_key, profiler_single_window = "sft", "profiler", False

    def __init__(self, config: Any, total_steps: int):
        self.config = config
        self.total_steps = int(total_steps)
        self.model = self.sp = None

    # ---- model -----------------------------------------------------------------------------------
    def init_model(self) -> None:
        """Load ``model.partial_pretrain`` (its HF config from ``model.hf_config_path`` when set, with
        ``model.override_config`` applied), gradient checkpointing, LoRA (fresh from ``lora_rank`` / ``lora_alpha``
        / ``target_modules`` / ``exclude_modules``, or the saved ``model.lora_adapter_path``), the tiled MLP
        (``model.tiled_mlp``), the kernels and FSDP2; then AdamW and the LR schedule.

        Raises:
            FileNotFoundError / ValueError: a missing or contradicting ``model.lora_adapter_path`` (before the model
                loads), a ``model.tiled_mlp`` the model cannot use, ``use_remove_padding`` for a model that
                cannot pack."""
        mcfg = self.config.model
        torch.manual_seed(int(self.config.trainer.seed))  # an explicit 0 stays 0
        check_lora_adapter(mcfg)
        apply_engine_determinism(self.config.engine)  # engine.full_determinism: seeded by engine.seed instead
        model = self._load_model()
        if mcfg.enable_gradient_checkpointing:
            enable_activation_checkpointing(model)
            model.config.use_cache = False
        model = tile_from_config(lora_from_config(model, mcfg), mcfg)
        offload = bool(mcfg.fsdp_config.cpu_offload and mcfg.fsdp_config.offload_params)
        fsdp_cfg = dict(mcfg.fsdp_config)
        engine = self.config.engine  # verl 0.9's FSDP engine settings that FSDP2 honours here
        fsdp_cfg.update({"param_offload": offload or engine.param_offload,
                         "optimizer_offload": offload or engine.optimizer_offload,
                         "offload_policy": engine.offload_policy, "fsdp_size": engine.fsdp_size,
                         "reshard_after_forward": engine.reshard_after_forward,
                         "forward_prefetch": engine.forward_prefetch})
        packed_key = None
        if self._packed():
            packed_key = (full_key(self.config, "use_remove_padding") if self.config.use_remove_padding
                          else "data.pad_mode=no_padding")
        self.model = prepare_role_model(model, "sft", fsdp_cfg, packed_key)
        self.sp = self._sequence_parallel(model)
        self.optimizer = build_optimizer(self.model.parameters(), self.config.optim)
        self.scheduler = build_sft_lr_scheduler(self.optimizer, self.config.optim, self.total_steps)

    def _sequence_parallel(self, model):
        """``ulysses_sequence_parallel_size`` (alias ``engine.ulysses_sequence_parallel_size``) > 1: this rank's
        :class:`~rlhf_core.workers.ulysses.SequenceParallel` (collective), else ``None``.

        Raises:
            ValueError: naming the key, for a size that does not divide the world, an unpacked run
                (``use_remove_padding`` and ``data.pad_mode=no_padding`` both off) or heads it cannot split."""
        size = int(self.config.ulysses_sequence_parallel_size)
        if size <= 1:
            return None
        key = full_key(self.config, "ulysses_sequence_parallel_size")
        check_sequence_parallel(model, size, key, self._packed(), full_key(self.config, "use_remove_padding"))
        return build_sequence_parallel(size, key)

    def _load_model(self):
        """The causal LM of ``model.partial_pretrain`` on CPU in ``model.fsdp_config.model_dtype``, its config from
        ``model.hf_config_path`` when set, ``model.override_config`` applied."""
        mcfg = self.config.model
        return load_causal_lm(str(mcfg.partial_pretrain), to_torch_dtype(mcfg.fsdp_config.model_dtype),
                              override_config=mcfg.override_config, trust_remote_code=bool(mcfg.trust_remote_code),
                              external_lib=mcfg.external_lib, config_path=mcfg.hf_config_path)

    def _tokenizer(self):
        """The tokenizer saved with checkpoints: ``model.tokenizer_path`` (null = ``model.partial_pretrain``)."""
        mcfg = self.config.model
        return AutoTokenizer.from_pretrained(local_path(sft_tokenizer_path(mcfg)),
                                             trust_remote_code=bool(mcfg.trust_remote_code))

    def _micro_batch_size(self) -> int:
        """Rows per micro-batch: ``data.micro_batch_size_per_gpu`` (else the deprecated global
        ``data.micro_batch_size`` ÷ the data-parallel size, world ÷ ``ulysses_sequence_parallel_size``)."""
        data = self.config.data
        if data.micro_batch_size_per_gpu is not None:
            return int(data.micro_batch_size_per_gpu)
        return max(1, int(data.micro_batch_size) // (world_size() // sp_size_of(self.sp)))

    def _packed(self) -> bool:
        """Rows packed without padding for the forward: ``use_remove_padding`` (0.6) or verl 0.9's
        ``data.pad_mode=no_padding`` (the same computation; the loss is the padded one up to rounding)."""
        return any((bool(self.config.use_remove_padding), self.config.data.pad_mode == "no_padding"))

    def _micro_batches(self, batch: Batch) -> list[Batch]:
        """Micro-batches of ``micro_batch_size_per_gpu`` rows, or by token budget under ``data.use_dynamic_bsz``
        (consecutive rows whose valid tokens stay within ``data.max_token_len_per_gpu`` × the SP size: the rows are
        the SP group's, their tokens split over it)."""
        data = self.config.data
        return micro_batches(batch, self._micro_batch_size(), bool(data.use_dynamic_bsz),
                             int(data.max_token_len_per_gpu), "data.max_token_len_per_gpu", sp_size=sp_size_of(self.sp))

    def _token_loss_sum(self, micro: Batch) -> torch.Tensor:
        """Σ over valid positions of the cross-entropy (a 0-d float32 tensor with grad); packed under
        ``use_remove_padding`` (:func:`~rlhf_core.kernels.packing.packed_next_token_ce`, the same sum), its token
        count rounded up to a multiple of ``engine.pad_to_length_bucket`` under ``engine.pad_to_length``
        (:func:`~rlhf_core.workers.pad_to_length.pad_pack_to_bucket`: dummy rows that weigh 0)."""
        dev = device()
        input_ids = micro["input_ids"].to(dev)
        if self._packed():
            mask, pos, loss_mask = (micro[k].to(dev) for k in ("attention_mask", "position_ids", "loss_mask"))
            bucket = pad_bucket_of(self.config.engine)  # engine.pad_to_length: dummy rows, loss_mask 0
            if bucket is not None:
                input_ids, mask, pos = pad_pack_to_bucket(input_ids, mask, pos, bucket)
                loss_mask = torch.cat([loss_mask, loss_mask.new_zeros((len(mask) - len(loss_mask), mask.shape[1]))])
            if self.sp is not None:  # the pack split over the SP group; the group's sum on every rank
                return ulysses_next_token_ce(self.model, input_ids, mask, pos, loss_mask, self.sp)
            return packed_next_token_ce(self.model, input_ids, mask, pos, loss_mask)
        out = self.model(input_ids=input_ids, attention_mask=micro["attention_mask"].to(dev),
                         position_ids=micro["position_ids"].to(dev), use_cache=False)
        logits = out.logits[:, :-1].float()
        labels = input_ids[:, 1:]
        mask = micro["loss_mask"][:, :-1].to(dev).float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        return (ce.view_as(mask) * mask).sum()

    # ---- steps -----------------------------------------------------------------------------------
    @profiled_stage("train_step")
    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer update on this rank's shard (:func:`run_update`: one mini-batch, one epoch); returns
        ``train/loss`` (global token-mean), ``train/lr`` (before the scheduler step), ``train/grad_norm``,
        ``train/skipped_steps`` (1 when a non-finite grad norm skipped the update)."""
        lr = self.optimizer.param_groups[0]["lr"]
        data = self.config.data
        batch = gather_rows(batch, self.sp)  # an SP group's ranks train on the group's rows
        schedule = UpdateSchedule(ppo_epochs=1, mini_batch_size=len(batch), micro_batch_size=self._micro_batch_size(),
                                  grad_clip=self.config.optim.clip_grad, use_dynamic_bsz=bool(data.use_dynamic_bsz),
                                  max_token_len=int(data.max_token_len_per_gpu),
                                  max_token_len_key="data.max_token_len_per_gpu",
                                  activation_offload=bool(self.config.model.enable_activation_offload),
                                  no_sync=bool(self.config.engine.use_no_sync_for_gradient_accumulation),
                                  sp_size=sp_size_of(self.sp))

        def micro_loss(micro: Batch, n_tokens: float, _n_seqs: float) -> tuple[torch.Tensor, dict[str, float]]:
            contribution = self._token_loss_sum(micro) / max(n_tokens, 1.0)
            return contribution, {"train/loss": float(contribution.detach())}

        metrics = run_update("train", self.model, self.optimizer, batch, schedule, micro_loss,
                             count_mask=_loss_mask)
        self.scheduler.step()
        return {**metrics, "train/lr": lr}

    @torch.no_grad()
    def eval_step(self, batch: Batch) -> dict[str, float]:
        """``val/loss``: token-mean cross-entropy over the whole (global) batch; no update."""
        self.model.eval()
        batch = gather_rows(batch, self.sp)
        copies = sp_size_of(self.sp)  # each row is held by the SP group's ranks
        n_tokens, _ = global_counts(_loss_mask(batch), copies)
        total = sum(float(self._token_loss_sum(m)) for m in self._micro_batches(batch))
        return {"val/loss": all_reduce_sum({"val/loss": total}, copies)["val/loss"] / max(n_tokens, 1.0)}

    # ---- checkpoints -----------------------------------------------------------------------------
    def _ckpt(self):
        """The shared FSDP checkpoint manager (DCP model/optimizer shards, extra = scheduler + RNG, huggingface/)."""
        if getattr(self, "_ckpt_mgr", None) is None:
            ck = self.config.trainer.checkpoint
            save, load = list(ck.save_contents), ck.load_contents
            tok = self._tokenizer()
            hf_config = getattr(getattr(self.model, "base_model", self.model), "config", None)
            self._ckpt_mgr = FSDPCheckpointManager(self.model, self.optimizer, self.scheduler, tok, hf_config,
                                                   save_contents=save, load_contents=list(load) if load else None)
        return self._ckpt_mgr

    def save_checkpoint(self, local_path: str) -> str:
        """Collective: every rank writes its shards under ``local_path`` (``model/``, ``optim/``, extra, huggingface/)."""
        return self._ckpt().save(local_path)

    def load_checkpoint(self, local_path: str) -> None:
        self._ckpt().load(local_path)

    def save_hf_model(self, out_dir: str) -> str | None:
        """Rank 0 writes a plain Hugging Face directory (config, tokenizer, full weights; LoRA merged)."""
        state = full_state_dict(self.model, rank0_only=True)
        if rank() != 0:
            return None
        model = lora_from_config(self._load_model(), self.config.model)
        model.load_state_dict({k: v.cpu() for k, v in state.items()}, strict=True)
        model = merge_lora(model)
        model.save_pretrained(out_dir)
        self._tokenizer().save_pretrained(out_dir)
        return out_dir


def sft_tokenizer_path(model_cfg: Any) -> str:
    """SFT's tokenizer folder: ``model.tokenizer_path`` when set (verl 0.9's engine SFT), else
    ``model.partial_pretrain``."""
    return str(model_cfg.partial_pretrain if model_cfg.tokenizer_path is None else model_cfg.tokenizer_path)


def _loss_mask(batch: Batch) -> torch.Tensor:
    """``loss_mask[:, :-1]`` ``(B, L-1)``: the positions whose next token is trained on."""
    return batch["loss_mask"][:, :-1]
