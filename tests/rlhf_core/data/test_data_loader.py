"""build_dataloader: seeded epoch-dependent order, exact resume mid-epoch and at an epoch boundary."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.data import Dataset

from rlhf_core.data.loader import build_dataloader


class Numbers(Dataset):
    """Item i is {"x": tensor(i)}; a batch's x lists the dataset indices it holds."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"x": torch.tensor(i), "tag": f"row{i}"}


def xs(batch) -> list[int]:
    return batch["x"].tolist()


def stream(loader, epochs: int) -> list[list[int]]:
    return [xs(b) for _ in range(epochs) for b in loader]


def test_length_and_unshuffled_order():
    loader = build_dataloader(Numbers(10), batch_size=3, shuffle=False, seed=None)
    assert len(loader) == 3  # 10 // 3, the short batch [9] dropped
    assert stream(loader, 1) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    keep = build_dataloader(Numbers(10), batch_size=3, shuffle=False, seed=None, drop_last=False)
    assert len(keep) == 4 and stream(keep, 1)[-1] == [9]
    batch = next(iter(build_dataloader(Numbers(4), batch_size=2, shuffle=False, seed=0)))
    assert list(batch["tag"]) == ["row0", "row1"]  # default collate_fn -> Batch with object arrays


def test_shuffle_is_seeded_and_epoch_dependent():
    loader = build_dataloader(Numbers(12), batch_size=4, shuffle=True, seed=7)
    epochs = [sum(stream(loader, 1), []) for _ in range(2)]
    for e, order in enumerate(epochs):
        assert order == torch.randperm(12, generator=torch.Generator().manual_seed(7 + e)).tolist()
    assert epochs[0] != epochs[1]
    again = build_dataloader(Numbers(12), batch_size=4, shuffle=True, seed=7)
    assert sum(stream(again, 1), []) == epochs[0]


@pytest.mark.parametrize("stop_after", [1, 2, 3, 4, 5, 7])  # 3 batches/epoch: 3 and 6... are epoch boundaries
def test_resume_exactly(stop_after):
    ref = stream(build_dataloader(Numbers(10), batch_size=3, shuffle=True, seed=1), 3)  # 9 batches
    first = build_dataloader(Numbers(10), batch_size=3, shuffle=True, seed=1)
    seen = []
    it = iter(first)
    while len(seen) < stop_after:
        try:
            seen.append(xs(next(it)))
        except StopIteration:
            it = iter(first)
    state = copy.deepcopy(first.state_dict())
    resumed = build_dataloader(Numbers(10), batch_size=3, shuffle=True, seed=1)
    resumed.load_state_dict(state)
    rest = []
    while len(seen) + len(rest) < 9:
        rest += [xs(b) for b in resumed]
    assert seen + rest == ref


def test_epoch_boundary_resumes_with_the_next_epoch():
    loader = build_dataloader(Numbers(8), batch_size=4, shuffle=True, seed=3)
    epoch0 = stream(loader, 1)
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 0)
    resumed = build_dataloader(Numbers(8), batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    epoch1 = stream(resumed, 1)
    expected = torch.randperm(8, generator=torch.Generator().manual_seed(3 + 1)).tolist()
    assert sum(epoch1, []) == expected and epoch1 != epoch0


def test_unseeded_loader_still_resumes_exactly():
    a = build_dataloader(Numbers(9), batch_size=3, shuffle=True, seed=None)
    it = iter(a)
    next(it)
    b = build_dataloader(Numbers(9), batch_size=3, shuffle=True, seed=None)
    b.load_state_dict(a.state_dict())
    assert [xs(x) for x in b] == [xs(x) for x in it]


def test_workers_give_the_same_batches():
    plain = stream(build_dataloader(Numbers(8), batch_size=2, shuffle=True, seed=5), 1)
    workers = stream(build_dataloader(Numbers(8), batch_size=2, shuffle=True, seed=5, num_workers=1), 1)
    assert workers == plain


def test_state_mismatch_is_refused():
    state = build_dataloader(Numbers(10), batch_size=2, shuffle=True, seed=1).state_dict()
    with pytest.raises(ValueError, match="dataset_len"):
        build_dataloader(Numbers(12), batch_size=2, shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="no batch"):
        build_dataloader(Numbers(1), batch_size=2, shuffle=True, seed=1)
