"""The batch container passed between the driver and the workers (verl's ``DataProto``, trimmed).

A :class:`Batch` holds

* ``tensors``: ``dict[str, torch.Tensor]``, every tensor with leading dimension ``B`` (sequences);
* ``non_tensors``: ``dict[str, numpy.ndarray]`` of ``dtype=object`` (or a plain numpy dtype), leading
  dimension ``B`` — strings, dicts and ids such as ``uid``, ``data_source``, ``reward_model``;
* ``meta``: a free ``dict`` for scalars that belong to the whole batch (e.g. ``temperature``).

Field names follow verl (see ``docs/ARCHITECTURE.md`` for the full list and shapes):
``prompts (B, P)``, ``responses (B, T)``, ``input_ids/attention_mask/position_ids (B, P+T)``,
``response_mask (B, T)``, ``old_log_probs``, ``ref_log_prob``, ``values``, ``token_level_scores``,
``token_level_rewards``, ``advantages``, ``returns``, ``rollout_log_probs`` — all ``(B, T)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch


def _as_object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array holding ``values`` as they are (dicts and lists are not broadcast)."""
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


@dataclass
class Batch:
    """A batch of ``B`` sequences: tensors and non-tensor columns sharing the leading dimension.

    Raises:
        ValueError: on construction when two fields disagree on ``B``.
    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensors = {
            k: (v if isinstance(v, np.ndarray) else _as_object_array(list(v))) for k, v in self.non_tensors.items()
        }
        sizes = {k: len(v) for k, v in {**self.tensors, **self.non_tensors}.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch fields disagree on the batch size: {sizes}")

    # ---- size and access -------------------------------------------------------------------------
    def __len__(self) -> int:
        for v in self.tensors.values():
            return int(v.shape[0])
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        raise KeyError(f"{key!r} is not in the batch; it has {sorted(self.keys())}")

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    # ---- construction ----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], meta: dict[str, Any] | None = None) -> "Batch":
        """Split a dict into tensors (``torch.Tensor`` values) and non-tensor columns (everything else)."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls(tensors=tensors, non_tensors=non_tensors, meta=dict(meta or {}))

    def select(self, keys: Iterable[str]) -> "Batch":
        """A new batch with only ``keys`` (tensors are shared, not copied)."""
        keys = list(keys)
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"keys {missing} are not in the batch; it has {sorted(self.keys())}")
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.non_tensors.items() if k in keys},
            dict(self.meta),
        )

    def merge(self, other: "Batch", source: str = "") -> "Batch":
        """A new batch with every field of ``other`` added, or replacing this batch's field of the same name
        (a worker's output overrides its input: the rollout's ``input_ids (B, P+T)`` replace the prompts'
        ``(B, P)``); ``meta`` is merged the same way. Tensors and arrays are shared, not copied.

        ``source`` names who produced ``other`` (``"critic compute_values"``) for the error.

        Raises:
            ValueError: when both batches have rows and their sizes differ (naming ``source`` when given).
        """
        if len(other) and len(self) and len(other) != len(self):
            if source:
                raise ValueError(f"{source} returned {len(other)} rows for a batch of {len(self)}")
            raise ValueError(f"cannot merge a batch of {len(other)} rows into a batch of {len(self)}")
        return Batch({**self.tensors, **other.tensors}, {**self.non_tensors, **other.non_tensors},
                     {**self.meta, **other.meta})

    # ---- reshaping -------------------------------------------------------------------------------
    def index(self, idx: torch.Tensor | np.ndarray | Sequence[int] | slice) -> "Batch":
        """Rows ``idx`` (a slice, or integer indices) as a new batch."""
        if isinstance(idx, slice):
            return Batch(
                {k: v[idx] for k, v in self.tensors.items()},
                {k: v[idx] for k, v in self.non_tensors.items()},
                dict(self.meta),
            )
        idx_np = np.asarray(idx.cpu() if isinstance(idx, torch.Tensor) else idx, dtype=np.int64)
        idx_t = torch.from_numpy(idx_np)
        return Batch(
            {k: v[idx_t.to(v.device)] for k, v in self.tensors.items()},
            {k: v[idx_np] for k, v in self.non_tensors.items()},
            dict(self.meta),
        )

    def chunk(self, n: int) -> list["Batch"]:
        """Split into ``n`` equal contiguous parts (one per worker).

        Raises:
            ValueError: when ``len(self)`` is not divisible by ``n``.
        """
        b = len(self)
        if n <= 0 or b % n:
            raise ValueError(f"cannot split a batch of {b} sequences into {n} equal parts")
        size = b // n
        return [self.index(slice(i * size, (i + 1) * size)) for i in range(n)]

    def own_storage(self) -> "Batch":
        """This batch with every tensor that views a larger storage copied into its own (others shared).

        Pickling a tensor writes its whole storage: a rank's shard of ``chunk(n)`` would carry the full batch to
        each of the ``n`` ranks. :class:`~rlhf_core.distributed.worker_group.RayWorkerGroup` sends and returns
        batches in this form."""
        return Batch({k: v.clone() if v.untyped_storage().nbytes() > v.numel() * v.element_size() else v
                      for k, v in self.tensors.items()}, dict(self.non_tensors), dict(self.meta))

    def split(self, size: int) -> list["Batch"]:
        """Contiguous parts of ``size`` rows (the last may be shorter)."""
        if size <= 0:
            raise ValueError(f"split size must be positive, got {size}")
        return [self.index(slice(i, i + size)) for i in range(0, len(self), size)]

    @staticmethod
    def concat(parts: Sequence["Batch"]) -> "Batch":
        """Concatenate along the batch dimension; ``meta`` is taken from the first part."""
        parts = [p for p in parts if p is not None]
        if not parts:
            return Batch()
        tensors = {k: torch.cat([p.tensors[k] for p in parts]) for k in parts[0].tensors}
        non_tensors = {k: np.concatenate([p.non_tensors[k] for p in parts]) for k in parts[0].non_tensors}
        return Batch(tensors, non_tensors, dict(parts[0].meta))

    def repeat_interleave(self, n: int) -> "Batch":
        """Repeat every row ``n`` times, interleaved (p1,p1,p2,p2 — verl's ``repeat(interleave=True)``)."""
        idx = np.repeat(np.arange(len(self)), n)
        return self.index(idx)

    def to(self, device: str | torch.device) -> "Batch":
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, dict(self.non_tensors), dict(self.meta))
