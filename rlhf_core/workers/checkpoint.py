"""Sharded FSDP2 checkpoints with ``torch.distributed.checkpoint`` (verl ``FSDPCheckpointManager``).

Layout of ``local_path`` (e.g. ``global_step_N/actor``)::

    model/                          DCP: sharded model state            ('model')
    optim/                          DCP: sharded optimizer state        ('optimizer')
    extra_state_world_size_W_rank_R.pt   LR scheduler + RNG + counters  ('extra')
    huggingface/                    config + tokenizer (+ full safetensors weights with 'hf_model')

Elastic resume: a checkpoint saved with W ranks loads with W' ≠ W. DCP reshards the model and optimizer; the LR
scheduler and the counters (identical on every rank) come from rank 0's extra state; the RNG states, which are
per rank, are not carried over but re-derived on every rank from the seed, the rank and the global step
(:func:`derive_seed`), and a log line says so. Such a run is not bit-identical to one that kept W ranks.

Writes go to ``<local_path>.tmp`` and are renamed into place by rank 0 once every rank has finished, so a
crash never leaves a half-written ``local_path`` (an older checkpoint at that path is replaced only then). A write
that fails on a full disk (DCP reports it as ``RuntimeError: ... unexpected pos``, not as ``ENOSPC``:
:func:`rlhf_core.storage.full_disk_cause`) raises a ``StorageError`` ``ENOSPC`` giving the bytes that were free.
"""
from __future__ import annotations

import copy
import glob
import logging
import os
import random
import shutil
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.utils._pytree import tree_map
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict)

from rlhf_core.atomic import replace_directory
from rlhf_core.faults import fault_point
from rlhf_core.safe_load import dcp_load, load_state
from rlhf_core.storage import StorageError, free_bytes, full_disk_cause
from rlhf_core.trainer.checkpoint_manager import parse_global_step
from rlhf_core.workers.fsdp_utils import full_state_dict, rank, world_size
from rlhf_core.workers.optim import keep_optimizer_implementation

logger = logging.getLogger(__name__)
CONTENTS = ("model", "optimizer", "extra", "hf_model")


def _barrier(group=None) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier(group=group)


def _clone_tensors(tree: Any) -> Any:
    """A copy of every tensor in ``tree`` (DTensors stay DTensors), so training can change the originals."""
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, tree)


def rng_state(cuda: bool = True) -> dict[str, Any]:
    """The global RNG states of this process: torch CPU, numpy, python ``random`` (and the current CUDA device's
    when ``cuda`` and CUDA is available; the driver passes ``cuda=False`` so that it never initialises CUDA)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    # numpy's key array as a list of ints: a checkpoint then holds only what torch.load(weights_only=True) reads
    state = {"cpu": torch.get_rng_state(), "numpy": (name, keys.tolist(), pos, has_gauss, cached),
             "random": random.getstate()}
    if cuda and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (numpy's keys as a list, or as an array in older checkpoints)."""
    torch.set_rng_state(state["cpu"])
    name, keys, pos, has_gauss, cached = state["numpy"][:5]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(state["random"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def derive_seed(seed: int, rank_: int, global_step: int) -> int:
    """A 31-bit seed for the global RNGs of rank ``rank_`` at ``global_step`` (0: a fresh run), from the run seed.

    Different ranks and steps get unrelated seeds (crc32 of the three numbers), the same inputs the same seed
    in any process."""
    return zlib.crc32(f"{int(seed)}/{int(rank_)}/{int(global_step)}".encode()) & 0x7FFFFFFF


def seed_all(seed: int) -> None:
    """Seed torch (CPU and every CUDA device), numpy and python ``random`` with ``seed``."""
    torch.manual_seed(int(seed))  # also seeds every CUDA device
    np.random.seed(int(seed) & 0xFFFFFFFF)
    random.seed(int(seed))


def run_seed(config) -> int:
    """The run's seed: ``actor_rollout_ref.rollout.seed``, else ``data.seed`` (an explicit 0 stays 0), else 0.

    It seeds the rollout engine, and each rank's global RNGs (dropout...) through
    :func:`derive_seed` (step 0 at start-up; the resumed step after an elastic resume)."""
    seed = config.actor_rollout_ref.rollout.seed
    seed = config.data.seed if seed is None else seed
    return 0 if seed is None else int(seed)


def seed_rank(config) -> None:
    """Seed this rank's global torch/numpy/python RNGs for a fresh run (global step 0). Called once the models are
    built: a LoRA adapter or any other random initialisation happens before, identically on every rank."""
    seed_all(derive_seed(run_seed(config), rank(), 0))


def _check_contents(contents: Sequence[str], key: str) -> list[str]:
    bad = [c for c in contents if c not in CONTENTS]
    if bad:
        raise ValueError(f"checkpoint.{key} has unknown entries {bad}; allowed: {list(CONTENTS)}")
    return list(contents)


class FSDPCheckpointManager:
    """Save / load one FSDP2 model (+ optimizer, LR scheduler, extra state) on every rank.

    Args:
        model: the FSDP2-sharded module. optimizer / lr_scheduler: may be ``None`` (reference, merger).
        tokenizer: saved into ``huggingface/``; hf_config: ``model.config`` (saved into ``huggingface/``).
        save_contents / load_contents: subsets of ``('model','optimizer','extra','hf_model')``.
        extra_state: ``() -> dict`` of counters to save; set_extra_state: ``(dict) -> None`` to restore them.
            The counters must be the same on every rank (an elastic resume reads rank 0's).
        seed: the run seed from which an elastic resume re-derives each rank's RNG (:func:`derive_seed`).
        async_save: ``checkpoint.async_save``: :meth:`save` returns once the state is copied; the files are
            written in the background and :meth:`wait` blocks until they are complete.
    """

    def __init__(self, model: nn.Module, optimizer, lr_scheduler, tokenizer, hf_config,
                 save_contents: Sequence[str] = ("model", "optimizer", "extra"),
                 load_contents: Sequence[str] | None = None,
                 extra_state: Callable[[], dict] | None = None, set_extra_state: Callable[[dict], None] | None = None,
                 generation_config=None, async_save: bool = False, seed: int = 0) -> None:
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.tokenizer, self.hf_config, self.generation_config = tokenizer, hf_config, generation_config
        self.save_contents = _check_contents(save_contents, "save_contents")
        self.load_contents = _check_contents(load_contents if load_contents is not None else save_contents,
                                             "load_contents")
        self.extra_state, self.set_extra_state = extra_state, set_extra_state
        self.seed = int(seed)
        # checkpoint.async_save: a writer thread with its own gloo group (collectives of the writer must not
        # interleave with training's on the default group); new_group is collective, so every rank builds it here
        self.async_save = bool(async_save)
        self._pending: Future | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ckpt") if self.async_save else None
        self._pg = dist.new_group(backend="gloo") if self.async_save and dist.is_initialized() else None

    def _extra_path(self, root: str, world: int | None = None, rank_: int | None = None) -> str:
        world, rank_ = world_size() if world is None else world, rank() if rank_ is None else rank_
        return os.path.join(root, f"extra_state_world_size_{world}_rank_{rank_}.pt")

    def save(self, local_path: str) -> str:
        """Write the checkpoint to ``local_path`` (collective: every rank must call it). Returns the path.

        With ``async_save`` the state is first copied (model/optimizer shards, RNG, scheduler, and the full
        weights for ``hf_model``), then written by a background thread over a checkpoint-only gloo group while
        training goes on; :meth:`wait` blocks until it is on disk. A previous pending save is waited for first.

        Raises:
            StorageError: the disk filled up (``ENOSPC``; the message gives the bytes free when the write failed);
                ``<local_path>.tmp`` is removed and ``local_path`` untouched (with ``async_save``, from :meth:`wait`).
        """
        local_path = os.path.abspath(os.path.expanduser(local_path))
        self.wait()
        model_sd = get_model_state_dict(self.model) if "model" in self.save_contents else None
        optim_sd = (get_optimizer_state_dict(self.model, self.optimizer)
                    if "optimizer" in self.save_contents and self.optimizer is not None else None)
        extra = None
        if "extra" in self.save_contents:
            extra = {"rng": rng_state(), "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler else None,
                     "counters": self.extra_state() if self.extra_state else {}}
        full = full_state_dict(self.model, rank0_only=True) if "hf_model" in self.save_contents else None
        if not self.async_save:
            return self._write(local_path, model_sd, optim_sd, extra, full, None)
        snapshot = _clone_tensors((model_sd, optim_sd, copy.deepcopy(extra), full))
        self._pending = self._executor.submit(self._write, local_path, *snapshot, self._pg)
        return local_path

    def wait(self) -> str | None:
        """Block until a pending async save is on disk (re-raising its error); returns its path or None."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def _write(self, local_path: str, model_sd, optim_sd, extra, full, pg) -> str:
        tmp = local_path + ".tmp"
        if rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        _barrier(pg)
        try:
            if model_sd is not None:
                dcp.save(model_sd, checkpoint_id=os.path.join(tmp, "model"), process_group=pg)
            fault_point("checkpoint_write", checkpoint_path=local_path)  # test-only (RLHF_FAULT); free when unset
            if optim_sd is not None:
                dcp.save(optim_sd, checkpoint_id=os.path.join(tmp, "optim"), process_group=pg)
            if extra is not None:
                torch.save(extra, self._extra_path(tmp))
            if rank() == 0:
                self._save_hf(os.path.join(tmp, "huggingface"), full)
        except BaseException as exc:  # e.g. ENOSPC: leave no half-written <path>.tmp behind; <path> is untouched
            # DCP's CheckpointException is a BaseException, not an Exception
            stop = isinstance(exc, (KeyboardInterrupt, SystemExit))
            disk_full = None if stop else full_disk_cause(exc, tmp)
            free = free_bytes(tmp) if disk_full is not None else 0  # measured before the clean-up frees space again
            shutil.rmtree(tmp, ignore_errors=True)
            if disk_full is None:
                raise
            reason = disk_full.strerror or os.strerror(disk_full.errno)
            raise StorageError(disk_full.errno, f"{reason}: {free} bytes free on the disk of {local_path} when the "
                                                f"write failed") from exc
        _barrier(pg)
        if rank() == 0:
            replace_directory(tmp, local_path)
        _barrier(pg)
        return local_path

    def _save_hf(self, hf_dir: str, full: dict | None) -> None:
        os.makedirs(hf_dir, exist_ok=True)
        if self.hf_config is not None:
            self.hf_config.save_pretrained(hf_dir)
        if self.generation_config is not None:
            self.generation_config.save_pretrained(hf_dir)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(hf_dir)
        peft_cfg = getattr(self.model, "peft_config", None)
        if peft_cfg:  # LoRA: the merger needs r / alpha to fold the adapters
            next(iter(peft_cfg.values())).save_pretrained(hf_dir)
        if full:
            from safetensors.torch import save_file

            tensors = {k: v.detach().cpu().contiguous() for k, v in full.items()}
            # tied weights share storage; safetensors refuses shared tensors, so store independent copies
            save_file({k: v.clone() for k, v in tensors.items()}, os.path.join(hf_dir, "model.safetensors"),
                      metadata={"format": "pt"})

    def load(self, local_path: str) -> None:
        """Restore ``load_contents`` from ``local_path`` (collective). Raises ``FileNotFoundError`` if a
        requested part is missing, ``CheckpointError`` if a file holds Python objects other than tensors and plain
        data (read without running them: :mod:`rlhf_core.safe_load`). Another world size than the saved one is an
        elastic resume (module docstring)."""
        self.wait()
        local_path = os.path.abspath(os.path.expanduser(local_path))
        if "model" in self.load_contents:
            path = os.path.join(local_path, "model")
            if not os.path.isdir(path):
                raise FileNotFoundError(f"no sharded model in {local_path}")
            sd = get_model_state_dict(self.model)
            dcp_load(sd, path)
            set_model_state_dict(self.model, sd)
        if "optimizer" in self.load_contents and self.optimizer is not None:
            path = os.path.join(local_path, "optim")
            if not os.path.isdir(path):
                raise FileNotFoundError(f"no optimizer state in {local_path}")
            osd = get_optimizer_state_dict(self.model, self.optimizer)
            dcp_load(osd, path)
            set_optimizer_state_dict(self.model, self.optimizer, osd)
            keep_optimizer_implementation(self.optimizer)
        if "extra" in self.load_contents:
            self._load_extra(local_path)
        _barrier()

    def _load_extra(self, local_path: str) -> None:
        """Restore RNG, LR scheduler and counters; from another world size see the module docstring (elastic).

        Raises:
            FileNotFoundError: ``local_path`` has no extra state for any world size.
        """
        path = self._extra_path(local_path)
        if os.path.exists(path):
            extra = load_state(path)
            set_rng_state(extra["rng"])
        else:
            saved = sorted(glob.glob(os.path.join(local_path, "extra_state_world_size_*_rank_0.pt")))
            if not saved:
                raise FileNotFoundError(f"{path} is missing and {local_path} has no extra_state_world_size_*_rank_0.pt")
            extra = load_state(saved[0])
            step = _global_step_of(local_path)
            seed = derive_seed(self.seed, rank(), step)
            seed_all(seed)
            if rank() == 0:
                logger.warning(
                    "elastic resume: %s was saved with %s ranks, loading with %d: model and optimizer resharded by "
                    "DCP, LR scheduler and counters from rank 0, RNG re-derived per rank from seed %d and global step "
                    "%d (not bit-identical to a run that kept the saved world size)",
                    local_path, os.path.basename(saved[0]).split("_")[4], world_size(), self.seed, step)
        if self.lr_scheduler is not None and extra.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        if self.set_extra_state is not None:
            self.set_extra_state(extra.get("counters", {}))


def _global_step_of(local_path: str) -> int:
    """``N`` of the ``global_step_N`` folder holding ``local_path`` (``.../global_step_N/actor``); 0 if none."""
    try:
        return parse_global_step(os.path.dirname(os.path.normpath(local_path)))
    except ValueError:
        return 0
