"""Ulysses sequence parallelism (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509; verl's
``verl/utils/ulysses.py``): the ``*.ulysses_sequence_parallel_size`` keys.

The world's ``W`` ranks form a ``(dp, sp)`` mesh, ``dp = W / sp``, each SP group ``sp`` consecutive ranks (verl's
``ulysses_device_mesh``). Every rank of an SP group works on the same rows: a worker method gathers its group's
shards (:func:`gather_rows`), runs, and keeps its own share of a per-row output (:func:`own_rows`), as verl's
``FSDPUlyssesShardingManager`` does. Inside the forward, a micro-batch's valid tokens are packed into one row
(``use_remove_padding``, :mod:`rlhf_core.kernels.packing`), padded to a multiple of ``sp`` and cut into ``sp``
equal slices; rank ``r`` of the group runs slice ``r`` through the embeddings, projections, MLPs and the head. In
each attention layer an all-to-all turns ``(slice of the tokens, all heads)`` into ``(all tokens, 1/sp of the
heads)`` (:func:`seq_to_heads`), attention runs per sequence over the whole pack, and a second all-to-all turns
the output back (:func:`heads_to_seq`). The logits of the wanted positions are then gathered
(:func:`gather_kept`), so every rank of the group holds the same ``(b, T, V)`` logits as one rank would, and
computes the same loss from them. Only the slice's own share of the gradient flows back from each rank
(no scaling): summed over the group, as FSDP's reduction sums before it divides by ``W``, it is the gradient of
the loss; the update loop multiplies every rank's loss by ``W`` and divides the global token counts and metric
sums by ``sp`` (every row is counted on ``sp`` ranks), so the update equals the ``sp = 1`` one.

The all-to-alls are ``torch.distributed.all_to_all_single``, which gloo runs on CPU.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlhf_core.config.sequence_parallel import role_sp_size

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class SequenceParallel:
    """One rank's place in the ``(dp, sp)`` mesh.

    Attributes:
        size: ranks per SP group (``ulysses_sequence_parallel_size``); rank: this rank's index in its group.
        group: the SP group's process group (``None`` only when ``size`` is 1).
        dp_size: the number of SP groups (``W / size``).
    """
    size: int
    rank: int
    group: Any
    dp_size: int

    def attend(self, inner, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask, *args, **kwargs):
        """:func:`ulysses_attention` over this group: the packed attention
        (:func:`~rlhf_core.kernels.packing.varlen_sdpa`) calls it on the object it is handed, so the kernels,
        which sit below the workers, import nothing of this module."""
        return ulysses_attention(inner, module, query, key, value, attention_mask, *args, sp=self, **kwargs)


def build_sequence_parallel(size: int, key: str) -> SequenceParallel | None:
    """The SP group of this rank for ``key`` = ``size`` (``None`` for size 1: no sequence parallelism).

    Collective: every rank calls it with the same ``size`` (``torch.distributed.new_group`` for every group).

    Raises:
        ValueError: naming ``key`` when ``size`` < 1, or does not divide the world size (or there is one rank).
    """
    size = int(size)
    if size < 1:
        raise ValueError(f"{key}={size} must be at least 1")
    if size == 1:
        return None
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world % size:
        raise ValueError(f"{key}={size} must divide the world size {world} (trainer.nnodes × trainer.n_gpus_per_node)")
    me = dist.get_rank()
    mine = None
    for start in range(0, world, size):  # every rank creates every group, in the same order
        g = dist.new_group(list(range(start, start + size)))
        if start <= me < start + size:
            mine = g
    return SequenceParallel(size=size, rank=me % size, group=mine, dp_size=world // size)


def check_sequence_parallel(model: nn.Module, size: int, key: str, remove_padding: bool,
                            remove_padding_key: str) -> None:
    """Refuse a model and settings that Ulysses cannot split (verl's ``validate_ulysses_config`` and its
    ``use_remove_padding`` check), before any data runs.

    Raises:
        ValueError: naming ``key`` and the values: ``use_remove_padding`` off; attention heads or key/value heads
            not divisible by ``size``; a model that does not attend per sequence in a pack through the ``sdpa``
            entry (:func:`~rlhf_core.kernels.packing.supports_varlen_attention`).
    """
    if size <= 1:
        return
    if not remove_padding:
        raise ValueError(f"{key}={size} needs {remove_padding_key}=True (the sequence is split as one packed row, "
                         "as verl requires)")
    from rlhf_core.kernels.packing import supports_varlen_attention

    config = model.config  # a peft wrapper forwards it from its base model
    heads = int(config.num_attention_heads)
    kv = heads  # a model without grouped-query attention has as many key/value heads as heads
    if hasattr(config, "num_key_value_heads") and config.num_key_value_heads is not None:
        kv = int(config.num_key_value_heads)
    if heads % size:
        raise ValueError(f"{key}={size} must divide the model's num_attention_heads={heads}")
    if kv % size:
        raise ValueError(f"{key}={size} must divide the model's num_key_value_heads={kv}")
    if not supports_varlen_attention(model):
        raise ValueError(f"{key}={size}: {type(model).__name__} does not attend per sequence through the sdpa "
                         "attention (a Llama-form decoder, attn_implementation='sdpa', full attention in every layer)")


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Split ``x`` in ``n`` equal chunks along ``scatter_dim``, send chunk ``j`` to group rank ``j``, and
    concatenate the ``n`` chunks received (from rank 0 first) along ``gather_dim``."""
    n = dist.get_world_size(group)
    chunks = torch.stack(torch.tensor_split(x, n, dim=scatter_dim))  # (n, ...chunk)
    out = torch.empty_like(chunks)
    dist.all_to_all_single(out, chunks.contiguous(), group=group)
    return torch.cat(out.unbind(0), dim=gather_dim)


class _SeqAllToAll(torch.autograd.Function):
    """:func:`_all_to_all` with its inverse (the same exchange, dims swapped) as the backward."""

    @staticmethod
    def forward(ctx, x, scatter_dim: int, gather_dim: int, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def seq_to_heads(x: torch.Tensor, group, seq_dim: int = 2, head_dim: int = 1) -> torch.Tensor:
    """``(1, H, n/sp, d)`` (this rank's token slice, every head) → ``(1, H/sp, n, d)`` (every token, this rank's
    heads: rank ``r`` gets heads ``r·H/sp … (r+1)·H/sp − 1``). Differentiable. Needs ``H`` divisible by ``sp``."""
    return _SeqAllToAll.apply(x, head_dim, seq_dim, group)


def heads_to_seq(x: torch.Tensor, group, seq_dim: int = 1, head_dim: int = 2) -> torch.Tensor:
    """The inverse of :func:`seq_to_heads` for an attention output ``(1, n, H/sp, d)`` → ``(1, n/sp, H, d)``."""
    return _SeqAllToAll.apply(x, seq_dim, head_dim, group)


def ulysses_attention(inner, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask, *args, sp: SequenceParallel, **kwargs):
    """Attention over a token slice per rank: ``query (1, H, n/sp, d)``, ``key``/``value (1, KV, n/sp, d)`` are
    all-to-all'ed to ``(1, H/sp, n, d)``/``(1, KV/sp, n, d)``, ``inner`` (the per-sequence packed attention,
    :func:`~rlhf_core.kernels.packing.varlen_sdpa`, whose layout covers all ``n`` tokens) runs on this rank's
    heads, and its output ``(1, n, H/sp, d)`` goes back to ``(1, n/sp, H, d)``. Returns ``(output, None)``."""
    q, k, v = (seq_to_heads(t, sp.group) for t in (query, key, value))
    out, _ = inner(module, q, k, v, attention_mask, *args, **kwargs)
    return heads_to_seq(out, sp.group), None


class _GatherKept(torch.autograd.Function):
    """All-gather of per-rank row blocks of different lengths ``counts`` along dim 0; the backward returns each
    rank its own block's gradient (unscaled: see the module docstring)."""

    @staticmethod
    def forward(ctx, x, counts: list[int], sp: SequenceParallel):
        ctx.counts, ctx.rank = counts, sp.rank
        top = max(counts)
        padded = x.new_zeros((top, *x.shape[1:]))
        padded[: x.shape[0]] = x
        out = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(out, padded.contiguous(), group=sp.group)
        return torch.cat([o[:c] for o, c in zip(out, counts)])

    @staticmethod
    def backward(ctx, grad):
        start = sum(ctx.counts[: ctx.rank])
        return grad[start:start + ctx.counts[ctx.rank]], None, None


def gather_kept(x: torch.Tensor, counts: list[int], sp: SequenceParallel) -> torch.Tensor:
    """``x (counts[rank], ...)`` of every rank of the group concatenated in rank order: ``(Σ counts, ...)``."""
    return _GatherKept.apply(x, list(counts), sp)


@dataclass(frozen=True)
class SplitPack:
    """A micro-batch packed (:func:`~rlhf_core.kernels.packing.pack_inputs`), padded to a multiple of ``sp`` and
    laid out for per-sequence attention over the whole pack.

    Attributes:
        ids, pos: ``(1, n + pad)`` packed ids and positions (padding: id 0, positions from 0: a sequence of its own
            that nothing reads, as verl's ``ulysses_pad``); index: ``(n,)`` the valid tokens' flat positions in
            ``(b, L)``; layout: the :class:`~rlhf_core.kernels.packing.VarlenLayout` of all ``n + pad`` tokens;
        n: valid tokens; lo, hi: this rank's token slice ``[lo, hi)``, ``m = hi - lo = (n + pad) / sp``.
    """
    ids: torch.Tensor
    pos: torch.Tensor
    index: torch.Tensor
    layout: Any
    n: int
    lo: int
    hi: int

    def forward(self, model: nn.Module, sp: SequenceParallel, **extra):
        """``model`` on this rank's slice (its attention through :func:`ulysses_attention`)."""
        from rlhf_core.kernels.packing import LAYOUT_KWARG, ULYSSES_KWARG

        placeholder = torch.ones((1, 1, 0, 0), dtype=torch.bool, device=self.ids.device)
        return model(input_ids=self.ids[:, self.lo:self.hi], position_ids=self.pos[:, self.lo:self.hi],
                     attention_mask=placeholder, use_cache=False, **extra,
                     **{LAYOUT_KWARG: self.layout, ULYSSES_KWARG: sp})


def split_pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
               sp: SequenceParallel) -> SplitPack:
    """The :class:`SplitPack` of a padded ``(b, L)`` micro-batch for this rank.

    Raises:
        ValueError: from :func:`~rlhf_core.kernels.packing.pack_inputs`."""
    from rlhf_core.kernels import require_installed
    from rlhf_core.kernels.packing import VarlenLayout, pack_inputs

    require_installed("a sequence-parallel forward")
    ids, pos, index = pack_inputs(input_ids, attention_mask, position_ids)
    b, L = input_ids.shape
    n = ids.shape[1]
    pad = (-n) % sp.size
    rows = torch.div(index, L, rounding_mode="floor")
    if pad:
        ids = torch.cat([ids, ids.new_zeros((1, pad))], dim=1)
        pos = torch.cat([pos, torch.arange(pad, dtype=pos.dtype, device=pos.device)[None]], dim=1)
        rows = torch.cat([rows, rows.new_full((pad,), b)])
    p = pos[0].long()
    max_len = int(p.max()) + 1
    dst = rows * max_len + p
    src = torch.zeros((b + 1) * max_len, dtype=torch.long, device=ids.device)
    src[dst] = torch.arange(n + pad, device=ids.device)
    m = (n + pad) // sp.size
    return SplitPack(ids, pos, index, VarlenLayout(src, dst, b + 1, max_len), n, sp.rank * m, (sp.rank + 1) * m)


def ulysses_packed_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          position_ids: torch.Tensor, sp: SequenceParallel,
                          keep_last: int | None = None) -> torch.Tensor:
    """:func:`~rlhf_core.kernels.packing.packed_logits` with the pack split over the SP group (:func:`split_pack`):
    the same ``(b, L, V)`` (or ``(b, keep_last, V)``) logits on every rank of the group, 0 at pads. With
    ``keep_last`` the head runs on this rank's wanted positions only (``logits_to_keep``); without it every
    position's output is kept (a value head, which takes no ``logits_to_keep``), the padding tokens' dropped.

    Raises:
        ValueError: from :func:`~rlhf_core.kernels.packing.pack_inputs`; ``keep_last`` < 1."""
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"ulysses_packed_logits: keep_last={keep_last} must be at least 1 (or None)")
    pack = split_pack(input_ids, attention_mask, position_ids, sp)
    b, L = input_ids.shape
    index, lo, hi = pack.index, pack.lo, pack.hi
    kept = ((index % L >= L - keep_last).nonzero(as_tuple=True)[0] if keep_last
            else torch.arange(pack.n, device=index.device))
    m = hi - lo
    counts = [int(((kept >= r * m) & (kept < (r + 1) * m)).sum()) for r in range(sp.size)]
    local_kept = kept[(kept >= lo) & (kept < hi)] - lo
    out = pack.forward(model, sp, **({} if keep_last is None else {"logits_to_keep": local_kept}))
    local = out.logits[0] if keep_last is not None else out.logits[0][local_kept]
    logits = gather_kept(local, counts, sp)  # (len(kept), V) in pack order
    flat = index[kept]
    width = L if keep_last is None else keep_last
    start = L - width
    grid = logits.new_zeros((b * width, logits.shape[-1]))
    grid[(flat // L) * width + flat % L - start] = logits
    return grid.view(b, width, -1)


class _GroupSum(torch.autograd.Function):
    """All-reduce SUM over the SP group in the forward; the identity in the backward (each rank sends the gradient
    back through its own share only: see the module docstring)."""

    @staticmethod
    def forward(ctx, x, sp: SequenceParallel):
        out = x.detach().clone()
        dist.all_reduce(out, group=sp.group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def ulysses_next_token_ce(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          position_ids: torch.Tensor, loss_mask: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """:func:`~rlhf_core.kernels.packing.packed_next_token_ce` (SFT's ``Σ CE · loss_mask``) with the pack split
    over the SP group: each rank runs the cross-entropy of its own token slice (labels: each packed token's next
    token in its row; the last column and the padding weigh 0), and the group's partial sums are added
    (all-reduce): the same 0-d float32 sum on every rank, whose gradient flows back through this rank's slice.

    Raises:
        ValueError: ``loss_mask`` weights a padding position, and from :func:`split_pack`."""
    stray = (loss_mask[:, :-1] != 0) & (attention_mask[:, :-1] == 0)
    if stray.any():
        row, col = (int(v) for v in stray.nonzero()[0])
        raise ValueError(f"use_remove_padding: loss_mask is {loss_mask[row, col].item()} at row {row}, column {col}, "
                         "where attention_mask is 0 (a padding position has no logits to train)")
    pack = split_pack(input_ids, attention_mask, position_ids, sp)
    L = input_ids.shape[1]
    index = pack.index
    weight = loss_mask.float().reshape(-1)[index] * (index % L < L - 1).float()  # the last column predicts nothing
    labels = input_ids.reshape(-1)[(index + 1).clamp(max=input_ids.numel() - 1)]
    pad = pack.ids.shape[1] - pack.n
    weight, labels = torch.cat([weight, weight.new_zeros(pad)]), torch.cat([labels, labels.new_zeros(pad)])
    logits = pack.forward(model, sp).logits[0]  # (m, V): this rank's slice
    ce = torch.nn.functional.cross_entropy(logits.float(), labels[pack.lo:pack.hi], reduction="none")
    return _GroupSum.apply((ce * weight[pack.lo:pack.hi]).sum(), sp)


def gather_rows(batch, sp: SequenceParallel | None):
    """The SP group's shards of a :class:`~rlhf_core.protocol.Batch` concatenated in group-rank order (every rank
    of the group gets the same rows, as verl's ``all_gather_data_proto``); ``batch`` itself without SP.
    Collective over the group (``all_gather_object``: tensors and non-tensor columns alike)."""
    if sp is None:
        return batch
    from rlhf_core.protocol import Batch

    parts: list = [None] * sp.size
    dist.all_gather_object(parts, batch.own_storage(), group=sp.group)
    if len({len(part) for part in parts}) != 1:
        raise ValueError(f"sequence parallelism: the SP group's shards differ in rows {[len(q) for q in parts]}; "
                         "the batch must divide evenly over the world's ranks")
    return Batch.concat(parts)


def own_rows(x, sp: SequenceParallel | None):
    """This rank's share of a per-row output of the gathered rows (:func:`gather_rows`): the ``rank``-th of ``sp``
    equal chunks along dim 0 (a tensor, a Batch, or ``None``); ``x`` itself without SP."""
    if sp is None or x is None:
        return x
    if isinstance(x, torch.Tensor):
        return x.chunk(sp.size)[sp.rank]
    return x.chunk(sp.size)[sp.rank]


def sp_size_of(sp: SequenceParallel | None) -> int:
    """``sp.size``, 1 without sequence parallelism."""
    return 1 if sp is None else sp.size


def role_sequence_parallel(model: nn.Module, role_cfg: Any, fsdp_key: str, role_key: str, model_cfg: Any,
                           reuse: SequenceParallel | None = None) -> SequenceParallel | None:
    """A worker role's :class:`SequenceParallel` (``None`` for size 1): the size from :func:`role_sp_size`, checked
    against the model and ``model_cfg.use_remove_padding`` (:func:`check_sequence_parallel`), its groups built
    (collective) unless ``reuse`` (another role's, e.g. the actor's for the reference) has the same size.

    Raises:
        ValueError: from :func:`role_sp_size`, :func:`check_sequence_parallel`, :func:`build_sequence_parallel`."""
    size = role_sp_size(role_cfg, fsdp_key, role_key)
    if size <= 1:
        return None
    key = f"{role_key}.ulysses_sequence_parallel_size"
    from rlhf_core.config.structured import full_key

    check_sequence_parallel(model, size, key, bool(model_cfg.use_remove_padding),
                            full_key(model_cfg, "use_remove_padding"))
    if reuse is not None and reuse.size == size:
        return reuse
    sp = build_sequence_parallel(size, key)
    logger.info("%s=%d: rank %d is SP rank %d of %d, %d data-parallel group(s)", key, size, dist.get_rank(),
                sp.rank, sp.size, sp.dp_size)
    return sp
