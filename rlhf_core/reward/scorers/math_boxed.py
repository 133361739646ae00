"""MATH scorer: the last ``\\boxed{...}`` / ``\\fbox{...}`` answer against the reference answer.

Used for ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval`` and ``HuggingFaceH4/MATH-500`` (verl's
``verl/utils/reward_score/math.py`` dispatch). Extraction is ours: the **last** ``\\boxed{`` or ``\\fbox{`` (or
``\\boxed 5``), with braces balanced, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; an unbalanced box gives
no answer. Equivalence is decided by ``math-verify`` (:mod:`rlhf_core.reward.scorers.math_equiv`: both sides parsed
to sympy and compared); only when either side does not parse does the string normaliser here decide
(Hendrycks MATH ``is_equiv`` over ``strip_string``, as verl, with these fixes and extensions):

* only a *trailing* ``\\text{ unit}`` after the quantity is dropped (verl drops everything after the first
  ``\\text{ ``, so ``4 \\text{ or } 1`` equalled ``4 \\text{ or } 9``);
* thousands separators removed (``1,000`` and ``1{,}000`` → ``1000``; ``1,2`` — a tuple — is left alone);
* ``\\text{...}``/``\\textbf{...}``/``\\mbox{...}`` unwrapped, ``\\,`` thin spaces and ``°`` dropped, a leading
  ``+`` and a trailing ``.`` dropped, ``\\sqrt 2`` read as ``\\sqrt{2}``;
* numeric comparison when both sides are plain numbers or simple fractions (``\\frac{1}{2} == 0.5 == 1/2``,
  ``18.00 == 18``) using exact ``Fraction`` arithmetic.

:func:`compute_score` returns ``{"score", "acc", "pred", "decided_by"}``: ``decided_by`` is ``"math_verify"`` or
``"string"`` (which path decided), ``"no_answer"`` when the response has no box.
"""
from __future__ import annotations

import re
from fractions import Fraction

from rlhf_core.reward.scorers.math_equiv import math_verify_equiv


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}``/``\\fbox{...}`` (or ``\\boxed x``) in ``text``, braces included, or ``None``."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    if text.startswith("\\boxed ", idx):
        rest = text[idx + len("\\boxed ") :]
        return "\\boxed " + re.split(r"[\s$]", rest, maxsplit=1)[0]
    depth = 0
    for i in range(idx, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[idx : i + 1]
            if depth < 0:
                return None
    return None


def remove_boxed(boxed: str) -> str:
    """``\\boxed{x}`` / ``\\fbox{x}`` / ``\\boxed x`` → ``x``.

    Raises:
        ValueError: when ``boxed`` is not one of those forms.
    """
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed ") :]
    for head in ("\\boxed{", "\\fbox{"):
        if boxed.startswith(head) and boxed.endswith("}"):
            return boxed[len(head) : -1]
    raise ValueError(f"not a boxed answer: {boxed[:50]!r}")


def extract_boxed_answer(text: str) -> str | None:
    """The content of the last balanced ``\\boxed{}``/``\\fbox{}`` in ``text``, or ``None``."""
    boxed = last_boxed_only_string(text)
    if boxed is None:
        return None
    try:
        return remove_boxed(boxed)
    except ValueError:  # e.g. "\\boxed\n{5}": not a form we recognise
        return None


# ---- normalisation (verl's strip_string, extended) ----------------------------------------------------------
def _fix_fracs(s: str) -> str:
    """``\\frac12`` → ``\\frac{1}{2}``, ``\\frac1{b}`` → ``\\frac{1}{b}`` (verl ``fix_fracs``)."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        a, b = part[0], part[1]
        if b == "{":
            out += "{" + a + "}" + part[1:]
        else:
            out += "{" + a + "}{" + b + "}" + part[2:]
    return out


def _fix_a_slash_b(s: str) -> str:
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else s


def _fix_sqrt(s: str) -> str:
    """``\\sqrt3`` → ``\\sqrt{3}``."""
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def _unwrap_text(s: str) -> str:
    return re.sub(r"\\(?:text|textbf|textrm|mbox|mathrm)\{([^{}]*)\}", r"\1", s)


def _remove_right_units(s: str) -> str:
    """``5 \\text{ cm}`` → ``5``: drop a unit in ``\\text{ ...}`` only at the very end and only after a quantity
    (verl's ``remove_right_units`` cut at the first ``\\text{ `` and dropped any text after it)."""
    m = re.fullmatch(r"(.*\S)\s*\\text\{\s+[A-Za-z][A-Za-z ]*\}\s*", s)
    return m.group(1) if m else s


def _remove_thousands(s: str) -> str:
    s = s.replace("{,}", ",")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def strip_string(s: str) -> str:
    """Normalise a LaTeX answer so that equivalent simple forms compare equal (verl ``strip_string``)."""
    s = str(s).replace("\n", "").replace("\\!", "").replace("\\,", "").replace("\\ ", "")
    s = s.replace("\\\\", "\\").replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "").replace("°", "")
    s = _remove_right_units(s)
    s = _unwrap_text(s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    s = s.strip().rstrip(".").strip()
    if s.startswith("+"):
        s = s[1:].strip()
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0].strip()) <= 2:  # "x = 5" → "5"
        s = sides[1]
    s = _fix_sqrt(s.replace(" ", ""))
    s = _fix_fracs(s)
    s = _remove_thousands(s)
    s = _fix_a_slash_b(s)
    return s


def _as_fraction(s: str) -> Fraction | None:
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    try:
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?\d+(\.\d+)?", s):
            return Fraction(s)
    except (ZeroDivisionError, ValueError):
        return None
    return None


def is_equiv(answer: str, reference: str) -> bool:
    """True when the two answers agree after :func:`strip_string` (string or exact numeric equality)."""
    a, r = strip_string(answer), strip_string(reference)
    if a == r:
        return True
    fa, fr = _as_fraction(a), _as_fraction(r)
    return fa is not None and fr is not None and fa == fr


def compute_score(solution_str: str, ground_truth: str) -> dict:
    """Score the last boxed answer of ``solution_str`` against ``ground_truth``.

    A ``ground_truth`` that is itself boxed (``\\boxed{5}``) is unboxed first. math-verify decides when both sides
    parse (:func:`~rlhf_core.reward.scorers.math_equiv.math_verify_equiv`), else :func:`is_equiv` (strings).

    Returns:
        ``{"score": 1.0 | 0.0, "acc": bool, "pred": the extracted answer ("" when none),
        "decided_by": "math_verify" | "string" | "no_answer"}``.
    """
    answer = extract_boxed_answer(solution_str)
    if answer is None:
        return {"score": 0.0, "acc": False, "pred": "", "decided_by": "no_answer"}
    reference = str(ground_truth)
    if "\\boxed" in reference or "\\fbox" in reference:
        reference = extract_boxed_answer(reference) or reference
    equal = math_verify_equiv(answer, reference)
    decided_by = "math_verify"
    if equal is None:
        equal, decided_by = is_equiv(answer, reference), "string"
    return {"score": 1.0 if equal else 0.0, "acc": bool(equal), "pred": answer, "decided_by": decided_by}
