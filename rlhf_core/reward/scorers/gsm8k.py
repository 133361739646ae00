"""GSM8K scorer (verl ``verl/utils/reward_score/gsm8k.py``, with verl's 300-character clip removed).

A GSM8K reference answer is a number; the model is asked to end with ``#### <number>``.

* ``strict`` extraction: the **last** ``#### <number>`` in the *whole* response (verl clips the response to
  its last 300 characters first, which loses an answer followed by a long tail of text; we do not).
  ``#### $18``, ``#### -3``, ``#### +2``, ``#### 1,000``, ``#### 45°`` and ``#### 2e2`` are recognised.
* ``flexible`` extraction: the last number anywhere in the response.

A number is read **whole or not at all** (verl's regexes read a number's head or tail as the number, so
``#### 2e2`` scored against 2, ``3/8`` against 8 and ``.75`` against 75). A number token is an optional sign and
``$``, digits with optional ``,``-grouped thousands (``1,000``; ``3,4`` is two numbers), an optional decimal part
(``.75`` alone too), an optional exponent (``2e2``) and an optional ``/`` denominator (``3/8``), optionally
followed by ``°`` or ``%``. It must not touch a letter, digit, ``.`` or ``/`` on either side
(``2x``, ``v2``, ``1.2.3`` and ``a/b`` parts are not numbers).

Comparison: both sides are read as exact fractions (:func:`parse_number`), so ``18.00 == 18``, ``+2 == 2``,
``2e2 == 200``, ``.75 == 0.75 != 75`` and ``3/8 != 8``. A ground truth that is not a number is compared as the
normalised string (:func:`normalize_number`).

Scores: correct → ``score`` (1.0); a number extracted but wrong → ``format_score`` (0.0); nothing extracted → 0.0.
"""
from __future__ import annotations

import re
from fractions import Fraction

_MAGNITUDE = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d*)?|\.\d+"
_NUMBER = (
    r"[-+]?\s*\$?\s*[-+]?(?:" + _MAGNITUDE + r")(?:[eE][-+]?\d+)?"
    r"(?:\s*/\s*(?:" + _MAGNITUDE + r"))?(?:\s*[°%])?"
)
# not glued to a word, a digit, a decimal point or a slash on either side; a trailing "." may end a sentence
_BEFORE = r"(?<![\w./])"
_AFTER = r"(?![\w/]|\.\d)"
_STRICT_RE = re.compile(r"####\s*(" + _NUMBER + r")" + _AFTER)
_FLEXIBLE_RE = re.compile(_BEFORE + r"(" + _NUMBER + r")" + _AFTER)

METHODS = ("strict", "flexible")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The raw answer text the model gave, or ``None`` when there is none.

    Args:
        solution_str: the decoded response.
        method: ``"strict"`` (last ``#### <number>``) or ``"flexible"`` (last number).

    Raises:
        ValueError: for an unknown ``method``.
    """
    if method not in METHODS:
        raise ValueError(f"gsm8k extraction method must be one of {METHODS}, got {method!r}")
    pattern = _STRICT_RE if method == "strict" else _FLEXIBLE_RE
    found = pattern.findall(solution_str)
    return found[-1].strip().rstrip(".") if found else None


def normalize_number(text: str) -> str:
    """``" $1,000.50 "`` → ``"1000.50"``: drop ``,``/``$``/spaces, a leading ``+``, a trailing ``°``/``%`` and a
    trailing ``.``; keep the minus sign."""
    text = re.sub(r"[,\$\s]", "", str(text)).rstrip(".")
    text = text[:-1] if text.endswith(("°", "%")) else text
    return text[1:] if text.startswith("+") else text


def parse_number(text: str) -> Fraction | None:
    """The exact value of a number token after :func:`normalize_number`, or ``None`` when it is not one.

    ``"2e2"`` → 200, ``".75"`` → 3/4, ``"3/8"`` → 3/8, ``"-$5"`` → -5; ``"1/0"`` and ``"abc"`` → None.
    """
    text = normalize_number(text).replace("$", "")
    if text.startswith("-+") or text.startswith("--"):
        return None
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return Fraction(num) / Fraction(den)
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(answer: str, ground_truth: str) -> bool:
    """Exact numeric equality (:func:`parse_number`); string equality of :func:`normalize_number` when either side
    is not a number."""
    va, vg = parse_number(answer), parse_number(ground_truth)
    if va is not None and vg is not None:
        return va == vg
    return normalize_number(answer) == normalize_number(ground_truth)


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score one GSM8K response.

    Returns:
        ``score`` when the extracted answer equals ``ground_truth`` numerically, ``format_score`` when a number
        was extracted but is wrong, ``0.0`` when nothing was extracted.

    Raises:
        ValueError: for an unknown ``method``.
    """
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answers_match(answer, str(ground_truth)) else float(format_score)
