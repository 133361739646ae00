"""Data-parallel PPO critic (verl ``DataParallelPPOCritic``): values and the clipped value-loss update.

The model is a token-classification LM with one label (``load_value_model``); the value of response token ``t``
is read at position ``P + t − 1`` like the actor's log-probs, and masked by ``response_mask`` (as verl).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from rlhf_core.algos.policy_loss import compute_value_loss
from rlhf_core.workers.ulysses import gather_rows, own_rows, sp_size_of
from rlhf_core.protocol import Batch
from rlhf_core.workers import batching
from rlhf_core.workers.actor import choose_response_forward, forward_response_logits, pad_bucket_of
from rlhf_core.workers.fsdp_utils import device
from rlhf_core.workers.update_loop import UpdateSchedule, run_update


class DataParallelPPOCritic:
    """Value forward and update on one rank.

    Args:
        config: the ``critic`` section.
        model: the (FSDP2-wrapped) value model.
        optimizer: its optimizer.
        mini_batch_size: sequences per mini-batch on this rank (``ppo_mini_batch_size × n ÷ (world ÷ sp)``).
        micro_batch_size: sequences per micro-batch on this rank (``ppo_micro_batch_size_per_gpu``).
        activation_offload: ``critic.model.enable_activation_offload``: the training forward runs under
            ``save_on_cpu(pin_memory=True)`` on CUDA (a no-op on CPU).
        sp: ``critic.ulysses_sequence_parallel_size`` > 1: the :class:`~rlhf_core.workers.ulysses.SequenceParallel`
            (each call gathers the SP group's rows, the packed forward is split over it, outputs are this rank's).
    """

    def __init__(self, config: Mapping[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer,
                 mini_batch_size: int, micro_batch_size: int | None, activation_offload: bool = False,
                 use_remove_padding: bool = False, sp: Any = None) -> None:
        self.config = config
        self.sp = sp  # critic.ulysses_sequence_parallel_size > 1: this rank's SequenceParallel
        self.activation_offload = bool(activation_offload)
        self.model = model
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.micro_batch_size = micro_batch_size
        self.update_calls = 0
        self.use_remove_padding = use_remove_padding  # critic.model.use_remove_padding; chooses the forward path

    @property
    def use_remove_padding(self) -> bool:
        """``critic.model.use_remove_padding``: the value forward runs packed. Setting it chooses the model's
        :class:`~rlhf_core.workers.actor.ResponseForward` again, once."""
        return self._use_remove_padding

    @use_remove_padding.setter
    def use_remove_padding(self, value: bool) -> None:
        self._use_remove_padding = bool(value)
        self._path = choose_response_forward(self.model, self._use_remove_padding, pad_bucket_of(self.config.fsdp),
                                             sp=self.sp)

    def _values(self, mb: Batch) -> torch.Tensor:
        T = mb["responses"].shape[-1]
        return forward_response_logits(self.model, mb, T, path=self._path)[..., 0].float()

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """``values (B, T)`` float32 on CPU, zero outside ``response_mask``; micro-batched by
        ``forward_micro_batch_size_per_gpu`` (or dynamic by ``forward_max_token_len_per_gpu``)."""
        cfg = self.config
        self.model.eval()
        batch = gather_rows(batch, self.sp)
        out = []
        fwd = cfg.forward_micro_batch_size_per_gpu  # null: the update's micro-batch size per rank
        for mb in batching.micro_batches(batch, self.micro_batch_size if fwd is None else fwd,
                                         bool(cfg.use_dynamic_bsz), cfg.forward_max_token_len_per_gpu,
                                         "forward_max_token_len_per_gpu", sp_size=sp_size_of(self.sp)):
            out.append(self._values(mb).cpu() * mb["response_mask"].float())
        return own_rows(torch.cat(out), self.sp)

    def update_critic(self, batch: Batch) -> dict[str, float]:
        """PPO epochs of clipped value regression onto ``returns``; one optimizer step per mini-batch.

        Needs ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``, ``response_mask``, ``values``,
        ``returns``. Returns ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean`` (masked token mean),
        ``critic/grad_norm``, ``critic/skipped_steps``, averaged over mini-batches and identical on every rank
        (:func:`run_update` with :meth:`_micro_loss`)."""
        cfg = self.config
        batch = gather_rows(batch, self.sp)
        schedule = UpdateSchedule(
            ppo_epochs=int(cfg.ppo_epochs), mini_batch_size=self.mini_batch_size,
            micro_batch_size=self.micro_batch_size, use_dynamic_bsz=bool(cfg.use_dynamic_bsz),
            max_token_len=cfg.ppo_max_token_len_per_gpu, shuffle=bool(cfg.shuffle),
            seed=int(cfg.data_loader_seed),  # verl 0.9 critic.data_loader_seed (42)
            grad_clip=cfg.grad_clip, activation_offload=self.activation_offload,
            no_sync=bool(cfg.fsdp.use_no_sync_for_gradient_accumulation),
            sp_size=1 if self.sp is None else self.sp.size)
        out = run_update("critic", self.model, self.optimizer, batch, schedule, self._micro_loss, self.update_calls)
        self.update_calls += 1
        return out

    def _micro_loss(self, mb: Batch, n_tok: float, n_seq: float) -> tuple[torch.Tensor, dict[str, float]]:
        """This micro-batch's share of the mini-batch's clipped value loss (``compute_value_loss`` with the global
        counts) and its metric contributions (the :data:`~rlhf_core.workers.update_loop.MicroLoss` of the critic)."""
        cfg = self.config
        mask = mb["response_mask"].to(device())
        vpreds = self._values(mb)
        cliprange = cfg.cliprange_value
        loss, clipfrac = compute_value_loss(
            vpreds, mb["returns"].to(mask.device), mb["values"].to(mask.device), mask,
            None if cliprange is None else float(cliprange), cfg.loss_agg_mode, global_tokens=n_tok,
            global_seqs=n_seq,
            loss_scale_factor=None if cfg.loss_scale_factor is None else float(cfg.loss_scale_factor))
        share = float(mask.sum()) / max(n_tok, 1e-8)  # token share: turns micro-batch means into mini-batch means
        return loss, {"critic/vf_loss": float(loss.detach()), "critic/vf_clipfrac": float(clipfrac) * share,
                      "critic/vpred_mean": float((vpreds.detach() * mask).sum()) / max(n_tok, 1e-8)}
