"""Write verl 0.9.1's composed configs here as key names and defaults only (no comments, no ``_target_``).

Usage: python tests/data/verl091/compose.py EXTRACTED_WHEEL
where EXTRACTED_WHEEL is the folder holding ``verl/`` after ``unzip verl-0.9.1-py3-none-any.whl`` (the wheel from
``pip download --no-deps verl==0.9.1``). Each config is composed with Hydra's compose API, as verl's own entry
points do (its ``defaults:`` lists pull in the actor, rollout, engine... files), then dumped with OmegaConf:
comments are gone, interpolations and ``???`` stay as written (``sft_trainer_engine``: resolved, with a two-line
header, as tests/rlhf_core/config/test_sft_engine_config.py reads it). ``_target_`` entries (verl's dataclass hints, which our
loader accepts and ignores) are dropped.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

FILES = {"ppo_trainer": "ppo_trainer.yaml", "sft_trainer_engine": "sft_trainer_engine.yaml",
         "evaluation": "evaluation.yaml"}
SFT_HEADER = ("# verl 0.9.1 sft_trainer_engine.yaml, composed (model: hf_model, engine: fsdp, optim: fsdp, profiler: "
              "profiler),\n# interpolations resolved, _target_ entries dropped: key names and defaults only (see README.md "
              "here).\n")


def _drop_targets(node):
    if isinstance(node, dict):
        return {k: _drop_targets(v) for k, v in node.items() if k != "_target_"}
    if isinstance(node, list):
        return [_drop_targets(v) for v in node]
    return node


def main(extracted: str) -> None:
    out = Path(__file__).resolve().parent
    config_dir = Path(extracted).resolve() / "verl" / "trainer" / "config"
    for name, dst in FILES.items():
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(config_name=name)
        resolve = name == "sft_trainer_engine"
        plain = _drop_targets(OmegaConf.to_container(cfg, resolve=resolve))
        header = SFT_HEADER if resolve else ""
        (out / dst).write_text(header + OmegaConf.to_yaml(OmegaConf.create(plain)), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
