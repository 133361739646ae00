"""Read a verl 0.6 FSDP actor/critic checkpoint folder into one full state dict (for ``rlhf merge``).

verl's ``FSDPCheckpointManager.save_checkpoint`` writes, per rank ``R`` of ``W``::

    model_world_size_W_rank_R.pt        torch.save(model.state_dict()) of the FSDP model on that rank
    optim_world_size_W_rank_R.pt        optimizer state (not needed to merge)
    extra_state_world_size_W_rank_R.pt  LR scheduler + RNG (not needed to merge)
    fsdp_config.json                    {"FSDP_version": 1 | 2, "world_size": W}   (rank 0)
    huggingface/                        config.json, tokenizer files, generation_config.json (rank 0)

Each ``model_*.pt`` maps HF parameter names to the rank's piece of the weight: a ``DTensor`` (FSDP2, or FSDP1's
sharded state dict) whose placements say how the pieces join — ``Shard(d)``: concatenate the ranks' local
tensors along ``d`` in rank order; ``Replicate()``: every rank holds the whole weight — or a plain tensor.
A ``("ddp", "fsdp")`` mesh (HSDP) shards over its last dimension only, so the first ``mesh.shape[-1]`` ranks
hold one full copy. This is the layout verl's own ``verl.model_merger`` (``fsdp_model_merger.py``) reads; we
differ in keeping the saved dtype (verl casts every weight to bf16) and in checking shapes against the model.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from rlhf_core.safe_load import load_state

_SHARD_RE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


def is_verl_checkpoint(local_dir: str) -> bool:
    """True when ``local_dir`` holds verl's per-rank ``model_world_size_W_rank_R.pt`` files."""
    return os.path.isdir(local_dir) and any(_SHARD_RE.match(n) for n in os.listdir(local_dir))


def verl_world_size(local_dir: str) -> int:
    """``world_size`` from ``fsdp_config.json`` (verl writes it), else from the shard file names.

    Raises:
        FileNotFoundError: the shard set for that world size is incomplete (naming the missing ranks).
        ValueError: shard files of several world sizes and no ``fsdp_config.json`` to choose.
    """
    cfg_path = Path(local_dir) / "fsdp_config.json"
    sizes = sorted({int(m.group(1)) for m in map(_SHARD_RE.match, os.listdir(local_dir)) if m})
    if cfg_path.exists():
        world = int(json.loads(cfg_path.read_text())["world_size"])
    elif len(sizes) == 1:
        world = sizes[0]
    else:
        raise ValueError(f"{local_dir}: shard files for world sizes {sizes} and no fsdp_config.json to choose one")
    missing = [r for r in range(world) if not (Path(local_dir) / f"model_world_size_{world}_rank_{r}.pt").exists()]
    if missing:
        raise FileNotFoundError(f"{local_dir}: model_world_size_{world}_rank_R.pt missing for ranks {missing}")
    return world


def _shard_count(sample: object, world: int) -> int:
    """Ranks holding one full copy: the mesh's last (fsdp) dimension for DTensors, else every rank."""
    if isinstance(sample, DTensor):
        mesh = sample.device_mesh
        names = tuple(mesh.mesh_dim_names or ())
        if names not in ((), ("fsdp",), ("ddp", "fsdp"), ("dp", "fsdp")):
            raise ValueError(f"device mesh {names} is not supported (only fsdp or ddp×fsdp, as verl's merger)")
        return int(mesh.mesh.shape[-1])
    return world


def _join(key: str, pieces: list, expected: torch.Size | None) -> torch.Tensor:
    """Join the ranks' pieces of one weight (see the module docstring)."""
    first = pieces[0]
    if isinstance(first, DTensor):
        placement = first.placements[-1]  # the fsdp dimension; a leading ddp dimension is replicated
        locals_ = [p._local_tensor for p in pieces]
        if placement.is_replicate():
            return locals_[0].clone()
        if placement.is_shard():
            return torch.cat(locals_, dim=placement.dim).contiguous()
        raise ValueError(f"{key}: placement {placement} cannot be merged (only Shard and Replicate)")
    # plain tensors: verl concatenates along dim 0; a weight every rank holds whole (same shape as the model's
    # parameter) is taken once instead
    if expected is not None and first.shape == expected and all(torch.equal(first, p) for p in pieces[1:]):
        return first.clone()
    return torch.cat(pieces, dim=0).contiguous()


def load_verl_fsdp_state_dict(local_dir: str, shapes: dict[str, torch.Size] | None = None) -> dict[str, torch.Tensor]:
    """The full state dict of a verl FSDP checkpoint folder, in the dtypes it was saved in.

    Args:
        local_dir: verl's ``global_step_N/actor`` (or ``critic``) folder.
        shapes: the target model's parameter shapes by name (``{n: p.shape}``); when given, every merged weight
            is checked against it.

    Returns:
        ``{name: full tensor}`` on CPU.

    Raises:
        FileNotFoundError: missing shard files. KeyError: ranks disagree on the key set.
        CheckpointError: a shard holds Python objects other than tensors (it is not run).
        ValueError: a merged weight's shape differs from ``shapes`` (naming the key), or an unsupported mesh.
    """
    world = verl_world_size(local_dir)
    first = load_state(Path(local_dir) / f"model_world_size_{world}_rank_0.pt")
    if not first:
        raise ValueError(f"{local_dir}: model_world_size_{world}_rank_0.pt holds no weights")
    n = _shard_count(first[sorted(first)[0]], world)
    ranks = [first] + [load_state(Path(local_dir) / f"model_world_size_{world}_rank_{r}.pt") for r in range(1, n)]
    for r, sd in enumerate(ranks):
        if set(sd) != set(first):
            diff = sorted(set(sd) ^ set(first))[:5]
            raise KeyError(f"{local_dir}: rank {r} and rank 0 hold different weights, e.g. {diff}")
    shapes = shapes or {}
    out: dict[str, torch.Tensor] = {}
    for key in sorted(first):
        tensor = _join(key, [sd[key] for sd in ranks], shapes.get(key))
        if key in shapes and tensor.shape != shapes[key]:
            raise ValueError(f"{local_dir}: merged {key} has shape {tuple(tensor.shape)}, the model expects "
                             f"{tuple(shapes[key])}")
        out[key] = tensor
    return out
