"""Driver-side rollout controls: ``skip.rollout.enable`` / ``dump_dir`` (verl 0.6: ``rollout.skip_rollout`` /
``skip_dump_dir``) and ``rollout.over_sample_rate``.

``skip.rollout`` (verl ``utils/skip``, action ``cache``): the [gen] stage first looks for a dumped generation
under ``dump_dir``; when there is one it is used instead of calling the rollout engine, otherwise the engine
generates and the output is dumped for the next run. Layout::

    <dump_dir>/<experiment_name>_<project_name>_GBS<train_batch_size>__N<rollout.n>/step_<global_step>.pt

One dump per global step (verl 0.9: ``<project dir>/<step>/gen_batch.dp``), so a rerun with the same data order
replays each step's own responses (a changed batch size or ``n`` picks another folder, as in verl). Validation
never uses the dump.

``skip.rollout.steps`` (verl 0.9's ``SkipManager``): only the listed global steps are dumped or replayed; any other
step generates and dumps nothing. ``[]`` means every step here, where verl 0.9.1 skips no step at all (its
``step not in steps`` test), so that ``enable`` alone and verl 0.6's ``rollout.skip_rollout`` keep working.
``skip.rollout.action``: ``cache`` replays a step's own dump, else generates and dumps it; ``repeat``
(verl's ``RolloutSkip._find_latest_step``) replays the step's own dump if there is one, else the latest dump of an
earlier step, else the earliest dump of a later one, and generates (and dumps) only when the folder has none. A
repeated dump's responses are trained with the current step's prompts' data (its ground truth, uids); verl says
the same: repeat is for debugging, not step-aligned replay.

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
import re
from typing import Any

import numpy as np
import torch

from rlhf_core.protocol import Batch
from rlhf_core.safe_load import load_state

logger = logging.getLogger(__name__)


class RolloutDump:
    """Per-step dumps of the rollout engine's output (``skip.rollout``, module docstring).

    Args:
        dump_dir: ``skip.rollout.dump_dir``. experiment_name, project_name, train_batch_size, n: name the folder.
        steps: ``skip.rollout.steps``, the global steps dumped or replayed; empty: every step.
        action: ``skip.rollout.action``: ``cache`` or ``repeat``.

    Raises:
        ValueError: ``action`` is neither ``cache`` nor ``repeat`` (the config check refuses it first).
    """

    ACTIONS = ("cache", "repeat")
    KEY = "skip.rollout"  # the config section, named in errors and logs
    _FILE = re.compile(r"step_(\d+)\.pt")

    def __init__(self, dump_dir: str, experiment_name: str, project_name: str, train_batch_size: int, n: int,
                 steps: Any = (), action: str = "cache"):
        if action not in self.ACTIONS:
            raise ValueError(f"{self.KEY}.action={action!r}: expected one of {list(self.ACTIONS)}")
        self.folder = os.path.join(os.path.expanduser(str(dump_dir)),
                                   f"{experiment_name}_{project_name}_GBS{int(train_batch_size)}__N{int(n)}")
        self.steps = frozenset(int(s) for s in steps)
        self.action = action

    @classmethod
    def from_config(cls, config: Any) -> "RolloutDump | None":
        """None unless ``skip.rollout.enable`` (verl 0.6: ``actor_rollout_ref.rollout.skip_rollout``) is set."""
        skip, trainer = config.skip.rollout, config.trainer
        if not skip.enable:
            return None
        return cls(skip.dump_dir, trainer.experiment_name, trainer.project_name,
                   config.data.train_batch_size, config.actor_rollout_ref.rollout.n, skip.steps, skip.action)

    def applies(self, step: int) -> bool:
        """Whether ``step`` is dumped or replayed (``skip.rollout.steps`` lists it, or is empty)."""
        return not self.steps or int(step) in self.steps

    def path(self, step: int) -> str:
        return os.path.join(self.folder, f"step_{int(step)}.pt")

    def dumped_steps(self) -> list[int]:
        """The steps with a dump in the folder, ascending."""
        if not os.path.isdir(self.folder):
            return []
        return sorted(int(m.group(1)) for m in map(self._FILE.fullmatch, os.listdir(self.folder)) if m)

    def source_step(self, step: int) -> int | None:
        """The step whose dump replays ``step``: its own; with ``repeat``, else the largest earlier dumped step, else
        the smallest later one; None when there is none (or ``step`` is not in ``skip.rollout.steps``)."""
        if not self.applies(step):
            return None
        if os.path.exists(self.path(step)):
            return int(step)
        if self.action != "repeat":
            return None
        dumped = self.dumped_steps()
        earlier = [s for s in dumped if s < step]
        later = [s for s in dumped if s > step]
        return earlier[-1] if earlier else (later[0] if later else None)

    def load(self, step: int, rows: int) -> Batch | None:
        """The dumped generation replaying ``step`` (:meth:`source_step`), or None when there is none.

        Raises:
            ValueError: the dump has another number of rows than the batch being generated (naming the file).
            CheckpointError: the file holds Python objects other than tensors and plain data (it is not run).
        """
        source = self.source_step(step)
        if source is None:
            return None
        path = self.path(source)
        state = load_state(path)  # tensors and plain data only: a dump folder's pickle never runs
        non_tensors = {k: col["values"] if col["dtype"] == "object" else np.asarray(col["values"], dtype=col["dtype"])
                       for k, col in state["non_tensors"].items()}
        out = Batch(state["tensors"], non_tensors, state["meta"])
        if len(out) != rows:
            raise ValueError(f"{self.KEY}: {path} holds {len(out)} responses, this step generates {rows}; "
                             f"remove it or point {self.KEY}.dump_dir elsewhere")
        logger.info("%s: step %d replays %s", self.KEY, step, path)
        return out

    def dump(self, step: int, out: Batch) -> str | None:
        """Write ``out`` for ``step`` atomically; returns the path (None: ``step`` is not in ``skip.rollout.steps``)."""
        if not self.applies(step):
            return None
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
