"""The trainer's rollout-correction stage (verl 0.9.1 ``ray_trainer``: ``compute_rollout_correction_and_add_to_batch``
in decoupled mode, ``apply_bypass_mode`` in bypass mode)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rlhf_core.algos.rollout_correction import LegacyIS, compute_rollout_correction
from rlhf_core.config.rollout_corr import legacy_settings
from rlhf_core.protocol import Batch


def rollout_correction_step(algo: Any, batch: Batch, metrics: dict) -> Batch:
    """Apply ``algo.rollout_correction`` (the typed ``algorithm`` node; verl 0.6's ``algorithm.rollout_is*`` were
    read onto it when the config was loaded) to ``batch``.

    Decoupled mode, with ``rollout_log_probs (B, T)`` in the batch: adds ``rollout_corr/*`` to ``metrics``, replaces
    ``response_mask`` by the rejection-sampled mask and, with ``rollout_is`` set, adds the detached
    ``rollout_is_weights (B, T)`` that the actor multiplies into its per-token policy loss; with the 0.6 keys on,
    their veto and geometric level apply too (:class:`LegacyIS`). Bypass mode: only puts the settings in
    ``batch.meta["rollout_correction"]`` for the actor's loss (the trainer has set ``old_log_probs`` to the rollout's).
    Returns the new batch; without ``rollout_log_probs`` or ``old_log_probs`` the batch unchanged.
    """
    rc = algo.rollout_correction
    if rc.bypass_mode:
        batch.meta["rollout_correction"] = {k: rc[k] for k in rc}
        return batch
    if "rollout_log_probs" not in batch or "old_log_probs" not in batch:
        return batch
    legacy = None
    if algo.rollout_is_threshold is not None:  # 0.6 keys on (a config built in code skips the loader's translation)
        rc = SimpleNamespace(**{**{k: rc[k] for k in rc}, **legacy_settings(
            bool(algo.rollout_is), algo.rollout_is_threshold, algo.rollout_is_threshold_lower, algo.rollout_is_level,
            algo.rollout_is_mode)})
        legacy = LegacyIS(level=algo.rollout_is_level, veto_threshold=algo.rollout_is_veto_threshold)
    weights, mask, rc_metrics = compute_rollout_correction(
        batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], rc, legacy)
    metrics.update(rc_metrics)
    new = {"response_mask": mask} if rc.rollout_rs is not None else {}
    if weights is not None:
        new["rollout_is_weights"] = weights.detach()
    return batch.merge(Batch(new), "rollout correction")
