"""Rule-based scorers: GSM8K strict/flexible extraction and normalisation, MATH boxed answers, dispatch."""
from __future__ import annotations

import pytest

from rlhf_core.reward import default_compute_score
from rlhf_core.reward.scorers import gsm8k, math_boxed

GSM = "openai/gsm8k"


# ---- GSM8K ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("so the total is #### 1,000", "1000", 1.0),  # the thousands comma is dropped before comparing
        ("The cost is #### $18", "18", 1.0),  # a dollar sign after the marker is allowed and dropped
        ("#### -3", "3", 0.0),  # the minus sign is kept: -3 != 3, and a number was extracted → format_score 0
        ("#### -3", "-3", 1.0),
        ("#### 18.00", "18", 1.0),  # compared as decimals: 18.00 == 18
        ("#### 18.", "18", 1.0),  # a trailing full stop is dropped
        ("#### 18.5", "18", 0.0),  # but 18.5 is not 18
        ("#### 7 then later #### 8", "8", 1.0),  # the last marker counts
        ("#### 7 then later #### 8", "7", 0.0),
        ("The answer is 42.", "42", 0.0),  # strict: no marker → 0 even though 42 is right
    ],
)
def test_gsm8k_strict(response, truth, expected):
    assert default_compute_score(GSM, response, truth) == expected


def test_gsm8k_answer_followed_by_long_tail_counts():
    # verl clips the response to its last 300 characters and would miss this answer; we search the whole text.
    response = "Step 1 ... #### 72\n" + "and some unrelated rambling text " * 50
    assert len(response) > 1000
    assert default_compute_score(GSM, response, "72") == 1.0


def test_gsm8k_flexible_takes_last_number():
    # No marker: strict finds nothing (0), flexible takes the last number, 42.
    assert gsm8k.compute_score("First 3 apples, then 42.", "42", method="strict") == 0.0
    assert gsm8k.compute_score("First 3 apples, then 42.", "42", method="flexible") == 1.0
    assert gsm8k.extract_solution("First 3 apples, then 1,042.", method="flexible") == "1,042"
    assert gsm8k.compute_score("no numbers at all", "42", method="flexible") == 0.0
    # a wrong extracted number gets format_score
    assert gsm8k.compute_score("#### 41", "42", format_score=0.1) == 0.1
    assert gsm8k.compute_score("nothing", "42", format_score=0.1) == 0.0
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", method="loose")


def test_gsm8k_ground_truth_normalised_too():
    assert default_compute_score(GSM, "#### 1000", "1,000") == 1.0
    assert default_compute_score(GSM, "#### 0.50", "0.5") == 1.0


# ---- MATH ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"])
def test_math_sources_use_boxed_scorer(source):
    assert default_compute_score(source, r"so \boxed{5}", "5")["score"] == 1.0
    assert default_compute_score(source, r"so \boxed{6}", "5")["score"] == 0.0


def test_math_last_boxed_counts_and_nested_braces():
    text = r"first guess \boxed{3}, corrected: \boxed{\frac{1}{2}}"
    assert math_boxed.extract_boxed_answer(text) == r"\frac{1}{2}"  # nested braces kept balanced
    assert math_boxed.compute_score(text, r"\frac{1}{2}")["score"] == 1.0
    assert math_boxed.compute_score(text, "3")["score"] == 0.0  # only the last box counts
    assert math_boxed.extract_boxed_answer(r"\boxed{\sqrt{x^{2}}} tail") == r"\sqrt{x^{2}}"


def test_math_fbox_and_unbalanced_and_missing():
    assert math_boxed.compute_score(r"answer \fbox{12}", "12")["score"] == 1.0
    assert math_boxed.extract_boxed_answer(r"\boxed{12") is None  # never closed
    assert math_boxed.compute_score("the answer is 12", "12") == {  # no box → 0
        "score": 0.0, "acc": False, "pred": "", "decided_by": "no_answer"}


@pytest.mark.parametrize(
    "answer, reference",
    [
        ("1,000", "1000"),  # thousands separator
        ("1{,}000", "1000"),  # LaTeX thousands separator
        (r"\dfrac{1}{2}", r"\frac12"),  # dfrac and the short \frac12 form
        ("0.5", r"\frac{1}{2}"),  # numeric equality of a decimal and a fraction
        ("1/2", r"\frac{1}{2}"),
        ("x = 5", "5"),  # a short "x =" prefix is dropped
        (r"10\%", "10"),
        (r"5 \text{ cm}", "5"),  # units after "\text{ " are dropped
        (r"\left( 1, 2 \right)", "(1,2)"),
    ],
)
def test_math_equivalent_forms(answer, reference):
    assert math_boxed.is_equiv(answer, reference)


def test_math_not_equivalent():
    assert not math_boxed.is_equiv("1,2", "12")  # a pair is not a thousands-separated number
    assert not math_boxed.is_equiv(r"\frac{1}{3}", "0.33")
    assert not math_boxed.is_equiv("-3", "3")


def test_unknown_data_source_names_known_ones():
    with pytest.raises(ValueError, match="openai/gsm8k") as err:
        default_compute_score("my/dataset", "#### 1", "1")
    assert "lighteval/MATH" in str(err.value) and "my/dataset" in str(err.value)
