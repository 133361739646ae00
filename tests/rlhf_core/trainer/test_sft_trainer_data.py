"""The SFT driver's data keys: data.num_workers (DataLoader worker processes read the samples, as verl's
StatefulDataLoader) and trainer.balance_batch (each global batch reordered so the ranks' shares hold similar
token counts, verl 0.9's sft_trainer_ray). The trainer is built without workers (they start in fit)."""
from __future__ import annotations

import os

import torch

from rlhf_core.protocol import Batch
from rlhf_core.trainer.sft_trainer import SFTTrainer

from tests.fixtures.config_fixtures import typed_config


class PidItems(torch.utils.data.Dataset):
    """4 samples; each records the process that read it."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([i]), "pid": os.getpid()}


def _trainer(tmp_path, *overrides):
    cfg = typed_config("sft_trainer", "data.train_batch_size=2", f"trainer.default_local_dir={tmp_path}",
                       *overrides)
    return SFTTrainer(cfg, PidItems(), PidItems())


def test_num_workers_reads_samples_in_worker_processes(tmp_path):
    here = os.getpid()
    pids = {int(p) for b in _trainer(tmp_path, "data.num_workers=2", "trainer.n_gpus_per_node=1").train_loader
            for p in b["pid"]}
    assert here not in pids and len(pids) >= 1  # every sample read by a DataLoader worker
    val = {int(p) for b in _trainer(tmp_path, "data.num_workers=2", "trainer.n_gpus_per_node=1").val_loader
           for p in b["pid"]}
    assert here not in val
    pids = {int(p) for b in _trainer(tmp_path, "data.num_workers=0", "trainer.n_gpus_per_node=1").train_loader
            for p in b["pid"]}
    assert pids == {here}  # 0: read in the driver


def test_balance_batch_evens_the_ranks_token_counts(tmp_path):
    # valid tokens per row 8, 7, 1, 2 over 2 ranks: contiguous shares 15 | 3. Greedy, longest first into the
    # share with fewer tokens: 8 → r0, 7 → r1, 2 → r1 (7 < 8), 1 → r0 (8 < 9) → rows [0, 2 | 1, 3], shares 9 | 9
    mask = torch.zeros(4, 8, dtype=torch.long)
    for row, n in enumerate((8, 7, 1, 2)):
        mask[row, :n] = 1
    batch = Batch({"input_ids": torch.arange(4)[:, None].expand(4, 8), "attention_mask": mask})
    on = _trainer(tmp_path, "trainer.n_gpus_per_node=2", "data.num_workers=0").balanced(batch)
    assert on["input_ids"][:, 0].tolist() == [0, 2, 1, 3]
    assert [int(on["attention_mask"][r * 2:(r + 1) * 2].sum()) for r in range(2)] == [9, 9]
    off = _trainer(tmp_path, "trainer.n_gpus_per_node=2", "data.num_workers=0",
                   "trainer.balance_batch=False").balanced(batch)
    assert off["input_ids"][:, 0].tolist() == [0, 1, 2, 3]
