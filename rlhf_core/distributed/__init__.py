"""Ray start-up and worker groups (one Ray actor per rank, a torch.distributed group across them).

The names are importable from here lazily, so ``rlhf_core.distributed.ray_init`` (used on the CLI's and the
flow's path) can be imported without loading torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"init_ray": "ray_init", "RayWorkerGroup": "worker_group", "LocalWorkerGroup": "worker_group"}

__all__ = ["init_ray", "RayWorkerGroup", "LocalWorkerGroup"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
