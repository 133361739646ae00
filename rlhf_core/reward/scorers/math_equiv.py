"""Equivalence of two MATH-style answers with ``math-verify`` (Hugging Face's answer checker).

Both strings are *already extracted* final answers (no ``\\boxed``): each is wrapped as ``$...$`` and parsed to
sympy by ``math_verify.parse`` (LaTeX, then plain expressions; no string fallback), then compared with
``math_verify.verify(gold, answer)`` (symbolic and numeric equality with math-verify's own 6-digit rounding, sets
and intervals). ``3\\sqrt{2}`` vs ``3 \\sqrt 2``, ``+2`` vs ``2``, ``45°`` vs ``45`` and ``5.`` vs ``5`` are equal;
``4 \\text{ or } 9`` ({4, 9}) vs ``4 \\text{ or } 1`` ({1, 4}) is not.

Hangs: math-verify guards parsing and verification with ``SIGALRM``, which only works in a process's main thread.
We pass its timeout (:data:`TIMEOUT_S`) only there and only when no other alarm is pending (its alarm would cancel
it); elsewhere none, and the ``prime`` reward manager's per-sample process timeout is the guard.
"""
from __future__ import annotations

import signal
import threading

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

TIMEOUT_S = 5
_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())


def _timeout() -> int | None:
    if threading.current_thread() is not threading.main_thread():
        return None
    return TIMEOUT_S if signal.getitimer(signal.ITIMER_REAL)[0] == 0 else None


def _parse(text: str) -> list:
    body = str(text).strip().strip("$").strip()
    if not body:
        return []
    return parse(f"${body}$", extraction_config=list(_CONFIG), fallback_mode="no_fallback",
                 parsing_timeout=_timeout())


def math_verify_equiv(answer: str, reference: str) -> bool | None:
    """``True``/``False`` when math-verify parsed both sides, ``None`` when either side did not parse (or parsing
    raised or timed out: the caller then falls back to string normalisation)."""
    try:
        gold, pred = _parse(reference), _parse(answer)
    except Exception:  # noqa: BLE001 - a parser failure means "could not parse", decided elsewhere
        return None
    if not gold or not pred:
        return None
    try:
        return bool(verify(gold, pred, timeout_seconds=_timeout()))
    except Exception:  # noqa: BLE001
        return None
