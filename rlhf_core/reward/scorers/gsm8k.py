"""GSM8K scorer (verl ``verl/utils/reward_score/gsm8k.py``, with verl's 300-character clip removed).

A GSM8K reference answer is a number; the model is asked to end with ``#### <number>``.

* ``strict`` extraction: the **last** ``#### <number>`` in the *whole* response (verl clips the response to
  its last 300 characters first, which loses an answer followed by a long tail of text; we do not).
  ``#### $18``, ``#### -3`` and ``#### 1,000`` are recognised.
* ``flexible`` extraction: the last number anywhere in the response.

Normalisation (both the extracted answer and the ground truth): drop ``,``, ``$`` and white space, a trailing
``.``, then compare as exact decimals, so ``18.00 == 18`` and ``1,000 == 1000`` while ``-3 != 3``.
A ground truth that is not a number is compared as the normalised string.

Scores: correct → ``score`` (1.0); a number extracted but wrong → ``format_score`` (0.0); nothing extracted → 0.0.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = r"-?\s*\$?\s*-?[0-9][0-9,]*(?:\.[0-9]+)?"
_STRICT_RE = re.compile(r"####\s*(" + _NUMBER + r")")
_FLEXIBLE_RE = re.compile(r"(-?\$?[0-9][0-9,]*(?:\.[0-9]+)?)")

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
    return found[-1] if found else None


def normalize_number(text: str) -> str:
    """``" $1,000.50 "`` → ``"1000.50"``: drop ``,``/``$``/spaces and a trailing ``.``; keep the minus sign."""
    text = re.sub(r"[,\$\s]", "", str(text))
    return text.rstrip(".")


def _as_decimal(text: str) -> Decimal | None:
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def answers_match(answer: str, ground_truth: str) -> bool:
    """Numeric equality after :func:`normalize_number` (``18.00 == 18``); string equality when not numeric."""
    a, g = normalize_number(answer), normalize_number(ground_truth)
    da, dg = _as_decimal(a), _as_decimal(g)
    if da is not None and dg is not None:
        return da == dg
    return a == g


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
