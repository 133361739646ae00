"""``rlhf sft key=value ...`` (verl's ``torchrun -m verl.trainer.fsdp_sft_trainer``); see ``sft_trainer``."""
from __future__ import annotations

import sys

from rlhf_core.trainer.sft_trainer import main, run_sft

__all__ = ["main", "run_sft"]

if __name__ == "__main__":
    sys.exit(main())
