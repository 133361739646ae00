"""The one update loop behind the actor, the critic and SFT (verl ``dp_actor``/``dp_critic`` update skeleton).

For each epoch, for each mini-batch of this rank's shard (reshuffled per epoch when ``shuffle``):

1. count the mini-batch's valid tokens and sequences over all ranks (``global_counts`` of ``count_mask``);
2. for each micro-batch: ``loss, metrics = micro_loss(micro_batch, n_tokens, n_seqs)``; backward ``loss × W``
   (FSDP averages gradients over the ``W`` ranks; the global-count aggregation wants their sum);
3. sum the micro-batch metrics over micro-batches and ranks;
4. clip the global gradient norm to ``grad_clip``; a non-finite norm skips the optimizer step (logged, counted);
5. optimizer step, zero the gradients; record the mini-batch's metrics; advance a torch profiler schedule
   (``profiler.tool_config.torch.schedule``, :func:`rlhf_core.workers.torch_trace.mini_batch_done`).

Returned metrics are the mean over mini-batches (identical on every rank), except ``<role>/skipped_steps``,
which is their sum, and the extrema of :data:`~rlhf_core.algos.distillation.EXTREMA` (``distillation/loss_min``...),
reduced by their min or max over micro-batches, ranks and mini-batches instead of summed and averaged. ``micro_loss`` returns the micro-batch's *contribution* to the mini-batch loss (terms
aggregated with the global counts) and metric contributions that sum to mini-batch values, so the update and
the metrics do not depend on the micro-batch split or the number of ranks.
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from rlhf_core.algos.distillation import EXTREMA
from rlhf_core.protocol import Batch
from rlhf_core.workers import batching
from rlhf_core.workers.torch_trace import mini_batch_done
from rlhf_core.workers.fsdp_utils import activation_offload, clip_grad_norm, world_size

logger = logging.getLogger(__name__)

MicroLoss = Callable[[Batch, float, float], tuple[torch.Tensor, dict[str, float]]]
"""``micro_loss(micro_batch, n_tokens, n_seqs) -> (loss 0-d tensor with grad, {metric: contribution})``."""


@dataclass(frozen=True)
class UpdateSchedule:
    """How one update call walks its data (unpacked from the role's config by the caller).

    Args:
        ppo_epochs: passes over the shard (1 for SFT).
        mini_batch_size: rows per optimizer step on this rank (``len(batch)`` for one step over the shard).
        micro_batch_size: rows per forward/backward (ignored with ``use_dynamic_bsz``).
        use_dynamic_bsz: pack micro-batches by ``max_token_len`` valid tokens instead.
        max_token_len: the token budget per micro-batch; ``max_token_len_key`` names its key in errors.
        shuffle: reshuffle mini-batches every epoch, seeded by ``seed``, the call index and the epoch.
        grad_clip: max global grad L2 norm (``None`` or ≤ 0: no clipping).
        activation_offload: run each micro-batch loss under ``save_on_cpu`` on CUDA.
        no_sync: ``use_no_sync_for_gradient_accumulation``: an FSDP2 model skips the gradient reduce-scatter on
            every micro-batch's backward but the mini-batch's last (``set_requires_gradient_sync(False)``, as verl
            0.9's engine): the unsharded gradients accumulate locally and are reduced once; the same update, less
            communication, more memory held.
        sp_size: ``ulysses_sequence_parallel_size``: each row is held by this many ranks (one SP group), so the
            global counts and the metric sums over all ranks are divided by it (rlhf_core/workers/ulysses.py), and
            ``max_token_len`` is multiplied by it (the micro-batch's tokens are split over the group, as in verl).
        keep_uids: ``actor.use_prefix_grouper``: token-budget micro-batches avoid cutting a run of one ``uid``
            (:func:`~rlhf_core.workers.batching.token_budget_partition`); the results do not depend on it.
    """

    ppo_epochs: int
    mini_batch_size: int
    micro_batch_size: int | None
    use_dynamic_bsz: bool = False
    max_token_len: int | None = None
    max_token_len_key: str = "ppo_max_token_len_per_gpu"
    shuffle: bool = False
    seed: int = 0
    grad_clip: float | None = None
    activation_offload: bool = False
    no_sync: bool = False
    sp_size: int = 1
    keep_uids: bool = False


@contextlib.contextmanager
def _gradient_sync(model: nn.Module, sync: bool):
    """FSDP2's gradient reduction off for one backward when not ``sync`` (only an ``FSDPModule`` has it)."""
    if sync or not isinstance(model, FSDPModule):
        yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def all_reduce_extrema(values: dict[str, float]) -> dict[str, float]:
    """Each of ``values`` (keys of :data:`~rlhf_core.algos.distillation.EXTREMA`, the same on every rank) reduced
    over all ranks by its min or max (verl ``AggregationType.MIN``/``MAX``)."""
    import torch.distributed as dist

    out = {}
    for red, op in ((min, dist.ReduceOp.MIN), (max, dist.ReduceOp.MAX)):
        keys = sorted(k for k in values if EXTREMA[k] is red)
        if keys:
            out.update(zip(keys, batching._all_reduce([values[k] for k in keys], torch.float64, op)))
    return out


def response_mask(batch: Batch) -> torch.Tensor:
    """The default ``count_mask``: ``response_mask (B, T)``."""
    return batch["response_mask"]


def run_update(role: str, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch,
               schedule: UpdateSchedule, micro_loss: MicroLoss, call_index: int = 0,
               count_mask: Callable[[Batch], torch.Tensor] = response_mask) -> dict[str, float]:
    """Run the update described in the module docstring; returns ``{"<role>/…": float}`` metrics with
    ``<role>/grad_norm`` (before clipping) and ``<role>/skipped_steps`` added to ``micro_loss``'s.

    Raises:
        ValueError: from the batching (non-positive sizes, a row longer than the token budget).
    """
    W = world_size()
    model.train()
    history: dict[str, list[float]] = {}
    for epoch in range(int(schedule.ppo_epochs)):
        for mini in batching.mini_batches(batch, schedule.mini_batch_size, epoch, schedule.shuffle, schedule.seed,
                                          call_index):
            n_tok, n_seq = batching.global_counts(count_mask(mini), schedule.sp_size)
            optimizer.zero_grad(set_to_none=True)
            sums: dict[str, float] = {}
            micros = batching.micro_batches(mini, schedule.micro_batch_size, schedule.use_dynamic_bsz,
                                            schedule.max_token_len, schedule.max_token_len_key, schedule.keep_uids,
                                            schedule.sp_size)
            for i, mb in enumerate(micros):
                with _gradient_sync(model, not schedule.no_sync or i == len(micros) - 1):
                    with activation_offload(schedule.activation_offload):
                        loss, metrics = micro_loss(mb, n_tok, n_seq)
                    (loss * W).backward()
                for k, v in metrics.items():
                    sums[k] = EXTREMA[k](sums[k], v) if k in EXTREMA and k in sums else sums.get(k, 0.0) + v
            mini_metrics = batching.all_reduce_sum({k: v for k, v in sums.items() if k not in EXTREMA},
                                                   schedule.sp_size)
            mini_metrics.update(all_reduce_extrema({k: v for k, v in sums.items() if k in EXTREMA}))
            grad_norm = clip_grad_norm(model, schedule.grad_clip)
            stepped = math.isfinite(grad_norm)
            if stepped:
                optimizer.step()
            else:
                logger.warning("%s: grad norm is %s; skipping this optimizer step", role, grad_norm)
            optimizer.zero_grad(set_to_none=True)
            mini_metrics[f"{role}/grad_norm"] = grad_norm
            mini_metrics[f"{role}/skipped_steps"] = 0.0 if stepped else 1.0
            for k, v in mini_metrics.items():
                history.setdefault(k, []).append(v)
            mini_batch_done()  # advances a profiler schedule over mini-batches (a no-op when none runs)
    out = {k: EXTREMA[k](v) if k in EXTREMA else sum(v) / len(v) for k, v in history.items()}
    out[f"{role}/skipped_steps"] = sum(history.get(f"{role}/skipped_steps", [0.0]))
    return out
