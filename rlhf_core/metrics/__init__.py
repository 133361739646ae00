"""Metrics: training-step metrics (``training``), validation metrics (``validation``), sample files (``samples``).

Modules are imported directly (``from rlhf_core.metrics.validation import process_validation_metrics``);
this package imports nothing heavy on its own.
"""
