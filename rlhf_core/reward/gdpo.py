"""The ``gdpo`` reward manager (``reward_model.reward_manager: gdpo``; verl 0.9
``verl/experimental/reward_loop/reward_manager/gdpo.py``), for ``algorithm.adv_estimator: gdpo``.

It scores like ``naive`` (one ``compute_score`` call per sample): a dict result's keys (``score`` and the reward
components named by ``algorithm.gdpo_reward_keys``, e.g. ``format_reward``, ``accuracy_reward``) become per-sample
``reward_extra_info`` columns, which the [adv] stage reads as the components. A float result is also reported as
``acc`` (as verl). Unlike verl it does not add ``experiment_name`` to ``extra_info``. ``rm_scores`` pass through.
"""
from __future__ import annotations

from typing import Any

from rlhf_core.protocol import Batch
from rlhf_core.reward.managers import NaiveRewardManager, register


@register("gdpo")
class GDPORewardManager(NaiveRewardManager):
    """``naive`` plus ``acc`` = the score when the scorer returns floats (a failed sample: 0)."""

    def __call__(self, batch: Batch, return_dict: bool = False) -> Any:
        out = super().__call__(batch, return_dict=True)
        extra = out["reward_extra_info"]
        if "rm_scores" not in batch and not extra.keys() - {"reward_error"}:  # floats only: no dict keys
            extra["acc"] = [float(x) for x in out["reward_tensor"].sum(-1).tolist()]
        return out if return_dict else out["reward_tensor"]
