"""Copy the command lines of verl 0.6.0 launch scripts here (tests/data/verl06/examples/).

Usage: python tests/data/verl06/extract_examples.py <verl git dir>  (a clone or mirror with the v0.6.0 tag).
Keeps only what the command needs: top-level ``name=value`` shell assignments and the
``python3 -m verl.trainer.main_ppo ...`` command with its continuation lines. Comments, ``set -x``,
``export`` lines and ``if`` blocks are dropped.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TAG = "v0.6.0"
SCRIPTS = (
    "ppo_trainer/run_deepseek7b_llm.sh",                   # PPO (GAE critic)
    "ppo_trainer/run_qwen2-7b_rm_seq_balance.sh",          # PPO + reward model + sequence balancing
    "grpo_trainer/run_qwen2-7b.sh",                        # GRPO
    "grpo_trainer/run_deepseek7b_llm_seq_balance.sh",      # GRPO + sequence balancing
    "grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh",      # GRPO + LoRA
    "remax_trainer/run_qwen2.5-3b_seq_balance.sh",         # ReMax + sequence balancing
    "rloo_trainer/run_qwen2-7b.sh",                        # RLOO
    "reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh",  # REINFORCE++
    "reinforce_plus_plus_trainer/run_qwen2-7b_math_rf_baseline.sh",  # REINFORCE++ with baseline
)
_ASSIGN = re.compile(r"^[A-Za-z_]\w*=")


def command_lines(text: str) -> str:
    out, in_cmd = [], False
    for line in text.splitlines():
        if in_cmd:
            out.append(line)
            in_cmd = line.rstrip().endswith("\\")
        elif line.startswith("python3 -m verl.trainer.main_ppo"):
            out.append(line)
            in_cmd = line.rstrip().endswith("\\")
        elif _ASSIGN.match(line):
            out.append(line)
    return "\n".join(out) + "\n"


def main(git_dir: str) -> None:
    dest = Path(__file__).resolve().parent / "examples"
    dest.mkdir(exist_ok=True)
    for script in SCRIPTS:
        text = subprocess.run(["git", "-C", git_dir, "show", f"{TAG}:examples/{script}"], check=True,
                              capture_output=True, text=True).stdout
        (dest / script.replace("/", "__")).write_text(command_lines(text), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
