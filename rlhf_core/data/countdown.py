"""Countdown: reach a target with the given numbers and ``+ - *``, each number used once (train/test in the verl
parquet schema, generated from a fixed seed).

A problem is ``k`` numbers drawn uniformly from ``1..max_number`` (``k`` uniform in ``min_numbers..max_numbers``)
and a target that is the value of one expression over them — a random order joined by random operators, Python's
precedence, no parentheses — redrawn until it is positive, so every problem has at least one solution. Each row::

    data_source  "countdown"
    prompt       [{"role": "user", "content": "Numbers: 3 4 2. Target: 14. Use each number once with + - *."}]
    ability      "arithmetic"
    reward_model {"style": "rule", "ground_truth": '{"target": 14, "numbers": [3, 4, 2]}'}
    extra_info   {"split", "index", "question": the prompt's text (as GSM8K rows carry theirs),
                  "warmup_question": the warm-up prompt, "warmup_answer": the warm-up answer,
                  "warmup_target": its target, "chance_acc": the fraction of no-parenthesis expressions over the
                  numbers that hit the real target}

The warm-up (SFT: ``data.prompt_key=extra_info``, ``data.prompt_dict_keys=[warmup_question]``) pair is format only
and never a solution: the warm-up prompt has the row's numbers but an *unreachable* target (a positive integer no
expression over the numbers, with or without parentheses, reaches), and the answer is a uniformly random
no-parenthesis expression over the numbers. So the warm-up never shows a solvable problem nor a solution, and its
answers do not depend on the target (an earlier version paired the real prompt with a random *wrong* answer, which
taught the model to avoid solutions: its greedy accuracy started far below chance and any perturbation "gained").
Every gain in accuracy after warm-up comes from the reward. ``chance_acc`` is the accuracy of the policy that writes
a uniformly random expression of the format, the level a format-only warm-up starts near.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import random
from typing import Any

from rlhf_core.data.readers import write_parquet_atomic
from rlhf_core.reward.scorers.countdown import DATA_SOURCE

logger = logging.getLogger(__name__)

OPERATORS = ("+", "-", "*")
# train rows per distinct train problem above which generate_countdown warns (memorisation, not learning)
MAX_REPEATS = 4
SPLITS = ("train", "test")


def _join(numbers: tuple[int, ...], ops: tuple[str, ...]) -> str:
    return str(numbers[0]) + "".join(op + str(n) for op, n in zip(ops, numbers[1:]))


def _flat_value(numbers: tuple[int, ...], ops: tuple[str, ...]) -> int:
    """Value of ``numbers`` joined by ``ops`` with ``*`` before ``+``/``-`` (Python's precedence)."""
    terms, signs, term = [], [], numbers[0]
    for op, n in zip(ops, numbers[1:]):
        if op == "*":
            term *= n
        else:
            terms.append(term)
            signs.append(op)
            term = n
    terms.append(term)
    return terms[0] + sum(t if s == "+" else -t for s, t in zip(signs, terms[1:]))


def flat_expressions(numbers: list[int]) -> dict[str, int]:
    """Every distinct no-parenthesis expression using each number once (all orders × all operators) → its value."""
    return {_join(p, ops): _flat_value(p, ops) for p in sorted(set(itertools.permutations(numbers)))
            for ops in itertools.product(OPERATORS, repeat=len(numbers) - 1)}


def reachable_values(numbers: list[int]) -> set[int]:
    """Every value an expression over ``numbers`` (each once, ``+ - *``, any parentheses) can take."""
    if len(numbers) == 1:
        return {numbers[0]}
    out: set[int] = set()
    n = len(numbers)
    for mask in range(1, 2 ** n - 1):  # split into two non-empty groups, both orders
        left = [x for i, x in enumerate(numbers) if mask >> i & 1]
        right = [x for i, x in enumerate(numbers) if not mask >> i & 1]
        for a in reachable_values(left):
            for b in reachable_values(right):
                out.update((a + b, a - b, a * b))
    return out


def make_problem(rng: random.Random, min_numbers: int, max_numbers: int, max_number: int) -> dict[str, Any]:
    """One problem: ``{"numbers", "target", "warmup_target", "warmup_answer", "chance_acc"}`` (module doc)."""
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(rng.randint(min_numbers, max_numbers))]
        table = flat_expressions(numbers)
        exprs, values = list(table), list(table.values())
        target = values[rng.randrange(len(exprs))]
        if target <= 0:
            continue
        reachable = reachable_values(numbers)
        unreachable = [t for t in range(1, max(reachable) + 2) if t not in reachable]  # never empty
        # the unreachable value nearest to a random flat value, so warm-up targets have the real targets' magnitudes
        anchor = values[rng.randrange(len(values))]
        warmup_target = min(unreachable, key=lambda t: (abs(t - anchor), rng.random()))
        hits = sum(v == target for v in values)
        return {"numbers": numbers, "target": target, "warmup_target": warmup_target,
                "warmup_answer": rng.choice(exprs), "chance_acc": hits / len(exprs)}


def question(numbers: list[int], target: int) -> str:
    """The user prompt: ``Numbers: 3 4 2. Target: 14. Use each number once with + - *.``"""
    return f"Numbers: {' '.join(map(str, numbers))}. Target: {target}. Use each number once with + - *."


def countdown_row(problem: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """One verl-schema row for a problem of :func:`make_problem`."""
    q = question(problem["numbers"], problem["target"])
    warmup_q = question(problem["numbers"], problem["warmup_target"])
    truth = json.dumps({"target": problem["target"], "numbers": problem["numbers"]})
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": q}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "question": q, "warmup_question": warmup_q,
                       "warmup_answer": problem["warmup_answer"], "warmup_target": problem["warmup_target"],
                       "chance_acc": float(problem["chance_acc"])},
    }


def check_ranges(min_numbers: int, max_numbers: int, max_number: int) -> None:
    """Raise ``ValueError`` (naming the values) unless ``2 <= min_numbers <= max_numbers <= 5`` and
    ``max_number >= 2`` (the limits of :func:`generate_countdown`)."""
    if not 2 <= min_numbers <= max_numbers <= 5:
        raise ValueError(f"need 2 <= min_numbers <= max_numbers <= 5, got {min_numbers}, {max_numbers}")
    if max_number < 2:
        raise ValueError(f"max_number must be >= 2, got {max_number}")


def generate_countdown(out_dir: str, train_size: int = 20000, test_size: int = 500, seed: int = 0,
                       min_numbers: int = 3, max_numbers: int = 3, max_number: int = 9) -> dict[str, str]:
    """Write ``<out_dir>/{train,test}.parquet``; the same arguments always give the same files.

    Test problems are distinct and never appear in train (same numbers as a multiset and same target). Train rows
    repeat problems; a warning is logged when the average train problem repeats more than :data:`MAX_REPEATS` times
    (2 numbers from 1..20: 109 distinct in 20000 rows; the defaults: 886; 2 numbers from 1..99: 10413).

    Args:
        out_dir: output folder (created); files are written atomically.
        train_size, test_size: rows per split (>= 1).
        seed: ``random.Random`` seed.
        min_numbers, max_numbers: how many numbers a problem has (2 <= min <= max <= 5).
        max_number: numbers are drawn from ``1..max_number`` (>= 2).

    Returns:
        ``{"train": path, "test": path}``.

    Raises:
        ValueError: a size or range outside the limits above (names the argument and value), or too few distinct
            problems for ``test_size`` (and train rows outside them) with these ranges.
    """
    if train_size < 1 or test_size < 1:
        raise ValueError(f"train_size and test_size must be >= 1, got {train_size}, {test_size}")
    check_ranges(min_numbers, max_numbers, max_number)
    rng = random.Random(seed)
    test: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for _ in range(test_size * 100):
        p = make_problem(rng, min_numbers, max_numbers, max_number)
        key = (tuple(sorted(p["numbers"])), p["target"])
        if key not in seen:
            seen.add(key)
            test.append(p)
            if len(test) == test_size:
                break
    train: list[dict[str, Any]] = []
    for _ in range(train_size * 100):
        p = make_problem(rng, min_numbers, max_numbers, max_number)
        if (tuple(sorted(p["numbers"])), p["target"]) not in seen:
            train.append(p)
            if len(train) == train_size:
                break
    if len(test) < test_size or len(train) < train_size:
        raise ValueError(f"only {len(test)} distinct test problems and {len(train)} train problems outside them "
                         f"exist for min_numbers={min_numbers}, max_numbers={max_numbers}, "
                         f"max_number={max_number}: raise max_number or lower test_size ({test_size})")
    distinct = len({(tuple(sorted(p["numbers"])), p["target"]) for p in train})
    if distinct * MAX_REPEATS < train_size:
        logger.warning("countdown train has only %d distinct problems in %d rows (each seen about %.0f times): a "
                       "rising train reward can be memorisation; held-out accuracy is the measure (min_numbers=%d, "
                       "max_numbers=%d, max_number=%d: raise max_number for more)", distinct, train_size,
                       train_size / distinct, min_numbers, max_numbers, max_number)
    out_dir = os.path.expanduser(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for split, problems in (("train", train), ("test", test)):
        path = os.path.join(out_dir, f"{split}.parquet")
        write_parquet_atomic([countdown_row(p, split, i) for i, p in enumerate(problems)], path)
        paths[split] = path
    return paths
