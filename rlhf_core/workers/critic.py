"""Data-parallel PPO critic (verl ``DataParallelPPOCritic``): values and the clipped value-loss update.

The model is a token-classification LM with one label (``load_value_model``); the value of response token ``t``
is read at position ``P + t − 1`` like the actor's log-probs, and masked by ``response_mask`` (as verl).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Mapping

import torch
from torch import nn

from rlhf_core.algos.policy_loss import compute_value_loss
from rlhf_core.protocol import Batch
from rlhf_core.workers import batching
from rlhf_core.workers.actor import forward_response_logits
from rlhf_core.workers.fsdp_utils import activation_offload, clip_grad_norm, device, world_size

logger = logging.getLogger(__name__)


class DataParallelPPOCritic:
    """Value forward and update on one rank.

    Args:
        config: the ``critic`` section.
        model: the (FSDP2-wrapped) value model.
        optimizer: its optimizer.
        mini_batch_size: sequences per mini-batch on this rank (``ppo_mini_batch_size × n ÷ world``).
        micro_batch_size: sequences per micro-batch on this rank (``ppo_micro_batch_size_per_gpu``).
        activation_offload: ``critic.model.enable_activation_offload``: the training forward runs under
            ``save_on_cpu(pin_memory=True)`` on CUDA (a no-op on CPU).
    """

    def __init__(self, config: Mapping[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer,
                 mini_batch_size: int, micro_batch_size: int | None, activation_offload: bool = False) -> None:
        self.config = config
        self.activation_offload = bool(activation_offload)
        self.model = model
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.micro_batch_size = micro_batch_size
        self.update_calls = 0
        self.use_remove_padding = False  # critic.model.use_remove_padding, set by the worker (workers/packing.py)

    def _values(self, mb: Batch) -> torch.Tensor:
        T = mb["responses"].shape[-1]
        return forward_response_logits(self.model, mb, T, self.use_remove_padding)[..., 0].float()

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """``values (B, T)`` float32 on CPU, zero outside ``response_mask``; micro-batched by
        ``forward_micro_batch_size_per_gpu`` (or dynamic by ``forward_max_token_len_per_gpu``)."""
        cfg = self.config
        self.model.eval()
        out = []
        for mb in batching.micro_batches(batch, cfg.get("forward_micro_batch_size_per_gpu") or self.micro_batch_size,
                                         bool(cfg.get("use_dynamic_bsz", False)),
                                         cfg.get("forward_max_token_len_per_gpu") or cfg.get("ppo_max_token_len_per_gpu"),
                                         "forward_max_token_len_per_gpu"):
            out.append(self._values(mb).cpu() * mb["response_mask"].float())
        return torch.cat(out)

    def update_critic(self, batch: Batch) -> dict[str, float]:
        """PPO epochs of clipped value regression onto ``returns``; one optimizer step per mini-batch.

        Needs ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``, ``response_mask``, ``values``,
        ``returns``. Returns ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean`` (masked token mean),
        ``critic/grad_norm``, ``critic/skipped_steps``, averaged over mini-batches and identical on every rank."""
        cfg = self.config
        mode = cfg.get("loss_agg_mode", "token-mean")
        cliprange = cfg.get("cliprange_value", 0.5)
        W = world_size()
        seed = cfg.get("data_loader_seed")
        seed = 0 if seed is None else int(seed)
        dev = device()
        self.model.train()
        history: dict[str, list[float]] = {}
        for epoch in range(int(cfg.get("ppo_epochs", 1))):
            for mini in batching.mini_batches(batch, self.mini_batch_size, epoch, bool(cfg.get("shuffle", False)),
                                              seed, self.update_calls):
                n_tok, n_seq = batching.global_counts(mini["response_mask"])
                self.optimizer.zero_grad(set_to_none=True)
                sums: dict[str, float] = {}
                for mb in batching.micro_batches(mini, self.micro_batch_size, bool(cfg.get("use_dynamic_bsz", False)),
                                                 cfg.get("ppo_max_token_len_per_gpu"), "ppo_max_token_len_per_gpu"):
                    mask = mb["response_mask"].to(dev)
                    with activation_offload(self.activation_offload):
                        vpreds = self._values(mb)
                    loss, clipfrac = compute_value_loss(
                        vpreds, mb["returns"].to(dev), mb["values"].to(dev), mask,
                        None if cliprange is None else float(cliprange), mode, global_tokens=n_tok, global_seqs=n_seq)
                    (loss * W).backward()
                    share = float(mask.sum()) / max(n_tok, 1e-8)
                    m = {"critic/vf_loss": float(loss.detach()), "critic/vf_clipfrac": float(clipfrac) * share,
                         "critic/vpred_mean": float((vpreds.detach() * mask).sum()) / max(n_tok, 1e-8)}
                    for k, v in m.items():
                        sums[k] = sums.get(k, 0.0) + v
                mini_metrics = batching.all_reduce_sum(sums)
                grad_norm = clip_grad_norm(self.model, cfg.get("grad_clip"))
                stepped = math.isfinite(grad_norm)
                if stepped:
                    self.optimizer.step()
                else:
                    logger.warning("critic: grad norm is %s; skipping this optimizer step", grad_norm)
                self.optimizer.zero_grad(set_to_none=True)
                mini_metrics["critic/grad_norm"] = grad_norm
                mini_metrics["critic/skipped_steps"] = 0.0 if stepped else 1.0
                for k, v in mini_metrics.items():
                    history.setdefault(k, []).append(v)
        self.update_calls += 1
        out = {k: sum(v) / len(v) for k, v in history.items()}
        out["critic/skipped_steps"] = sum(history.get("critic/skipped_steps", [0.0]))
        return out
