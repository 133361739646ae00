"""Rewards: rule-based scorers by ``data_source``, reward managers (``naive``, ``batch``, ``prime``, ``dapo``,
``remote``, ``rate_limited``, ``gdpo``, or a class from a file with ``reward.reward_manager.source=importlib``),
custom functions.

Public API::

    default_compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float
    load_custom_reward_function(path, name="compute_score", reward_kwargs=None) -> FileRewardFunction
    load_reward_manager(config, tokenizer, num_examine=0, **kwargs) -> reward manager (naive | batch | prime | dapo |
        remote | rate_limited | gdpo | importlib class)
    get_reward_manager_cls(name), register(name), REWARD_MANAGERS

Attribute access is lazy (PEP 562) so that reward worker processes, which import
``rlhf_core.reward.pool`` and the scorers, do not pay for importing torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "default_compute_score": "rlhf_core.reward.scorers",
    "KNOWN_DATA_SOURCES": "rlhf_core.reward.scorers",
    "load_custom_reward_function": "rlhf_core.reward.custom",
    "reward_function_from_config": "rlhf_core.reward.custom",
    "FileRewardFunction": "rlhf_core.reward.custom",
    "load_reward_manager": "rlhf_core.reward.loader",
    "get_reward_manager_cls": "rlhf_core.reward.managers",
    "register": "rlhf_core.reward.managers",
    "REWARD_MANAGERS": "rlhf_core.reward.managers",
    "NaiveRewardManager": "rlhf_core.reward.managers",
    "BatchRewardManager": "rlhf_core.reward.managers",
    "PrimeRewardManager": "rlhf_core.reward.prime",
    "DAPORewardManager": "rlhf_core.reward.dapo",
    "RemoteRewardManager": "rlhf_core.reward.remote",
    "RateLimitedRewardManager": "rlhf_core.reward.rate_limited",
    "overlong_penalty": "rlhf_core.reward.dapo",
    "GDPORewardManager": "rlhf_core.reward.gdpo",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlhf_core.reward' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
