"""Rewards you can trust (issue 15): each kind of fault a rule scorer had, with its example, plus a property test.

Kinds: (1) MATH normalisation dropping text after ``\\text{ `` (credit for a wrong answer sharing the prefix);
(2) number extraction reading a number's head or tail as the number; (3) equivalent forms scored as wrong.
"""
from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_core.reward import default_compute_score
from rlhf_core.reward.scorers import gsm8k, math_boxed

GSM, MATH = "openai/gsm8k", "lighteval/MATH"


# ---- (1) text after "\text{ " is part of the answer ------------------------------------------------------------
def test_math_text_or_wrong_alternative_scores_zero_on_both_paths():
    # {4, 1} is not {4, 9}: verl's remove_right_units cut both at "\text{ " and compared "4" with "4".
    out = default_compute_score(MATH, r"\boxed{4 \text{ or } 1}", r"4 \text{ or } 9")
    assert out["score"] == 0.0 and out["decided_by"] == "math_verify"
    assert not math_boxed.is_equiv(r"4 \text{ or } 1", r"4 \text{ or } 9")  # the string fallback agrees
    assert default_compute_score(MATH, r"\boxed{4 \text{ or } 9}", r"4 \text{ or } 9")["score"] == 1.0
    assert math_boxed.is_equiv(r"4 \text{ or } 9", r"4 \text{ or } 9")
    # a unit at the very end is still dropped by the fallback: "5 \text{ cm}" is the quantity 5
    assert math_boxed.strip_string(r"5 \text{ cm}") == "5"
    assert math_boxed.strip_string(r"4 \text{ or } 9 \text{ cm}") == "4or9"


# ---- (2) a number is read whole or not at all -------------------------------------------------------------------
@pytest.mark.parametrize(
    "response, truth, method, expected",
    [
        ("#### 2e2", "2", "strict", 0.0),  # the head "2" of 2e2 (= 200) is not the answer
        ("#### 2e2", "200", "strict", 1.0),  # read whole it is 200
        ("#### 3/8", "8", "flexible", 0.0),  # the tail "8" of 3/8
        ("#### 3/8", "8", "strict", 0.0),
        ("the total is .75", "75", "flexible", 0.0),  # the tail "75" of .75
        ("the total is .75", "0.75", "flexible", 1.0),
        ("#### 12x", "12", "strict", 0.0),  # "12x" is not a number: nothing extracted
        ("#### 1.5.3", "5", "strict", 0.0),
        ("version v2 and 3,4", "4", "flexible", 1.0),  # "3,4" is two numbers (not thousands), the last is 4
        ("version v2 and 3,4", "34", "flexible", 0.0),
    ],
)
def test_gsm8k_reads_numbers_whole(response, truth, method, expected):
    assert gsm8k.compute_score(response, truth, method=method) == expected


def test_gsm8k_extraction_whole_tokens():
    assert gsm8k.extract_solution("#### 2e2", "strict") == "2e2"
    assert gsm8k.extract_solution("so 3/8 it is", "flexible") == "3/8"
    assert gsm8k.extract_solution("the total is .75", "flexible") == ".75"
    assert gsm8k.extract_solution("#### 12x", "strict") is None
    assert gsm8k.parse_number("1/0") is None and gsm8k.parse_number("abc") is None
    assert gsm8k.parse_number("-$1,000.50") == Decimal("-1000.5")


# ---- (3) equivalent forms score 1 ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "answer, truth",
    [(r"3\sqrt{2}", r"3 \sqrt 2"), ("+2", "2"), ("45°", "45"), (r"45^\circ", "45"), ("5", "5.")],
)
def test_math_equivalent_forms_on_both_paths(answer, truth):
    out = default_compute_score(MATH, rf"so \boxed{{{answer}}}", truth)
    assert out == {"score": 1.0, "acc": True, "pred": answer, "decided_by": "math_verify"}
    assert math_boxed.is_equiv(answer, truth)  # the string fallback agrees


@pytest.mark.parametrize("response, truth", [("#### +2", "2"), ("#### 45°", "45"), ("#### 5", "5."),
                                             ("#### 50%", "50")])
def test_gsm8k_equivalent_forms(response, truth):
    assert default_compute_score(GSM, response, truth) == 1.0
    assert gsm8k.compute_score(response, truth, method="flexible") == 1.0


def test_math_string_fallback_when_unparseable():
    # "\text{(A)}" is a word for math-verify's parser only in some forms; an empty reference never parses, so the
    # string path decides and says so.
    out = math_boxed.compute_score(r"\boxed{ }", "")
    assert out["decided_by"] == "string" and out["score"] == 1.0  # both normalise to ""
    out = math_boxed.compute_score(r"\boxed{5}", "")
    assert out["decided_by"] == "string" and out["score"] == 0.0


def test_math_wrong_answers_stay_wrong():
    for answer, truth in [("-3", "3"), (r"\frac{1}{3}", "0.33"), ("1,2", "12"), ("2e2", "2")]:
        assert default_compute_score(MATH, rf"\boxed{{{answer}}}", truth)["score"] == 0.0, (answer, truth)


# ---- property: "#### x" never scores against y != x --------------------------------------------------------------
_numbers = st.one_of(
    st.integers(min_value=-10**12, max_value=10**12).map(str),
    st.decimals(min_value=-10**6, max_value=10**6, places=3, allow_nan=False, allow_infinity=False).map(str),
)


@settings(max_examples=400, deadline=None)
@given(x=_numbers, y=_numbers)
def test_property_marker_never_scores_against_a_different_number(x, y):
    if Decimal(x) == Decimal(y):
        assert gsm8k.compute_score(f"#### {x}", y) == 1.0
        return
    for method in ("strict", "flexible"):
        assert gsm8k.compute_score(f"#### {x}", y, method=method) == 0.0, (x, y, method)
        assert gsm8k.compute_score(f"so the answer is #### {x}.", y, method=method) == 0.0, (x, y, method)
