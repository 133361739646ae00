"""Small helpers shared by the PPO driver's stages: timers, uids, padding, rank-metric reduction, balancing."""
from __future__ import annotations

import json
import os
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch
from omegaconf import DictConfig

from rlhf_core.metrics.training import reduce_metrics
from rlhf_core.protocol import Batch
from rlhf_core.workers.batching import uid_runs


@contextmanager
def timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Add the wall-clock seconds of the block to ``timing_raw[name]`` (verl's ``marked_timer``)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start


def add_uids(batch: Batch) -> Batch:
    """A new batch with a fresh ``uid`` (uuid4 string) per row: one group per prompt before repetition."""
    uids = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    return Batch(dict(batch.tensors), {**batch.non_tensors, "uid": uids}, dict(batch.meta))


def ensure_response_mask(batch: Batch) -> Batch:
    """Add ``response_mask (B, T)`` = ``attention_mask[:, -T:]`` when the rollout did not return one."""
    if "response_mask" in batch:
        return batch
    t = batch["responses"].shape[1]
    return batch.merge(Batch({"response_mask": batch["attention_mask"][:, -t:].clone()}))


def resample_rows(batch: Batch, idx: torch.Tensor | np.ndarray) -> Batch:
    """The rows ``idx`` of ``batch`` (repeats allowed, any order); per-row lists in ``meta`` (a list as long as the
    batch, e.g. ``global_token_num``) follow the rows, as verl's PF-PPO resampling does with ``meta_info``."""
    rows = [int(i) for i in idx]
    out = batch.index(np.asarray(rows, dtype=np.int64))
    for key, value in batch.meta.items():
        if isinstance(value, list) and len(value) == len(batch):
            out.meta[key] = [value[i] for i in rows]
    return out


def pad_to_divisor(batch: Batch, divisor: int) -> tuple[Batch, int]:
    """Append copies of the first rows so that ``len`` is divisible by ``divisor``; returns (batch, pad count)."""
    pad = (-len(batch)) % divisor
    if pad == 0:
        return batch, 0
    idx = np.concatenate([np.arange(len(batch)), np.arange(pad) % len(batch)])
    return batch.index(idx), pad


def unpad(batch: Batch, pad: int) -> Batch:
    return batch if pad == 0 else batch.index(slice(0, len(batch) - pad))


def mean_rank_metrics(outputs: list[Any]) -> dict[str, float]:
    """Reduce per-rank metric dicts (values: numbers or lists of numbers; or Batches carrying
    ``meta["metrics"]``) to their mean per key (``rlhf_core.metrics.training.reduce_metrics``)."""
    dicts = []
    for out in outputs:
        if isinstance(out, Batch):
            out = out.meta.get("metrics", {})
        dicts.append({k: [float(x) for x in (v if isinstance(v, list | tuple) else [v])] for k, v in (out or {}).items()})
    return reduce_metrics(dicts)


def balance_batch(batch: Batch, world_size: int, keep_groups: bool = False) -> tuple[Batch, dict[str, float]]:
    """Reorder rows so that each of the ``world_size`` equal contiguous shards gets a similar number of valid
    tokens (verl ``trainer.balance_batch``). Greedy: longest sequence first, into the shard with the fewest tokens
    that still has room. Metrics ``global_seqlen/{min,max,minmax_diff,balanced_min,balanced_max,mean}`` are the
    per-shard token totals before and after balancing.

    ``keep_groups`` (``actor.use_prefix_grouper``; verl's ``get_group_balanced_partitions``): the units moved are the
    runs of consecutive rows with the same ``uid`` instead of rows, each kept whole and in order. A group that fits
    no shard's remaining room (group counts or sizes that do not fill the equal shards; verl raises then) is cut into
    the fewest pieces, each into the shard with the most rows free: the prefix-grouped forward runs each piece as a
    smaller group (exact, less saving)."""
    seqlens = batch["attention_mask"].sum(-1).tolist()
    n = len(seqlens)
    if world_size <= 1 or n % world_size:
        return batch, {}
    size = n // world_size
    before = [sum(seqlens[r * size:(r + 1) * size]) for r in range(world_size)]
    units = uid_runs(batch["uid"] if keep_groups and "uid" in batch else None, n)
    parts: list[list[int]] = [[] for _ in range(world_size)]
    totals = [0] * world_size
    for unit in sorted(units, key=lambda u: (-sum(seqlens[j] for j in u), u[0])):
        room = [r for r in range(world_size) if len(parts[r]) + len(unit) <= size]
        if room:
            pieces = [(min(room, key=lambda r: (totals[r], r)), unit)]
        else:  # cut: the shard with the most rows free first (it fills), until the rest fits
            pieces, rest, free = [], list(unit), [size - len(p) for p in parts]
            while rest:
                r = min(range(world_size), key=lambda r: (-free[r], totals[r], r))
                pieces.append((r, rest[:free[r]]))
                rest, free[r] = rest[free[r]:], 0
        for r, piece in pieces:
            parts[r].extend(piece)
            totals[r] += sum(seqlens[j] for j in piece)
    order = [i for part in parts for i in sorted(part)]
    metrics = {"global_seqlen/min": float(min(before)), "global_seqlen/max": float(max(before)),
               "global_seqlen/minmax_diff": float(max(before) - min(before)),
               "global_seqlen/balanced_min": float(min(totals)), "global_seqlen/balanced_max": float(max(totals)),
               "global_seqlen/mean": float(np.mean(before))}
    return batch.index(order), metrics


def dump_rollouts(batch: Batch, tokenizer: Any, out_dir: str, global_step: int) -> str:
    """``trainer.rollout_data_dir``: write ``<out_dir>/<global_step>.jsonl``, one line per sequence with
    ``input``, ``output`` (decoded, special tokens skipped), ``score`` (Σ token_level_scores), ``step`` and the
    reward manager's extra columns (verl ``_dump_generations``)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{global_step}.jsonl")
    p = batch["prompts"].shape[1]
    mask = batch["attention_mask"]
    scores = batch["token_level_scores"].sum(-1).tolist()
    base = {"prompts", "responses", "uid", "data_source", "reward_model", "extra_info", "index", "raw_prompt",
            "raw_prompt_ids", "full_prompts", "ability", "tools_kwargs", "interaction_kwargs"}
    extras = [k for k, v in batch.non_tensors.items() if k not in base]
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(len(batch)):
            prompt_ids = batch["prompts"][i][mask[i, :p].bool()].tolist()
            n = int(batch["response_mask"][i].sum())
            row = {"input": tokenizer.decode(prompt_ids, skip_special_tokens=True),
                   "output": tokenizer.decode(batch["responses"][i][:n].tolist(), skip_special_tokens=True),
                   "score": float(scores[i]), "step": int(global_step)}
            for k in extras:
                v = batch[k][i]
                row[k] = v.item() if isinstance(v, np.generic) else v
            fh.write(json.dumps(row, default=str) + "\n")
    return path


def compute_total_training_steps(config: DictConfig, steps_per_epoch: int) -> int:
    """``trainer.total_training_steps`` when not null (verl's rule; the config check refuses a value < 1), else
    ``steps_per_epoch × trainer.total_epochs``.

    Raises:
        ValueError: when the result is not positive (e.g. an empty dataloader).
    """
    given = config.trainer.total_training_steps
    total = int(given) if given is not None else steps_per_epoch * int(config.trainer.total_epochs)
    if total <= 0:
        raise ValueError(f"total_training_steps is {total}: the train dataloader has {steps_per_epoch} batches "
                         f"(data.train_batch_size={config.data.train_batch_size}) × {config.trainer.total_epochs} epochs")
    return total


def after_step_hooks(loader: Any, batch: Batch) -> None:
    """verl's end-of-step hooks: a curriculum ``data.sampler`` gets ``update(batch=batch)``; a dataset with
    ``on_batch_end`` (``data.datagen``) gets ``on_batch_end(batch=batch)``."""
    sampler = loader.sampler
    if sampler is not None and hasattr(sampler, "update"):
        sampler.update(batch=batch)
    dataset = loader.dataset
    if hasattr(dataset, "on_batch_end"):
        dataset.on_batch_end(batch=batch)
