"""The shared update loop on a one-weight model, where every step can be worked out by hand."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.workers.update_loop import UpdateSchedule, run_update


def one_weight_run(xs, micro: int, epochs: int = 1, grad_clip=None):
    """``y = w·x`` with w = 1, SGD lr 0.1, mini-batches of 2 rows, loss = Σ_rows w·x / n_tokens (one token per
    row), so each mini-batch's gradient is the mean of its x."""
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = Batch({"x": torch.tensor(xs).reshape(-1, 1), "response_mask": torch.ones(len(xs), 1)})
    seen = []

    def micro_loss(mb, n_tokens, n_seqs):
        seen.append((len(mb), n_tokens, n_seqs))
        loss = model(mb["x"]).sum() / n_tokens
        return loss, {"t/loss": float(loss.detach())}

    schedule = UpdateSchedule(ppo_epochs=epochs, mini_batch_size=2, micro_batch_size=micro, grad_clip=grad_clip)
    metrics = run_update("t", model, opt, batch, schedule, micro_loss)
    return metrics, float(model.weight.detach()), seen


def test_steps_counts_and_metric_means_by_hand():
    metrics, w, seen = one_weight_run([1.0, 2.0, 3.0, 5.0], micro=1)
    # mini-batch 1: grad = (1+2)/2 = 1.5 → w = 1 − 0.1·1.5 = 0.85; loss at w=1: 1.5
    # mini-batch 2: grad = (3+5)/2 = 4 → w = 0.85 − 0.4 = 0.45; loss at w=0.85: 0.85·4 = 3.4
    assert w == pytest.approx(0.45, abs=1e-6)
    assert metrics["t/loss"] == pytest.approx((1.5 + 3.4) / 2, abs=1e-6)  # mean over mini-batches
    assert metrics["t/grad_norm"] == pytest.approx((1.5 + 4.0) / 2, abs=1e-6)
    assert metrics["t/skipped_steps"] == 0.0
    assert seen == [(1, 2.0, 2.0)] * 4  # one row per micro-batch; counts are the whole mini-batch's


def test_micro_batch_split_does_not_change_the_update():
    one = one_weight_run([1.0, 2.0, 3.0, 5.0], micro=1, epochs=2)
    two = one_weight_run([1.0, 2.0, 3.0, 5.0], micro=2, epochs=2)
    assert one[1] == pytest.approx(two[1], abs=1e-7) and one[0] == pytest.approx(two[0], abs=1e-7)


def test_non_finite_gradient_skips_only_that_step_and_counts_it():
    metrics, w, _ = one_weight_run([1.0, 2.0, 3.0, float("nan")], micro=2)
    assert w == pytest.approx(0.85, abs=1e-6)  # the first step ran, the NaN mini-batch's step did not
    assert metrics["t/skipped_steps"] == 1.0  # a sum over mini-batches, not a mean
    assert math.isnan(metrics["t/grad_norm"])


def test_grad_clip_scales_the_step():
    _, w, _ = one_weight_run([4.0, 4.0], micro=2, grad_clip=1.0)
    assert w == pytest.approx(1.0 - 0.1 * 1.0, abs=1e-6)  # grad 4 clipped to norm 1


def test_distillation_extrema_are_reduced_by_min_and_max():
    # verl AggregationType.MIN / MAX: distillation/loss_min and loss_max over micro-batches and mini-batches are the
    # smallest / largest value, not sums nor means. Rows x = [1, 2, 3, 5], one row per micro-batch, two mini-batches:
    # per micro-batch loss_min = loss_max = x → loss_min = 1, loss_max = 5; a summed metric still sums per mini-batch
    # and averages over mini-batches: ((1 + 2) + (3 + 5)) / 2 = 5.5.
    model = torch.nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    batch = Batch({"x": torch.tensor([1.0, 2.0, 3.0, 5.0]).reshape(-1, 1), "response_mask": torch.ones(4, 1)})

    def micro_loss(mb, n_tokens, n_seqs):
        x = float(mb["x"].sum())
        return model(mb["x"]).sum() * 0, {"distillation/loss_min": x, "distillation/loss_max": x, "t/sum": x}

    schedule = UpdateSchedule(ppo_epochs=1, mini_batch_size=2, micro_batch_size=1)
    metrics = run_update("t", model, opt, batch, schedule, micro_loss)
    assert (metrics["distillation/loss_min"], metrics["distillation/loss_max"], metrics["t/sum"]) == (1.0, 5.0, 5.5)
