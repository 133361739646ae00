"""A training dataset that grows during training (``data.datagen.path`` / ``name``, verl's ``DynamicGenDataset``).

verl 0.6 (``experimental/dynamic_dataset``): when ``data.datagen.path`` is set (and no ``custom_cls``), the
*training* dataset is a ``DynamicGenDataset``: it loads the class ``data.datagen.name`` from that file (an
:class:`AbstractDataGenerator` subclass), builds it with ``data.datagen`` as its config, calls
``generate(dataset)`` once at construction and again after every training step (``on_batch_end(batch)``), and
appends the returned rows. The validation dataset is never dynamic. Appended rows are validated like file rows
and pass the overlong filter when ``data.filter_overlong_prompts`` is on. The dataloader visits the new rows
from the next epoch on (its order is drawn at the start of each epoch).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from rlhf_core.data import DataError
from rlhf_core.data.custom import load_extern_class
from rlhf_core.data.prompts import keep_short_prompts
from rlhf_core.data.readers import RowSource
from rlhf_core.data.rl_dataset import RLHFDataset


class AbstractDataGenerator(ABC):
    """Base class of a ``data.datagen`` generator; constructed as ``cls(config.data.datagen)``."""

    def __init__(self, config: Any):
        self.config = config

    @abstractmethod
    def generate(self, dataset: "DynamicGenDataset") -> Any:
        """New rows for ``dataset``: a list of row dicts in the dataset's schema (a ``datasets.Dataset`` or
        pandas ``DataFrame`` is accepted too)."""


def _as_rows(generated: Any, where: str) -> list[dict[str, Any]]:
    if hasattr(generated, "to_dict") and hasattr(generated, "columns"):  # pandas DataFrame
        generated = generated.to_dict("records")
    elif hasattr(generated, "to_list"):  # HF datasets.Dataset, as verl's generators return
        generated = generated.to_list()
    if not isinstance(generated, list) or not all(isinstance(r, dict) for r in generated):
        raise DataError(f"{where}.generate must return a list of row dicts, got {type(generated).__name__}")
    return generated


class DynamicGenDataset(RLHFDataset):
    """:class:`RLHFDataset` plus the rows a ``data.datagen`` generator adds at start and after each step.

    Raises:
        FileNotFoundError / ImportError / AttributeError / ValueError: ``data.datagen`` cannot be loaded.
        TypeError: the class is not an :class:`AbstractDataGenerator` subclass.
        DataError: a generated row is malformed (naming the generator, the call and the row).
    """

    def __init__(self, data_files: str | list[str], tokenizer: Any, config: Any, processor: Any = None,
                 max_samples: int = -1) -> None:
        super().__init__(data_files, tokenizer, config, processor, max_samples)
        spec = config.datagen
        cls = load_extern_class(spec.path, spec.name, "data.datagen", AbstractDataGenerator)
        if cls is None:
            raise ValueError("DynamicGenDataset needs data.datagen.path (and data.datagen.name)")
        self.generator_name = f"data.datagen {spec.path}:{spec.name}"
        self.data_generator = cls(spec)
        self.generations = 0
        self.on_batch_end(None)

    def on_batch_end(self, batch: Any) -> None:
        """Ask the generator for rows and append the valid, short-enough ones (``batch``: the finished step's)."""
        self.generations += 1
        where = f"{self.generator_name} call {self.generations}"
        new = _as_rows(self.data_generator.generate(self), self.generator_name)
        sources = [RowSource(where, j) for j in range(len(new))]
        for row, src in zip(new, sources):
            self._validate_row(row, src)
        keep = list(range(len(new)))
        if self.config.filter_overlong_prompts and new:
            keep = keep_short_prompts(self.tokenizer, [r[self.prompt_key] for r in new], self.max_prompt_length,
                                      1, self.apply_chat_template_kwargs)
        elif self.truncation == "error" and new:
            self._check_lengths(self.tokenizer, new, sources, list(range(len(new))), 1)
        start = max(self.row_numbers, default=-1) + 1
        self.rows += [new[k] for k in keep]
        self.sources += [sources[k] for k in keep]
        self.row_numbers += [start + k for k in keep]
