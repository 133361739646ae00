"""Driver helpers: batch balancing, rollout dumps, padding, rank-metric reduction, MFU estimate."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.trainer.mfu import device_peak_flops, estimate_mfu, matmul_params
from rlhf_core.trainer.driver_utils import balance_batch, dump_rollouts, mean_rank_metrics, pad_to_divisor, unpad


def _mask_batch(lengths, width=8):
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return Batch({"attention_mask": mask, "row": torch.arange(len(lengths))})


def test_balance_batch_equalises_shard_tokens():
    batch = _mask_batch([8, 7, 1, 1])  # shards as given: 15 and 2 tokens
    out, m = balance_batch(batch, 2)
    shards = [s["attention_mask"].sum().item() for s in out.chunk(2)]
    # greedy: 8 → shard 0, 7 → shard 1, 1 → shard 1 (7 < 8), 1 → shard 0 → totals 9 and 8
    assert sorted(shards) == [8, 9]
    assert sorted(out["row"].tolist()) == [0, 1, 2, 3]
    assert m["global_seqlen/minmax_diff"] == 13 and m["global_seqlen/balanced_max"] == 9
    same, none = balance_batch(batch, 1)
    assert same is batch and none == {}


def test_pad_and_unpad_roundtrip():
    batch = Batch({"x": torch.arange(5)})
    padded, pad = pad_to_divisor(batch, 4)
    assert pad == 3 and padded["x"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert unpad(padded, pad)["x"].tolist() == [0, 1, 2, 3, 4]


def test_mean_rank_metrics_flattens_lists():
    got = mean_rank_metrics([{"a": [1.0, 3.0], "b": 2}, {"a": 5.0}, Batch(meta={"metrics": {"b": torch.tensor(4.0)}})])
    assert got == {"a": 3.0, "b": 3.0}


def test_dump_rollouts_jsonl(tmp_path):
    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return ",".join(map(str, ids))

    batch = Batch({"prompts": torch.tensor([[0, 5, 6]]), "responses": torch.tensor([[7, 8, 0]]),
                   "attention_mask": torch.tensor([[0, 1, 1, 1, 1, 0]]), "response_mask": torch.tensor([[1, 1, 0]]),
                   "token_level_scores": torch.tensor([[0.0, 1.0, 0.0]])},
                  {"uid": ["u"], "acc": [1.0]})
    path = dump_rollouts(batch, Tok(), str(tmp_path), 4)
    rows = [json.loads(line) for line in open(path)]
    assert rows == [{"input": "5,6", "output": "7,8", "score": 1.0, "step": 4, "acc": 1.0}]


def test_mfu_estimate():
    cfg = SimpleNamespace(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, vocab_size=1000)
    # per layer: q,o 64·64 each; k,v 64·32 each → 12288; mlp 3·64·128 = 24576; embedding + LM head 2·64 000 (verl)
    assert matmul_params(cfg) == 2 * (12288 + 24576) + 128000
    flops = 6 * matmul_params(cfg) * 10 + 6 * 2 * 64 * 100  # attention: 6 · L · heads·head_dim · seqlen²
    assert estimate_mfu(cfg, [10], 1.0, device_peak_flops("NVIDIA H200"), 1) == pytest.approx(flops / 989e12)
    assert estimate_mfu(cfg, [10], 1.0, None, 1) is None  # unknown peak: no MFU, never a false 0
    assert device_peak_flops("Some Future GPU") is None and device_peak_flops(None) is None
    assert device_peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and device_peak_flops("NVIDIA L40S") == 362e12
