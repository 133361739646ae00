"""FSDP2 helpers: wrap a Hugging Face model with ``fully_shard``, gather its full weights, clip gradients.

verl's ``apply_fsdp2``: every decoder layer (the classes in ``model._no_split_modules``, or — with
``wrap_policy.min_num_params > 0`` — every sub-module holding at least that many parameters) is
sharded on its own, then the root. ``fsdp_size`` ``-1`` (or ``>= world``) shards over all ranks;
a smaller value builds a 2-D (replicate, shard) mesh (HSDP). ``param_offload``/``optimizer_offload``
become ``CPUOffloadPolicy`` on CUDA; on CPU they are no-ops (the weights already live in host memory).

One rank (world size 1) runs the plain module, unless a mixed-precision policy or a CUDA offload policy needs
FSDP2's parameter handling (:func:`needs_fsdp2`): with nothing to shard or reduce, ``fully_shard`` only adds its
hooks' copies (about a tenth of a tiny model's update: BENCHMARKS.md, "Short prompts and small steps"). The
update is the same (tests/rlhf_core/workers/test_workers_plain_ws1.py), and its checkpoints are DCP checkpoints
that load at any world size (plain tensors are saved as one full chunk, which DCP reshards on load).
"""
from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

from rlhf_core.config.structured import full_key, role_name

from rlhf_core.workers.precision import cast_buffers, mixed_precision_policy

logger = logging.getLogger(__name__)


def device() -> torch.device:
    """This rank's device: ``cuda:<current>`` when CUDA is available, else ``cpu``."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def activation_offload(enabled: bool):
    """Context for a training forward: ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` when ``enabled`` and
    CUDA is available (``model.enable_activation_offload``): tensors saved for backward go to pinned host memory
    and come back in backward. On CPU a no-op by nature (activations already live in host memory)."""
    if enabled and torch.cuda.is_available():
        return torch.autograd.graph.save_on_cpu(pin_memory=True)
    return contextlib.nullcontext()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def mesh_shape(fsdp_size: int, ws: int, key: str = "fsdp_config.fsdp_size", role: str = "actor") -> tuple[int, ...]:
    """``(ws,)`` (plain FSDP) when ``fsdp_size`` is negative or covers the world, else ``(ws // fsdp_size,
    fsdp_size)`` (HSDP: replicate over the first dim). Raises ValueError naming the role and ``key`` when
    ``fsdp_size`` does not divide ``ws``."""
    if fsdp_size < 0 or fsdp_size >= ws:
        return (ws,)
    if fsdp_size == 0 or ws % fsdp_size:
        raise ValueError(f"{role_name(role)}: {key}={fsdp_size} must divide the world size {ws}")
    return (ws // fsdp_size, fsdp_size)


def _build_mesh(fsdp_size: int, key: str = "fsdp_config.fsdp_size", role: str = "actor"):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shape = mesh_shape(fsdp_size, world_size(), key, role)
    return init_device_mesh(dev, shape, mesh_dim_names=("fsdp",) if len(shape) == 1 else ("ddp", "fsdp"))


def _modules_to_wrap(model: nn.Module, min_num_params: int) -> list[nn.Module]:
    if min_num_params and min_num_params > 0:
        # size-based policy: the smallest sub-modules holding >= min_num_params parameters; embeddings and
        # the output head are left to the root (they may share a tied weight).
        skip = {id(model.get_input_embeddings())} if hasattr(model, "get_input_embeddings") else set()
        if hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
            skip.add(id(model.get_output_embeddings()))

        def size(m: nn.Module) -> int:
            return sum(p.numel() for p in m.parameters())

        return [m for m in model.modules()
                if m is not model and id(m) not in skip and size(m) >= min_num_params
                and not any(size(c) >= min_num_params and id(c) not in skip for c in m.children())]
    names = set(getattr(model, "_no_split_modules", None) or [])
    base = getattr(model, "base_model", None)
    if not names and base is not None:
        names = set(getattr(getattr(base, "model", base), "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def _present(cfg: Mapping[str, Any], key: str, absent: Any) -> Any:
    """``cfg[key]`` when this role's ``fsdp_config`` section has the key (its YAML value applies), else ``absent``:
    the sections differ by role in verl's YAML (the ref has no ``fsdp_size``, SFT no ``offload_policy``), and a key a
    section lacks means the feature is off for that role."""
    return cfg[key] if key in cfg else absent


def needs_fsdp2(kwargs: Mapping[str, Any], single_rank: bool = False) -> bool:
    """Whether :func:`apply_fsdp2` shards with ``fully_shard(**kwargs)``: always on several ranks, and on one rank
    only for a ``mp_policy`` (FSDP2 casts the unsharded parameters and reduces gradients in its dtypes) or an
    ``offload_policy`` (parameters in host memory between uses), or when ``single_rank`` asks for it (tests of
    FSDP2's own behaviour in one process)."""
    return world_size() > 1 or single_rank or "mp_policy" in kwargs or "offload_policy" in kwargs


def is_sharded(model: nn.Module) -> bool:
    """True for an FSDP2 module (:func:`apply_fsdp2` sharded it), False for the plain one-rank module, whose
    state dict holds the live parameters themselves."""
    return isinstance(model, FSDPModule)


def apply_fsdp2(model: nn.Module, fsdp_config: Mapping[str, Any] | None = None, role: str = "actor",
                single_rank: bool = False) -> nn.Module:
    """Shard ``model`` in place with FSDP2 and return it (moved to :func:`device`); on one rank return the plain
    module instead (moved to :func:`device`) unless :func:`needs_fsdp2` (``single_rank=True``: shard anyway).

    Honoured ``fsdp_config`` keys: ``wrap_policy.min_num_params``, ``fsdp_size``, ``param_offload``,
    ``optimizer_offload``, ``offload_policy`` (all → ``CPUOffloadPolicy`` on CUDA; a logged no-op on CPU),
    ``reshard_after_forward`` (default True), ``mixed_precision`` (``param_dtype``/``reduce_dtype``/``buffer_dtype``,
    :mod:`rlhf_core.workers.precision`), ``forward_prefetch`` (each wrapped module prefetches the next one's
    all-gather in forward: ``set_modules_to_forward_prefetch``, as verl's FSDP2 path).
    """
    cfg = fsdp_config if fsdp_config is not None else {}
    wrap = _present(cfg, "wrap_policy", {})
    offload = any(bool(_present(cfg, k, False)) for k in ("param_offload", "optimizer_offload", "offload_policy"))
    fsdp_size = _present(cfg, "fsdp_size", -1)
    kwargs: dict[str, Any] = {"mesh": _build_mesh(-1 if fsdp_size is None else int(fsdp_size),
                                                  full_key(cfg, "fsdp_size"), role),
                              "reshard_after_forward": bool(_present(cfg, "reshard_after_forward", True))}
    if offload:
        if torch.cuda.is_available():
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        else:
            logger.info("%s: param_offload/optimizer_offload requested on CPU: no-op (weights already in host memory)", role)
    mp_cfg = _present(cfg, "mixed_precision", None)  # workers/precision.py; absent or all fp32 → no policy
    policy = mixed_precision_policy(mp_cfg)
    if policy is not None:
        kwargs["mp_policy"] = policy
    cast_buffers(model, mp_cfg)
    if not torch.cuda.is_available() or not offload:
        model.to(device())
    if not needs_fsdp2(kwargs, single_rank):
        return model
    broadcast_from_rank0(model)
    wrapped = _modules_to_wrap(model, int(_present(wrap, "min_num_params", 0)))
    for module in wrapped:
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    if _present(cfg, "forward_prefetch", False):
        # verl 0.9's FSDP2 path: each wrapped module all-gathers the next one's parameters as its forward starts
        # (depth 1, FSDP1's forward_prefetch_limit); the same outputs, the next gather overlaps this compute
        for module, following in zip(wrapped, wrapped[1:]):
            module.set_modules_to_forward_prefetch([following])
    return model


@torch.no_grad()
def broadcast_from_rank0(model: nn.Module) -> None:
    """Make every rank start from rank 0's weights and buffers (FSDP1's ``sync_module_states``): randomly
    initialised parts — a critic's value head, LoRA ``A`` matrices — would otherwise differ across ranks."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    staged = dist.get_backend() == "nccl"
    for t in list(model.parameters()) + list(model.buffers()):
        if staged and t.device.type == "cpu":  # CPU-offloaded model on nccl: broadcast through the GPU
            buf = t.data.cuda()
            dist.broadcast(buf, src=0)
            t.data.copy_(buf.cpu())
        else:
            dist.broadcast(t.data, src=0)


def full_state_dict(model: nn.Module, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """The unsharded weights (HF key names) gathered from all ranks.

    With ``rank0_only=False`` every rank gets the full dict (on CPU for CPU runs, on the device on CUDA);
    with ``rank0_only=True`` rank 0 gets it on CPU and the other ranks an empty dict (see FIELD-NOTES). For the plain
    one-rank module (:func:`is_sharded` False) the values are the live parameters (detached, no copy): a caller
    that keeps them past the next update copies them."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
    return get_model_state_dict(model, options=opts)


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> float:
    """Global gradient L2 norm over all ranks (DTensor-aware); grads are clipped to ``max_norm`` when finite.

    Returns the norm before clipping as a float (``inf``/``nan`` when not finite; the caller skips the step)."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    value = float(norm)
    if math.isfinite(value) and max_norm is not None and max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return value
