"""Reward functions that fail: the failing sample scores 0, a warning names it and its cause, ``reward_error`` marks
it and ``reward/num_errors`` counts it; the other samples keep their scores. Failures that concern every sample
(an unknown data source, a batch function returning the wrong number of scores) stop with a message."""
from __future__ import annotations

import logging
import math
import textwrap

import pytest
import torch

from rlhf_core.reward import BatchRewardManager, NaiveRewardManager, PrimeRewardManager, load_custom_reward_function
from rlhf_core.reward.scorers import UnknownDataSourceError

from bad_input_fixtures import hang_scorer

from tests.fixtures.reward_fixtures import CharTokenizer, make_batch  # noqa: E402

BAD = """
import math

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "raise":
        raise ZeroDivisionError("scorer bug")
    return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "none": None, "text": "1.0"}.get(
        solution_str, float(solution_str == ground_truth))
"""


@pytest.fixture()
def bad_scorer(tmp_path):
    path = tmp_path / "bad_reward.py"
    path.write_text(textwrap.dedent(BAD))
    return load_custom_reward_function(str(path))


def _score(manager, responses):
    tok = CharTokenizer()
    batch = make_batch(tok, ["p"] * len(responses), responses, ["a"] * len(responses), ["src"] * len(responses))
    return manager(batch, return_dict=True)


@pytest.mark.parametrize("bad, cause", [
    ("raise", "raised ZeroDivisionError: scorer bug"),
    ("nan", "the reward function returned nan"),
    ("inf", "the reward function returned inf"),
    ("-inf", "the reward function returned -inf"),
    ("none", "the reward function returned None, not a number"),
    ("text", "the reward function returned '1.0', not a number"),
])
def test_failed_sample_scores_zero_logged_and_counted(bad_scorer, caplog, bad, cause):
    manager = NaiveRewardManager(CharTokenizer(), compute_score=bad_scorer)
    with caplog.at_level(logging.WARNING, logger="rlhf_core.reward.managers"):
        out = _score(manager, ["a", bad, "a"])
    # "a" + EOS = 2 valid tokens: the score sits at index 1; the failed middle sample is 0 everywhere
    expected = torch.zeros(3, 40)
    expected[0, 1] = expected[2, 1] = 1.0
    assert torch.equal(out["reward_tensor"], expected)
    assert out["reward_extra_info"]["reward_error"] == [0, 1, 0]
    [record] = [r for r in caplog.records if r.name == "rlhf_core.reward.managers"]
    assert "1 of 3 samples scored 0" in record.message and "sample 1 (data_source 'src')" in record.message
    assert cause in record.message


def test_num_errors_metric_counts_failed_samples(bad_scorer):
    # the trainer's data metrics sum reward_error: 2 failed of 4 → reward/num_errors = 2 (0 for a clean batch)
    from rlhf_core.metrics.training import reward_failure_metrics
    from rlhf_core.protocol import Batch

    out = _score(NaiveRewardManager(CharTokenizer(), compute_score=bad_scorer), ["nan", "a", "raise", "b"])
    batch = Batch(non_tensors={"reward_error": out["reward_extra_info"]["reward_error"]})
    assert reward_failure_metrics(batch) == {"reward/num_errors": 2.0}
    assert reward_failure_metrics(Batch()) == {"reward/num_errors": 0.0}


def test_unknown_data_source_still_stops(tmp_path):
    manager = NaiveRewardManager(CharTokenizer())  # the default scorer knows gsm8k, MATH, countdown
    with pytest.raises(UnknownDataSourceError, match=r"no default reward function for data_source='src'"):
        _score(manager, ["a"])


def test_batch_function_returning_wrong_length_is_named(tmp_path):
    path = tmp_path / "batch_reward.py"
    path.write_text("def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
                    "    return [1.0] * (len(solution_strs) - 1)\n")
    manager = BatchRewardManager(CharTokenizer(), compute_score=load_custom_reward_function(str(path)))
    with pytest.raises(ValueError) as info:
        _score(manager, ["a", "b", "c"])
    assert f"batch reward function FileRewardFunction({str(path)!r}, 'compute_score') returned 2 scores for 3 " \
           "samples" in str(info.value)


def test_batch_function_nan_entry_scores_zero(tmp_path):
    path = tmp_path / "batch_reward.py"
    path.write_text("def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
                    "    return [1.0, float('nan'), None]\n")
    manager = BatchRewardManager(CharTokenizer(), compute_score=load_custom_reward_function(str(path)))
    out = _score(manager, ["a", "b", "c"])
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.0]
    assert out["reward_extra_info"]["reward_error"] == [0, 1, 1]


def test_dapo_failed_sample_acc_is_zero_not_a_crash(bad_scorer):
    from rlhf_core.reward import DAPORewardManager

    out = _score(DAPORewardManager(CharTokenizer(), compute_score=bad_scorer), ["a", "none", "raise"])
    assert out["reward_extra_info"]["acc"] == [1.0, 0.0, 0.0]
    assert out["reward_extra_info"]["reward_error"] == [0, 1, 1]


def test_hanging_scorer_times_out_scores_zero_and_is_counted():
    # prime kills the worker of the hung sample after timeout_s (from when a worker picks it up) and scores it 0
    manager = PrimeRewardManager(CharTokenizer(), compute_score=hang_scorer, timeout_s=5.0, num_processes=2)
    try:
        out = _score(manager, ["a", "hang", "b"])
    finally:
        manager.close()
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.0]
    assert out["reward_extra_info"]["reward_timeout"] == [0, 1, 0]
    assert manager.num_timeouts == 1 and manager.num_errors == 0


def test_prime_counts_a_returned_nan_as_an_error(bad_scorer):
    manager = PrimeRewardManager(CharTokenizer(), compute_score=bad_scorer, timeout_s=60.0, num_processes=1)
    try:
        out = _score(manager, ["nan", "a"])
    finally:
        manager.close()
    assert out["reward_tensor"].sum(-1).tolist() == [0.0, 1.0] and not math.isnan(out["reward_tensor"].sum())
    assert out["reward_extra_info"]["reward_error"] == [1, 0]


def test_eval_scorer_failure_scores_zero_and_is_counted(tmp_path, caplog, bad_scorer):
    import pandas as pd

    from rlhf_core.config import load_config
    from rlhf_core.trainer.evaluation import run_evaluation

    data = tmp_path / "resp.parquet"
    pd.DataFrame({"data_source": ["src", "src"], "prompt": ["q0", "q1"],
                  "responses": [["a", "nan"], ["raise", "a"]],
                  "reward_model": [{"ground_truth": "a"}, {"ground_truth": "a"}]}).to_parquet(data)
    cfg = load_config("evaluation", [f"data.path={data}", f"custom_reward_function.path={bad_scorer.path}",
                                     "ray_init.num_cpus=1"])
    with caplog.at_level(logging.WARNING, logger="rlhf_core.trainer.evaluation"):
        metrics = run_evaluation(cfg)
    # each prompt: one right (1) and one failed (0) response → test_score = mean(0.5, 0.5) = 0.5; 2 failures
    assert metrics["test_score/src"] == 0.5 and metrics["reward/num_errors/src"] == 2.0
    assert "row 0 response 1: the reward function returned nan" in caplog.text
    assert "row 1 response 0: ZeroDivisionError: scorer bug" in caplog.text
