"""Training metrics: critic/*, response_length/*, prompt_length/*, timing_*, perf/*, reduce_metrics."""
from __future__ import annotations

import pytest
import torch

from rlhf_core.metrics.training import (
    compute_data_metrics, compute_throughput_metrics, compute_timing_metrics, reduce_metrics,
)
from rlhf_core.protocol import Batch


def _batch() -> Batch:
    """B = 2, P = 3, T = 4. Row 0: prompt 2 tokens, response 2; row 1: prompt 3 (= P), response 4 (= T).
    Padding positions hold junk (99, 50, -50) that must never reach a metric."""
    t = lambda rows: torch.tensor(rows, dtype=torch.float32)  # noqa: E731
    return Batch.from_dict({
        "attention_mask": torch.tensor([[0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]]),
        "responses": torch.zeros(2, 4, dtype=torch.long),
        "response_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]),
        "token_level_scores": t([[0, 1, 0, 0], [0, 0, 0, 0.5]]),
        "token_level_rewards": t([[0.1, 0.9, 0, 0], [0, 0, 0, 0.2]]),
        "advantages": t([[1, 2, 99, 99], [-1, 0, 0, 3]]),
        "returns": t([[1, 1, 50, 50], [2, 2, 2, 2]]),
        "values": t([[1, 1, -50, -50], [2, 2, 2, 0]]),
    })


def test_data_metrics_by_hand():
    m = compute_data_metrics(_batch(), use_critic=True)
    # per-sequence sums: scores 1.0 and 0.5; rewards 1.0 and 0.2
    assert m["critic/score/mean"] == pytest.approx(0.75) and m["critic/score/min"] == pytest.approx(0.5)
    assert m["critic/rewards/mean"] == pytest.approx(0.6) and m["critic/rewards/max"] == pytest.approx(1.0)
    # valid advantages 1, 2, -1, 0, 0, 3 → mean 5/6
    assert m["critic/advantages/mean"] == pytest.approx(5 / 6)
    assert (m["critic/advantages/max"], m["critic/advantages/min"]) == (3.0, -1.0)
    # valid returns 1, 1, 2, 2, 2, 2 → mean 10/6; valid values 1, 1, 2, 2, 2, 0 → mean 8/6
    assert m["critic/returns/mean"] == pytest.approx(10 / 6) and m["critic/values/mean"] == pytest.approx(8 / 6)
    assert m["critic/values/min"] == 0.0
    # returns − values = 0,0,0,0,0,2: unbiased var = (5·(1/3)² + (5/3)²)/5 = 2/3;
    # Var(returns) = (2·(2/3)² + 4·(1/3)²)/5 = 4/15 → explained var = 1 − (2/3)/(4/15 + 1e-5) ≈ −1.4999
    assert m["critic/vf_explained_var"] == pytest.approx(1 - (2 / 3) / (4 / 15 + 1e-5), rel=1e-5)
    # response lengths 2 and 4 (T = 4 → half clipped); prompt lengths 2 and 3 (P = 3 → half clipped)
    assert (m["response_length/mean"], m["response_length/max"], m["response_length/min"]) == (3.0, 4.0, 2.0)
    assert m["response_length/clip_ratio"] == 0.5
    assert (m["prompt_length/mean"], m["prompt_length/max"], m["prompt_length/min"]) == (2.5, 3.0, 2.0)
    assert m["prompt_length/clip_ratio"] == 0.5


def test_data_metrics_without_critic_has_no_values():
    batch = _batch()
    del batch.tensors["values"]
    m = compute_data_metrics(batch, use_critic=False)
    assert not any(k.startswith("critic/values") for k in m) and "critic/vf_explained_var" not in m
    with pytest.raises(KeyError, match="values"):
        compute_data_metrics(batch, use_critic=True)


def test_timing_metrics_per_token():
    timing = {"gen": 0.6, "update_actor": 1.1, "reward": 0.1, "step": 2.0}
    m = compute_timing_metrics(_batch(), timing)
    assert m["timing_s/gen"] == 0.6 and m["timing_s/step"] == 2.0
    # gen per response token: 6 response tokens → 0.6 s · 1000 / 6 = 100 ms
    assert m["timing_per_token_ms/gen"] == pytest.approx(100.0)
    # update_actor per prompt+response token: 5 + 6 = 11 → 1100 ms / 11 = 100 ms
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(100.0)
    assert "timing_per_token_ms/reward" not in m and "timing_per_token_ms/step" not in m


def test_throughput():
    batch = _batch()
    # 11 valid tokens in 2 s over 2 workers → 11 / (2·2) = 2.75 tokens/s per worker
    m = compute_throughput_metrics(batch, {"step": 2.0}, n_workers=2)
    assert m == {"perf/total_num_tokens": 11.0, "perf/time_per_step": 2.0, "perf/throughput": 2.75}
    batch.meta["global_token_num"] = [10, 30]  # when the trainer recorded token counts, they win
    assert compute_throughput_metrics(batch, {"step": 4.0}, n_workers=1)["perf/throughput"] == 10.0
    with pytest.raises(KeyError, match="step"):
        compute_throughput_metrics(batch, {"gen": 1.0}, n_workers=1)
    with pytest.raises(ValueError):
        compute_throughput_metrics(batch, {"step": 1.0}, n_workers=0)


def test_reduce_metrics_both_forms():
    assert reduce_metrics({"a": [1.0, 2.0, 3.0], "b": 4}) == {"a": 2.0, "b": 4.0}
    assert reduce_metrics([{"a": 1.0}, {"a": 3.0, "b": torch.tensor(5.0)}]) == {"a": 2.0, "b": 5.0}
    assert reduce_metrics({"empty": []}) == {}
