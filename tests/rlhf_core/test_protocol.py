"""Batch: the driver/worker container keeps rows aligned through every reshaping."""
import numpy as np
import pytest
import torch

from rlhf_core.protocol import Batch


def _batch() -> Batch:
    return Batch.from_dict(
        {
            "input_ids": torch.arange(12).reshape(4, 3),
            "uid": np.array(["a", "b", "c", "d"], dtype=object),
            "reward_model": [{"ground_truth": str(i)} for i in range(4)],
        },
        meta={"temperature": 1.0},
    )


def test_repeat_interleave_keeps_groups_adjacent():
    # verl's repeat(interleave=True): p1,p1,p2,p2 — not p1,p2,p1,p2
    rep = _batch().repeat_interleave(2)
    assert list(rep["uid"]) == ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert rep["input_ids"][:, 0].tolist() == [0, 0, 3, 3, 6, 6, 9, 9]
    assert rep["reward_model"][3] == {"ground_truth": "1"}


def test_chunk_and_concat_round_trip():
    b = _batch()
    parts = b.chunk(2)
    assert [len(p) for p in parts] == [2, 2]
    assert list(parts[1]["uid"]) == ["c", "d"]
    back = Batch.concat(parts)
    assert torch.equal(back["input_ids"], b["input_ids"]) and list(back["uid"]) == list(b["uid"])
    assert back.meta == {"temperature": 1.0}


def test_chunk_refuses_uneven_split():
    with pytest.raises(ValueError, match="4 sequences into 3"):
        _batch().chunk(3)


def test_mismatched_sizes_are_rejected():
    with pytest.raises(ValueError, match="disagree"):
        Batch.from_dict({"a": torch.zeros(3), "b": np.array([1, 2], dtype=object)})


def test_index_and_select():
    b = _batch()
    sub = b.index([3, 0])
    assert list(sub["uid"]) == ["d", "a"] and sub["input_ids"][0].tolist() == [9, 10, 11]
    assert b.select(["uid"]).keys() == ["uid"]
    with pytest.raises(KeyError, match="nope"):
        b.select(["nope"])


def test_merge_adds_and_replaces_fields_and_meta():
    b = _batch()
    # a rollout's output: longer input_ids replace the prompts', a new tensor and a new column are added
    out = Batch.from_dict({"input_ids": torch.ones(4, 5, dtype=torch.long), "score": torch.tensor([1.0, 2, 3, 4]),
                           "acc": [True, False, True, True]}, meta={"temperature": 0.5, "step": 3})
    both = b.merge(out)
    assert set(both.keys()) == {"input_ids", "uid", "reward_model", "score", "acc"}
    assert both["input_ids"].shape == (4, 5) and both["score"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert list(both["uid"]) == ["a", "b", "c", "d"] and list(both["acc"]) == [True, False, True, True]
    assert both.meta == {"temperature": 0.5, "step": 3}
    assert b["input_ids"].shape == (4, 3) and "score" not in b and b.meta == {"temperature": 1.0}  # b unchanged
    assert b.merge(Batch(meta={"x": 1})).meta == {"temperature": 1.0, "x": 1}  # an empty batch adds only meta
    with pytest.raises(ValueError, match="2 rows into a batch of 4"):
        b.merge(Batch.from_dict({"score": torch.zeros(2)}))


def test_own_storage_copies_only_views_of_larger_storages():
    import pickle

    full = Batch({"input_ids": torch.arange(4000).reshape(8, 500), "scores": torch.arange(8.0)},
                 {"uid": list("aabbccdd")})
    shard = full.chunk(4)[1]  # rows 2-3: views of the (8, 500) and (8,) storages
    own = shard.own_storage()
    for k in ("input_ids", "scores"):
        assert torch.equal(own[k], full[k][2:4])
        assert own[k].untyped_storage().nbytes() == own[k].numel() * own[k].element_size()
    assert list(own["uid"]) == ["b", "b"]
    # pickle writes a view's whole storage: 8 rows of 500 int64 (32,000 bytes) for a 2-row shard (8,000 bytes)
    assert len(pickle.dumps(shard)) > 32_000 > 9_000 > len(pickle.dumps(own))
    # a tensor that already owns its storage is passed on, not copied
    assert own.own_storage()["input_ids"] is own["input_ids"]


def test_worker_host_returns_batches_owning_their_storage():
    from rlhf_core.distributed.worker_group import _WorkerHost

    class Worker:
        def rows(self, batch):
            return batch.index(slice(0, 1))  # a view of the input's storage

    host = _WorkerHost()
    host.worker = Worker()
    out = host.call("rows", Batch({"x": torch.arange(100).reshape(10, 10)}))
    assert torch.equal(out["x"], torch.arange(10)[None])
    assert out["x"].untyped_storage().nbytes() == 10 * 8  # one row of int64, not the 10 x 10 input
