"""Countdown: the scorer (by data_source), the generator (fixed seed, verl schema, format-only warm-up answers)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from rlhf_core.data.cli import main as data_main
from rlhf_core.data.countdown import flat_expressions, generate_countdown, question, reachable_values
from rlhf_core.reward import default_compute_score
from rlhf_core.reward.scorers import countdown

TRUTH = json.dumps({"target": 14, "numbers": [3, 4, 2]})


@pytest.mark.parametrize(
    "response, score, acc",
    [
        ("3*4+2", 1.0, True),  # 12 + 2 = 14
        ("2+4*3", 1.0, True),  # another valid answer: precedence gives 2 + 12
        ("(3+4)*2", 1.0, True),  # parentheses are allowed: 7 * 2
        ("3*4+2 = 14", 1.0, True),  # a trailing "= N" is dropped
        ("thinking...\n3*4+2", 1.0, True),  # the last line counts
        ("3+4+2", 0.0, False),  # 9: well formed, wrong value → format_score 0
        ("3*4+2+0", 0.0, False),  # 14, but 0 is not one of the numbers
        ("12+2", 0.0, False),  # 14, but not the given numbers
        ("3*4*2-10", 0.0, False),
        ("7*2", 0.0, False),  # uses numbers that were not given
        ("3*4+2+2-2", 0.0, False),  # 2 used three times
        ("-3+4*2+9", 0.0, False),  # unary minus is not allowed (and 9 was not given)
        ("3**4+2", 0.0, False),  # ** is not an allowed operator
        ("3*4+2 and more", 0.0, False),
        ("", 0.0, False),
    ],
)
def test_countdown_scorer(response, score, acc):
    out = default_compute_score("countdown", response, TRUTH)
    assert out["score"] == score and out["acc"] is acc


def test_countdown_scorer_format_score_and_dict_truth():
    truth = {"target": 14, "numbers": [3, 4, 2]}  # TinyZero's layout
    assert countdown.compute_score("3+4+2", truth, format_score=0.1)["score"] == 0.1  # right numbers, wrong value
    assert countdown.compute_score("3+4", truth, format_score=0.1)["score"] == 0.0  # a number missing: no format credit
    assert countdown.evaluate_expression("2+4*3") == (14, [2, 4, 3])
    assert countdown.evaluate_expression("__import__('os')") is None
    with pytest.raises(ValueError, match="countdown ground truth"):
        countdown.compute_score("1+2", '{"target": 3}')


@pytest.mark.parametrize(
    "response, score",
    [
        ("3*4+2", 1.0),  # a hit scores `score`, whatever the shaping
        ("3+4+2", 0.1 + 0.5 * (1 - 5 / 14)),  # 9 misses 14 by 5: format 0.1 + 0.5 x closeness (1 - 5/14)
        ("3*4*2", 0.1 + 0.5 * (1 - 10 / 14)),  # 24 misses 14 by 10
        ("3+4", 0.0),  # a number missing: neither format nor distance credit
    ],
)
def test_countdown_distance_score_pays_a_miss_by_closeness(response, score):
    truth = {"target": 14, "numbers": [3, 4, 2]}
    out = countdown.compute_score(response, truth, format_score=0.1, distance_score=0.5)
    assert out["score"] == pytest.approx(score, abs=1e-12)
    assert out["acc"] is (response == "3*4+2")


def test_countdown_distance_score_clips_at_zero_and_is_off_by_default():
    far = {"target": 4, "numbers": [3, 4]}  # 3*4 = 12 misses 4 by 8 > 4: closeness 1 - 8/4 < 0, clipped to 0
    assert countdown.compute_score("3*4", far, distance_score=0.5)["score"] == 0.0
    assert countdown.compute_score("3+4+2", {"target": 14, "numbers": [3, 4, 2]})["score"] == 0.0  # default: 0
    # targets a user's data may hold: 0 and negative ones are scaled by max(1, |target|), never divided by 0
    assert countdown.compute_score("3-3", {"target": 0, "numbers": [3, 3]}, distance_score=0.5)["score"] == 1.0
    assert countdown.compute_score("3*3", {"target": 0, "numbers": [3, 3]}, distance_score=0.5)["score"] == 0.0
    assert countdown.compute_score("3*3", {"target": 0, "numbers": [3, 3]})["score"] == 0.0  # no shaping: no division
    # 3-4 = -1 misses -5 by 4: closeness 1 - 4/5 = 0.2 → 0.5 x 0.2; a miss never outscores a hit
    assert countdown.compute_score("3-4", {"target": -5, "numbers": [3, 4]}, distance_score=0.5)["score"] == (
        pytest.approx(0.1, abs=1e-12))


def test_flat_expressions_values():
    table = flat_expressions([2, 3])
    # orders (2,3),(3,2) × ops: 2+3=5, 2-3=-1, 2*3=6, 3+2=5, 3-2=1, 3*2=6
    assert table == {"2+3": 5, "2-3": -1, "2*3": 6, "3+2": 5, "3-2": 1, "3*2": 6}
    for expr, value in flat_expressions([7, 5, 8]).items():
        assert countdown.evaluate_expression(expr)[0] == value, expr


def test_generate_countdown_fixed_seed_schema_and_warmup_answers(tmp_path):
    a = generate_countdown(str(tmp_path / "a"), train_size=300, test_size=50, seed=3)
    b = generate_countdown(str(tmp_path / "b"), train_size=300, test_size=50, seed=3)
    c = generate_countdown(str(tmp_path / "c"), train_size=300, test_size=50, seed=4)
    train, test = pd.read_parquet(a["train"]), pd.read_parquet(a["test"])
    assert len(train) == 300 and len(test) == 50
    assert train.equals(pd.read_parquet(b["train"])) and test.equals(pd.read_parquet(b["test"]))  # same seed
    assert not test.equals(pd.read_parquet(c["test"]))  # another seed, other problems
    assert set(train.columns) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    keys = lambda df: {(tuple(sorted(json.loads(r["ground_truth"])["numbers"])), json.loads(r["ground_truth"])["target"])
                       for r in df["reward_model"]}
    assert len(keys(test)) == 50 and not keys(test) & keys(train)  # distinct, and never in train
    for df in (train, test):
        for prompt, rm, extra in zip(df["prompt"], df["reward_model"], df["extra_info"]):
            truth = json.loads(rm["ground_truth"])
            assert prompt[0]["content"] == question(truth["numbers"], truth["target"]) and truth["target"] > 0
            table = flat_expressions(truth["numbers"])
            assert truth["target"] in table.values()  # solvable
            # the warm-up pair: the same numbers, a target no expression reaches, a random well-formed answer
            assert extra["question"] == prompt[0]["content"]  # the task's own text, for results' `question`
            assert extra["warmup_question"] == question(truth["numbers"], extra["warmup_target"])
            assert extra["warmup_target"] not in reachable_values(truth["numbers"])
            out = countdown.compute_score(extra["warmup_answer"], {"target": extra["warmup_target"],
                                                            "numbers": truth["numbers"]}, format_score=0.5)
            assert out["score"] == 0.5 and not out["acc"]  # the format, never a solution
            hits = sum(v == truth["target"] for v in table.values())
            assert extra["chance_acc"] == pytest.approx(hits / len(table))


def test_reachable_values_includes_parentheses():
    # 2, 3, 4: 2+3+4 = 9, 2*3+4 = 10, 2*4+3 = 11, (3+4)*2 = 14, (2+4)*3 = 18, (2+3)*4 = 20 (parentheses),
    # 2*3*4 = 24; the positive values above 14 are products with at most one sum inside, and none is 22 or 23
    values = reachable_values([2, 3, 4])
    assert {20, 24, 14, 18, 9, 10, 11, 2 * 3 - 4} <= values and 23 not in values and 22 not in values
    assert reachable_values([5]) == {5}
    assert reachable_values([2, 3]) == {5, -1, 1, 6}


def test_generate_countdown_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(ValueError, match="min_numbers"):
        generate_countdown(str(tmp_path), 10, 10, min_numbers=1)
    with pytest.raises(ValueError, match="distinct test problems"):
        generate_countdown(str(tmp_path), 10, 500, min_numbers=2, max_numbers=2, max_number=3)
    assert data_main(["countdown", "--out", str(tmp_path / "x"), "--train-size", "20", "--test-size", "5"]) == 0
    assert "train: " in capsys.readouterr().out
    # a bad value is an input error under rlhf_core.cli.run_command: one line naming it, exit 1 (2 = usage)
    assert data_main(["countdown", "--out", str(tmp_path / "y"), "--max-number", "1"]) == 1
    assert "max_number must be >= 2, got 1" in capsys.readouterr().err


def test_generate_countdown_warns_when_train_repeats_few_problems(tmp_path, caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="rlhf_core.data.countdown")
    # 2 numbers from 1..3: 6 multisets, each with at most 3 positive values (a+b, |a-b|, a*b): {1,1} 2, {1,2} 3,
    # {1,3} 3, {2,2} 1 (4 twice, 0), {2,3} 3, {3,3} 2 = 14 problems, 2 held out: 200 rows repeat each > 4 times
    generate_countdown(str(tmp_path / "few"), train_size=200, test_size=2, min_numbers=2, max_numbers=2,
                       max_number=3)
    rows = pd.read_parquet(tmp_path / "few" / "train.parquet")
    distinct = {(tuple(sorted(json.loads(t["ground_truth"])["numbers"])), json.loads(t["ground_truth"])["target"])
                for t in rows["reward_model"]}
    assert len(distinct) <= 12
    assert f"only {len(distinct)} distinct problems in 200 rows" in caplog.text
    caplog.clear()
    # 2 numbers from 1..99: about 14,000 distinct problems (4,950 pairs x up to 3 values): 40 rows: no warning
    generate_countdown(str(tmp_path / "many"), train_size=40, test_size=5, min_numbers=2, max_numbers=2,
                       max_number=99)
    assert "distinct problems" not in caplog.text
