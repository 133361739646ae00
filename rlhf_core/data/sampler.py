"""User samplers for the training dataloader (``data.sampler.class_path`` / ``class_name``, verl's curriculum hook).

verl (``main_ppo.create_rl_sampler``) loads the class from the file ``data.sampler.class_path``, constructs it as
``cls(data_source=dataset, data_config=config.data)`` and hands it to the training dataloader in place of the
seeded random/sequential order; a sampler that is an :class:`AbstractCurriculumSampler` gets
``sampler.update(batch=batch)`` after every training step (the step's full batch: rewards, advantages...), so
it can reorder what comes next. Indices are drawn lazily, one batch at a time, so an update takes effect from
the next batch on. Like verl this needs ``data.dataloader_num_workers: 0`` (workers would prefetch).

Resuming: a sampler with ``state_dict()``/``load_state_dict()`` has its state saved with the dataloader's;
otherwise the resumed run redraws the epoch and skips the batches already trained.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sized
from typing import Any

from torch.utils.data import Sampler

from rlhf_core.data.custom import load_extern_class


class AbstractSampler(Sampler[int]):
    """Base class of a user sampler: ``__init__(data_source, data_config)``, ``__iter__`` yields dataset indices."""

    @abstractmethod
    def __init__(self, data_source: Sized, data_config: Any):
        ...


class AbstractCurriculumSampler(AbstractSampler):
    """A sampler told about every finished training step through :meth:`update`."""

    @abstractmethod
    def update(self, batch: Any) -> None:
        """Called after each training step with that step's :class:`rlhf_core.protocol.Batch`."""


def create_rl_sampler(data_config: Any, dataset: Sized) -> Sampler | None:
    """The user sampler named by ``data.sampler`` for ``dataset``, or None (then the dataloader's own seeded order).

    Args:
        data_config: the ``data`` section (reads ``sampler.class_path``, ``sampler.class_name``,
            ``dataloader_num_workers``).
        dataset: the training dataset.

    Raises:
        FileNotFoundError / ImportError / AttributeError / ValueError: the class cannot be loaded (naming the key).
        TypeError: the class is not an :class:`AbstractSampler` (verl's requirement).
        ValueError: ``data.dataloader_num_workers`` is not 0 (prefetching workers would bypass the sampler's
            reordering; verl asserts the same).
    """
    spec = data_config.sampler
    cls = load_extern_class(spec.class_path, spec.class_name, "data.sampler", AbstractSampler,
                            path_key="class_path", name_key="class_name")
    if cls is None:
        return None
    if int(data_config.dataloader_num_workers) != 0:
        raise ValueError(f"data.sampler.class_path is set, so data.dataloader_num_workers must be 0 (got "
                         f"{data_config.dataloader_num_workers}): prefetching workers would bypass the sampler")
    return cls(data_source=dataset, data_config=data_config)
