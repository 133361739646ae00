"""``fsdp_config.full_determinism`` / ``engine.full_determinism`` with ``seed`` (verl 0.9's FSDP engine: it calls
``enable_full_determinism(engine.seed)`` when the flag is set, and reads ``seed`` nowhere else)."""
from __future__ import annotations

import os
import random
from typing import Any, Mapping

import numpy as np
import torch

# verl 0.9 verl/workers/engine/utils.py: the variables its enable_full_determinism sets (cuBLAS workspace, flash
# attention, NCCL); they reach the libraries read after this point and the processes this one starts
_DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "FLASH_ATTENTION_DETERMINISTIC": "1",
                      "NCCL_DETERMINISTIC": "1", "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}


def enable_full_determinism(seed: int) -> None:
    """Deterministic kernels and seeded RNGs for this process, as verl's ``enable_full_determinism``: the
    environment above plus ``PYTHONHASHSEED``, ``random``/``numpy``/``torch`` (all devices) seeded with ``seed``,
    ``torch.use_deterministic_algorithms(True, warn_only=True)`` (an op without a deterministic kernel warns), and
    cuDNN deterministic, not benchmarking, off (verl turns it off too)."""
    os.environ["PYTHONHASHSEED"] = str(seed)
    os.environ.update(_DETERMINISTIC_ENV)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # every device's generator too
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.enabled = False


def apply_engine_determinism(engine_cfg: Mapping[str, Any]) -> bool:
    """Call :func:`enable_full_determinism` with ``engine_cfg.seed`` when ``engine_cfg.full_determinism`` (a role's
    ``fsdp_config`` / ``critic.fsdp`` or SFT's ``engine``), before the role's model is built: the seed then decides
    every random initialisation of the build (a new value head, LoRA adapters). The worker seeds its RNGs for the
    run afterwards (``data.seed`` / ``trainer.seed``), as before. Returns whether it was applied."""
    if not engine_cfg.full_determinism:
        return False
    enable_full_determinism(int(engine_cfg.seed))
    return True
