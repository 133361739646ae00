"""Which RL dataset class a run uses (verl's ``create_rl_dataset``).

Its own module so the import arrows stay one-way: ``datagen`` (``DynamicGenDataset``) subclasses
``rl_dataset.RLHFDataset``, and this factory, above both, chooses between them.
"""
from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from rlhf_core.data.custom import load_custom_cls
from rlhf_core.data.datagen import DynamicGenDataset
from rlhf_core.data.rl_dataset import RLHFDataset

__all__ = ["create_rl_dataset"]


def create_rl_dataset(data_files: str | list[str], tokenizer: Any, config: Any, processor: Any = None,
                      max_samples: int = -1, is_train: bool = True) -> Dataset:
    """``config.custom_cls`` (a Dataset subclass loaded from a file) when set; else, for the training set,
    :class:`rlhf_core.data.datagen.DynamicGenDataset` when ``config.datagen.path`` is set; else :class:`RLHFDataset`.

    The class is called with the same arguments as ``RLHFDataset`` (verl's ``create_rl_dataset`` in
    ``verl/trainer/main_ppo.py``). Raises what ``load_custom_cls`` raises for a bad ``custom_cls``
    (:class:`rlhf_core.data.DataError` naming the file and class).
    """
    cls = load_custom_cls(config.custom_cls)
    if cls is None and is_train and config.datagen.path is not None:
        cls = DynamicGenDataset
    return (cls or RLHFDataset)(data_files=data_files, tokenizer=tokenizer, config=config, processor=processor,
                                max_samples=max_samples)
