"""Write a checkpoint folder in verl 0.6's FSDP layout from a tiny HF model (test fixture for ``rlhf merge``).

What verl's ``FSDPCheckpointManager.save_checkpoint`` does on every rank, reproduced with real FSDP2 on a gloo
group of ``world_size`` processes: ``torch.save(model.state_dict(), model_world_size_W_rank_R.pt)`` of the
``fully_shard``-ed model (its values are ``DTensor``s sharded on dim 0 over a 1-D ``("fsdp",)`` mesh), then on
rank 0 ``fsdp_config.json`` (``{"FSDP_version": 2, "world_size": W}``) and ``huggingface/`` (config +
tokenizer). ``plain=True`` writes what a single rank without FSDP would: ordinary full tensors.
"""
from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _save_rank(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        torch.save(model.state_dict(), os.path.join(out_dir, f"model_world_size_{world}_rank_{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def write_verl_fsdp_checkpoint(model_dir: str, out_dir: str, world_size: int = 2, plain: bool = False) -> str:
    """Write ``out_dir`` as verl's ``global_step_N/actor`` for the HF model at ``model_dir``; returns ``out_dir``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    os.makedirs(out_dir, exist_ok=True)
    if plain:
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        torch.save(model.state_dict(), os.path.join(out_dir, f"model_world_size_{world_size}_rank_0.pt"))
    else:
        mp.start_processes(_save_rank, args=(world_size, _free_port(), model_dir, out_dir), nprocs=world_size,
                           join=True, start_method="spawn")
    with open(os.path.join(out_dir, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 1 if plain else 2, "world_size": world_size}, f, indent=4)
    hf = os.path.join(out_dir, "huggingface")
    AutoConfig.from_pretrained(model_dir).save_pretrained(hf)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(hf)
    return out_dir
