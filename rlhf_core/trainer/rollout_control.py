"""Driver-side rollout controls: ``skip.rollout.enable`` / ``dump_dir`` (verl 0.6: ``rollout.skip_rollout`` /
``skip_dump_dir``) and ``rollout.over_sample_rate``.

``skip.rollout`` (verl ``utils/skip``, action ``cache``): the [gen] stage first looks for a dumped generation
under ``dump_dir``; when there is one it is used instead of calling the rollout engine, otherwise the engine
generates and the output is dumped for the next run. Layout::

    <dump_dir>/<experiment_name>_<project_name>_GBS<train_batch_size>__N<rollout.n>/step_<global_step>.pt

verl keeps one dump per folder and replays that same generation at every step; we keep one per global step, so
a rerun with the same data order replays each step's own responses (a changed batch size or ``n`` picks another
folder, as in verl). Validation never uses the dump.

``over_sample_rate`` (verl's sglang rollout): with rate ``r``, once ``int(N·(1 − r))`` of the ``N`` training
requests have finished, the rest are aborted and become padding: empty responses (all pad ids) whose
``response_mask`` and response ``attention_mask`` are 0, so they carry no loss. A synchronous engine finishes
everything at once, so the requests that *would* finish last — the longest responses (ties: the later row) —
are the ones aborted. verl also zeroes the prompt's attention mask; we keep it, so log-prob passes over the row
stay finite (the row is masked out of every loss either way). It draws no extra prompts: the step trains on the
``int(N·(1 − r))`` kept responses. An aborted response is not a sample: the advantage estimator and its group
statistics see only the kept ones (``rlhf_core.algos.advantages.compute_advantage_without_aborted``), and
``critic/score/*`` leaves it out; ``response/aborted_ratio`` counts it (``rlhf_core.metrics.training``).
"""
from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch

from rlhf_core.protocol import Batch
from rlhf_core.safe_load import load_state

logger = logging.getLogger(__name__)


class RolloutDump:
    """Per-step dumps of the rollout engine's output (``skip_rollout``).

    Args:
        dump_dir: ``skip.rollout.dump_dir``. experiment_name, project_name, train_batch_size, n: name the folder.
    """

    def __init__(self, dump_dir: str, experiment_name: str, project_name: str, train_batch_size: int, n: int):
        self.folder = os.path.join(os.path.expanduser(str(dump_dir)),
                                   f"{experiment_name}_{project_name}_GBS{int(train_batch_size)}__N{int(n)}")

    @classmethod
    def from_config(cls, config: Any) -> "RolloutDump | None":
        """None unless ``skip.rollout.enable`` (verl 0.6: ``actor_rollout_ref.rollout.skip_rollout``) is set."""
        skip, trainer = config.skip.rollout, config.trainer
        if not skip.enable:
            return None
        return cls(skip.dump_dir, trainer.experiment_name, trainer.project_name,
                   config.data.train_batch_size, config.actor_rollout_ref.rollout.n)

    def path(self, step: int) -> str:
        return os.path.join(self.folder, f"step_{int(step)}.pt")

    def load(self, step: int, rows: int) -> Batch | None:
        """The dumped generation of ``step``, or None when there is none.

        Raises:
            ValueError: the dump has another number of rows than the batch being generated (naming the file).
            CheckpointError: the file holds Python objects other than tensors and plain data (it is not run).
        """
        path = self.path(step)
        if not os.path.exists(path):
            return None
        state = load_state(path)  # tensors and plain data only: a dump folder's pickle never runs
        non_tensors = {k: col["values"] if col["dtype"] == "object" else np.asarray(col["values"], dtype=col["dtype"])
                       for k, col in state["non_tensors"].items()}
        out = Batch(state["tensors"], non_tensors, state["meta"])
        if len(out) != rows:
            raise ValueError(f"rollout.skip_rollout: {path} holds {len(out)} responses, this step generates {rows}; "
                             f"remove it or point rollout.skip_dump_dir elsewhere")
        logger.info("skip_rollout: step %d replays %s", step, path)
        return out

    def dump(self, step: int, out: Batch) -> str:
        """Write ``out`` for ``step`` atomically; returns the path."""
        os.makedirs(self.folder, exist_ok=True)
        path = self.path(step)
        non_tensors = {k: {"dtype": str(v.dtype), "values": _plain(v.tolist())} for k, v in out.non_tensors.items()}
        torch.save({"tensors": out.tensors, "non_tensors": non_tensors, "meta": out.meta}, path + ".tmp")
        os.replace(path + ".tmp", path)
        return path


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays (inside lists, tuples and dicts) turned into Python numbers and lists,
    so that ``torch.load(weights_only=True)`` reads it back."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def abort_slowest(out: Batch, over_sample_rate: float, pad_token_id: int) -> tuple[Batch, int]:
    """Turn the responses that would finish last into padding (see the module docstring).

    Args:
        out: the rollout output: ``responses (N, T)``, ``response_mask (N, T)``, ``attention_mask`` and
            ``input_ids (N, P + T)`` (optional ``rollout_log_probs (N, T)``).
        over_sample_rate: ``r`` in [0, 1); ``int(N·(1 − r))`` responses are kept.
        pad_token_id: id written over aborted responses.

    Returns:
        (the new batch, number of aborted rows).

    Raises:
        ValueError: ``over_sample_rate`` outside [0, 1).
    """
    if not 0 <= over_sample_rate < 1:
        raise ValueError(f"actor_rollout_ref.rollout.over_sample_rate={over_sample_rate} must be in [0, 1)")
    n = len(out)
    keep = int(n * (1 - over_sample_rate))
    if keep >= n:
        return out, 0
    mask = out["response_mask"]
    lengths = mask.sum(-1)
    order = sorted(range(n), key=lambda i: (int(lengths[i]), i))  # finishing order: shortest first
    aborted = torch.tensor(order[keep:], dtype=torch.long)
    t = mask.shape[1]
    tensors = {k: v.clone() for k, v in out.tensors.items()}
    tensors["responses"][aborted] = pad_token_id
    tensors["response_mask"][aborted] = 0
    tensors["attention_mask"][aborted, -t:] = 0
    if "input_ids" in tensors:
        tensors["input_ids"][aborted, -t:] = pad_token_id
    if "rollout_log_probs" in tensors:
        tensors["rollout_log_probs"][aborted] = 0
    return Batch(tensors, dict(out.non_tensors), dict(out.meta)), len(aborted)
