"""Micro/mini-batching rules and the FSDP wrap policy (pure functions, no process group)."""
from __future__ import annotations

import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.workers.batching import micro_batches, mini_batches, split_to_count, token_budget_partition


def _batch(lens: list[int], width: int = 8) -> Batch:
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lens])
    return Batch({"attention_mask": mask, "row": torch.arange(len(lens))})


def test_token_budget_packs_consecutive_rows():
    # budget 10: [4,5] = 9, then 3+6 = 9, then 8
    assert token_budget_partition([4, 5, 3, 6, 8], 10) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu=5"):
        token_budget_partition([4, 6], 5, "ppo_max_token_len_per_gpu")


def test_micro_batches_by_count_and_by_tokens_keep_order():
    b = _batch([4, 5, 3, 6, 8])
    by_count = micro_batches(b, 2)
    assert [mb["row"].tolist() for mb in by_count] == [[0, 1], [2, 3], [4]]
    by_tokens = micro_batches(b, None, use_dynamic_bsz=True, max_token_len=10)
    assert [mb["row"].tolist() for mb in by_tokens] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="micro-batch size"):
        micro_batches(b, None)


def test_split_to_count_halves_the_heaviest_group_at_its_token_midpoint():
    lens = [4, 5, 3, 6, 8]
    # one group of 26 tokens -> 2: running sums 4, 9, 12, 18 against the midpoint 13; 12 is nearest (|26 - 24| = 2)
    assert split_to_count([[0, 1, 2, 3, 4]], lens, 2) == [[0, 1, 2], [3, 4]]
    # -> 3: [0,1,2] has 12 tokens and [3,4] 14, so [3,4] splits (6 | 8)
    assert split_to_count([[0, 1, 2, 3, 4]], lens, 3) == [[0, 1, 2], [3], [4]]
    # [0,1] and [2,3] hold 9 tokens each: the first of them splits; a one-row group ([4]) never does
    assert split_to_count([[0, 1], [2, 3], [4]], lens, 4) == [[0], [1], [2, 3], [4]]
    assert split_to_count([[0, 1], [2]], lens, 2) == [[0, 1], [2]]  # already there
    with pytest.raises(ValueError, match="cannot run 4 micro-batches over 3 rows"):
        split_to_count([[0, 1], [2]], lens, 4)


def test_mini_batch_shuffle_is_seeded_and_changes_per_call_and_epoch():
    b = _batch([1] * 8)

    def rows(epoch, seed, call):
        return [m["row"].tolist() for m in mini_batches(b, 4, epoch, True, seed, call)]

    assert rows(0, 1, 0) == rows(0, 1, 0)
    assert rows(0, 1, 0) != rows(1, 1, 0) and rows(0, 1, 0) != rows(0, 1, 1)
    assert sorted(sum(rows(0, 1, 0), [])) == list(range(8))
    assert [m["row"].tolist() for m in mini_batches(b, 4, 0, False, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_wrap_policy_decoder_layers_or_min_num_params(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlhf_core.workers.fsdp_utils import _modules_to_wrap

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    layers = _modules_to_wrap(model, 0)
    assert [type(m).__name__ for m in layers] == ["Qwen2DecoderLayer", "Qwen2DecoderLayer"]
    # 64·128·3 = 24,576 parameters per MLP; attention (q 64·64+64, k/v 64·32+32, o 64·64) = 12,480
    picked = _modules_to_wrap(model, 20_000)
    assert [type(m).__name__ for m in picked] == ["Qwen2MLP", "Qwen2MLP"]
    assert all(not isinstance(m, torch.nn.Embedding) for m in _modules_to_wrap(model, 1))
