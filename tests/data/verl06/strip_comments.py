"""Write verl 0.6.0's three trainer configs here as key names and defaults only (no comments).

Usage: python tests/data/verl06/strip_comments.py verl-0.6.0-py3-none-any.whl
(the wheel from `pip download --no-deps verl==0.6.0`). The YAML is parsed with OmegaConf and dumped
again, so every comment is dropped; interpolations and `???` stay as written.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from omegaconf import OmegaConf

FILES = {"_generated_ppo_trainer.yaml": "ppo_trainer.yaml", "sft_trainer.yaml": "sft_trainer.yaml",
         "evaluation.yaml": "evaluation.yaml"}


def main(wheel: str) -> None:
    out = Path(__file__).resolve().parent
    with zipfile.ZipFile(wheel) as zf:
        for src, dst in FILES.items():
            cfg = OmegaConf.create(zf.read(f"verl/trainer/config/{src}").decode("utf-8"))
            (out / dst).write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
