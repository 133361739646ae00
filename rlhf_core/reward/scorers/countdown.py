"""Countdown scorer: does the response reach the target with the given numbers, each used once, and ``+ - *``?

A task only a reward can teach: many expressions can be right (``3*4+2`` and ``2+4*3``), and the warm-up data
never shows a correct one (:mod:`rlhf_core.data.countdown`). The ground truth is ``{"target": int,
"numbers": [int, ...]}`` as a dict (TinyZero's layout) or that dict as a JSON string (ours, so the parquet column
stays a plain string).

The answer is the response's last line, stripped, with a trailing ``= <number>`` dropped (``3*4+2 = 14`` →
``3*4+2``). It must be an arithmetic expression of non-negative integer literals, ``+``, ``-``, ``*`` and
parentheses (no unary minus, no other operators, at most :data:`MAX_ANSWER_CHARS` characters), evaluated with
Python's precedence over exact integers (an ``ast`` walk, never ``eval``). The literals, as a multiset, must equal
the given numbers.

Scores: correct → ``score`` (1.0); a well-formed expression over exactly the given numbers that misses the target →
``format_score + distance_score * max(0, 1 - |value - target| / max(1, |target|))`` (both 0.0 by default: a miss scores 0; a
positive ``distance_score`` is reward shaping that pays a miss by its closeness, never as much as a hit when
``format_score + distance_score < score``); anything else → 0.0. ``acc`` is True only for a hit.
"""
from __future__ import annotations

import ast
import json
import re
from collections import Counter
from typing import Any

DATA_SOURCE = "countdown"
MAX_ANSWER_CHARS = 64
_ALLOWED = re.compile(r"[0-9+\-*() ]+")
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def parse_ground_truth(ground_truth: Any) -> tuple[int, list[int]]:
    """``(target, numbers)`` from a dict or its JSON string.

    Raises:
        ValueError: the ground truth is not such a dict (names the value).
    """
    value = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    try:
        return int(value["target"]), [int(n) for n in value["numbers"]]
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"countdown ground truth must be {{'target': int, 'numbers': [int, ...]}}, "
                         f"got {ground_truth!r}") from exc


def extract_answer(solution_str: str) -> str | None:
    """The expression on the response's last non-empty line (a trailing ``= N`` dropped), or ``None``."""
    lines = [ln.strip() for ln in str(solution_str).strip().splitlines() if ln.strip()]
    if not lines:
        return None
    answer = re.sub(r"\s*=\s*-?\d+\s*$", "", lines[-1]).strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS or not _ALLOWED.fullmatch(answer):
        return None
    return answer


def evaluate_expression(expr: str) -> tuple[int, list[int]] | None:
    """``(value, literals)`` of an expression of ints, ``+ - *`` and parentheses; ``None`` for anything else."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    literals: list[int] = []

    def walk(node: ast.AST) -> int | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if left is None or right is None:
                return None
            return _OPS[type(node.op)](left, right)
        return None

    value = walk(tree)
    return None if value is None else (value, literals)


def compute_score(solution_str: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0,
                  distance_score: float = 0.0) -> dict:
    """Score one Countdown response (module doc: the scores of a hit, a well-formed miss and anything else).

    Returns:
        ``{"score", "acc": bool, "pred": the extracted expression ("" when none)}``.

    Raises:
        ValueError: a malformed ground truth (see :func:`parse_ground_truth`).
    """
    target, numbers = parse_ground_truth(ground_truth)
    answer = extract_answer(solution_str)
    result = evaluate_expression(answer) if answer is not None else None
    if result is None or Counter(result[1]) != Counter(numbers):
        return {"score": 0.0, "acc": False, "pred": answer or ""}
    if result[0] == target:
        return {"score": float(score), "acc": True, "pred": answer}
    if not distance_score:
        return {"score": float(format_score), "acc": False, "pred": answer}
    closeness = max(0.0, 1.0 - abs(result[0] - target) / max(1, abs(target)))  # in [0, 1), whatever the target
    return {"score": float(format_score) + float(distance_score) * closeness, "acc": False, "pred": answer}
