"""Checkpoint before a reserved cloud capacity block expires (verl's ESI check, ``trainer.esi_redundant_time``).

Volcano Engine ML Platform and AWS SageMaker tell a job when its capacity block (an "elastic server instance")
ends, in ``MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP`` / ``SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP``
(Unix seconds). verl 0.9 saves a checkpoint at the end of a step (when ``trainer.save_freq > 0``) once the time
left is no more than what one more step, a save (60 s) and ``esi_redundant_time`` seconds of margin need, so a run
cut off by the expiry loses at most that step.
"""
from __future__ import annotations

import os
import time

SAVE_SECONDS = 60.0  # verl's estimate of one checkpoint save
EXPIRY_VARS = ("MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP", "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP")


def capacity_expiring(max_step_seconds: float, redundant_seconds: float, now: float | None = None) -> bool:
    """Whether the capacity block ends within ``SAVE_SECONDS + max_step_seconds + redundant_seconds`` seconds.

    Args:
        max_step_seconds: the longest training step so far (0 before the first ends: the Volcano check then waits,
            as verl's). redundant_seconds: ``trainer.esi_redundant_time``. now: Unix time (default: the clock).

    Returns False when neither variable is set or the one set is not a number; an already passed Volcano
    expiry is False too (verl's), a passed SageMaker one True."""
    now = time.time() if now is None else float(now)
    budget = SAVE_SECONDS + float(max_step_seconds) + float(redundant_seconds)
    volcano, sagemaker = (os.environ.get(name) for name in EXPIRY_VARS)
    if volcano:
        try:
            left = float(volcano) - now
        except ValueError:
            return False
        return left > 0 and max_step_seconds > 0 and left <= budget
    if sagemaker:
        try:
            return float(sagemaker) - now < budget
        except ValueError:  # not a number: no expiry known (as the Volcano variable)
            return False
    return False
