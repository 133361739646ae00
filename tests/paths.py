"""Paths the tests read, the same wherever a test file sits under ``tests/`` (no ``Path(__file__).parents[N]``).

``REPO``: the checkout's root (``pyproject.toml``, ``rlhf_core/configs/``, ``docs/``); ``TEST_DATA``: ``tests/data`` (verl's
config and example files the tests compare against). Imported as ``tests.paths`` (pytest puts the root on
``sys.path``: ``pythonpath`` in pyproject.toml).
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = REPO / "tests" / "data"
