"""A seeded, exactly resumable dataloader (the part of torchdata's ``StatefulDataLoader`` verl relies on).

Order: epoch ``e`` visits ``torch.randperm(N, generator=manual_seed(seed + e))`` when shuffling, else
``0..N-1``; consecutive ``batch_size`` slices form the batches (the last short one dropped when
``drop_last``). The state is ``(epoch, batches already yielded in that epoch)``; it advances *before* a
batch is handed out, and handing out an epoch's last batch moves it to ``(epoch + 1, 0)`` — so a state
saved after any batch resumes with exactly the next batch, and one saved after an epoch's last batch
resumes with the next epoch.

With a user ``sampler`` (``data.sampler``, see :mod:`rlhf_core.data.sampler`) an epoch is one pass of
``iter(sampler)``, drawn one batch at a time so that a curriculum sampler's ``update`` reorders what comes next.
"""
from __future__ import annotations

import itertools
import random
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from rlhf_core.data.rl_dataset import collate_fn as default_collate


class ResumableDataLoader:
    """Iterate a map-style dataset in seeded, epoch-dependent order; ``state_dict`` / ``load_state_dict``.

    Each ``iter()`` yields the rest of the current epoch (a whole epoch when at its start), so
    ``for epoch in ...: for batch in loader:`` behaves like a torch ``DataLoader``. With ``num_workers > 0``
    the items are loaded by a torch ``DataLoader`` over the same batch indices. ``sampler`` (an iterable of
    dataset indices, e.g. a ``torch.utils.data.Sampler``) replaces the seeded order; it requires
    ``num_workers == 0``.
    """

    def __init__(self, dataset: Dataset, batch_size: int, shuffle: bool, seed: int | None, drop_last: bool = True,
                 collate_fn: Callable[[list[Any]], Any] | None = None, num_workers: int = 0,
                 sampler: Any = None) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        # seed None: draw one now and keep it in the state, so even an unseeded run resumes exactly.
        self.seed = int(seed) if seed is not None else random.SystemRandom().randrange(2**31)
        self.drop_last = bool(drop_last)
        self.collate_fn = collate_fn or default_collate
        self.num_workers = int(num_workers)
        self.sampler = sampler
        if sampler is not None and self.num_workers:
            raise ValueError("a sampler needs num_workers=0 (data.dataloader_num_workers): workers would prefetch")
        self.epoch = 0
        self.batches_done = 0
        if len(self) == 0:
            raise ValueError(f"dataset of {len(dataset)} rows yields no batch of {batch_size} (drop_last={drop_last})")

    def __len__(self) -> int:
        """Batches per epoch."""
        n = len(self.sampler) if self.sampler is not None and hasattr(self.sampler, "__len__") else len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def epoch_order(self, epoch: int) -> list[int]:
        """The dataset indices of ``epoch`` in visiting order."""
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(n, generator=g).tolist()

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        order = self.epoch_order(epoch)
        return [order[i * self.batch_size:(i + 1) * self.batch_size] for i in range(len(self))]

    def _sampler_batches(self) -> Iterator[list[int]]:
        """The rest of the epoch from a fresh ``iter(sampler)``, one batch drawn at a time."""
        indices = iter(self.sampler)
        for _ in itertools.islice(indices, self.batches_done * self.batch_size):
            pass  # resumed mid-epoch: skip what was already trained
        for _ in range(self.batches_done, len(self)):
            idx = [int(i) for i in itertools.islice(indices, self.batch_size)]
            if not idx or (self.drop_last and len(idx) < self.batch_size):
                return
            yield idx

    def __iter__(self) -> Iterator[Any]:
        if self.sampler is not None:
            drawn = (self.collate_fn([self.dataset[j] for j in idx]) for idx in self._sampler_batches())
            yield from self._counted(drawn)
            if self.batches_done:  # the sampler ran out before len(self) batches: the epoch is over
                self.epoch, self.batches_done = self.epoch + 1, 0
            return
        remaining = self.epoch_batches(self.epoch)[self.batches_done:]
        if self.num_workers > 0:
            items: Iterator[Any] = iter(DataLoader(self.dataset, batch_sampler=remaining, collate_fn=self.collate_fn,
                                                   num_workers=self.num_workers))
        else:
            items = (self.collate_fn([self.dataset[j] for j in idx]) for idx in remaining)
        yield from self._counted(items)

    def _counted(self, items: Iterator[Any]) -> Iterator[Any]:
        for batch in items:
            self.batches_done += 1
            if self.batches_done >= len(self):
                self.epoch, self.batches_done = self.epoch + 1, 0
            yield batch

    def state_dict(self) -> dict[str, Any]:
        state = {"epoch": self.epoch, "batches_done": self.batches_done, "seed": self.seed,
                 "shuffle": self.shuffle, "batch_size": self.batch_size, "drop_last": self.drop_last,
                 "dataset_len": len(self.dataset)}
        if self.sampler is not None and hasattr(self.sampler, "state_dict"):
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`.

        Raises:
            ValueError: the state was saved for another dataset size, batch size, shuffle or drop_last. A dataset
                that grows during training (``on_batch_end``, ``data.datagen``) is not held to its saved size.
        """
        mine = self.state_dict()
        growing = hasattr(self.dataset, "on_batch_end")
        for key in (("batch_size", "shuffle", "drop_last") if growing else
                    ("dataset_len", "batch_size", "shuffle", "drop_last")):
            if key in state and state[key] != mine[key]:
                raise ValueError(f"dataloader state has {key}={state[key]!r}, this loader has {mine[key]!r}")
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])
        if "sampler" in state and self.sampler is not None and hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(state["sampler"])


def build_dataloader(dataset: Dataset, batch_size: int, shuffle: bool, seed: int | None, drop_last: bool = True,
                     collate_fn: Callable[[list[Any]], Any] | None = None, num_workers: int = 0,
                     sampler: Any = None) -> ResumableDataLoader:
    """A :class:`ResumableDataLoader`; ``collate_fn`` defaults to :func:`rlhf_core.data.rl_dataset.collate_fn`."""
    return ResumableDataLoader(dataset, batch_size, shuffle, seed, drop_last, collate_fn, num_workers, sampler)
