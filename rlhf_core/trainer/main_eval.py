"""``rlhf eval key=value ...``: offline evaluation (verl ``python -m verl.trainer.main_eval``).

Loads ``evaluation.yaml`` with dotted overrides, scores the parquet, prints the metrics as JSON. Exit code 0 on
success, 1 on an input error (config, data, missing file: one line on stderr), 2 on a bad command line; any
other error propagates with its traceback (see :mod:`rlhf_core.cli`).
"""
from __future__ import annotations

import json
import sys

from rlhf_core.cli import config_command
from rlhf_core.trainer.evaluation import run_evaluation

main = config_command(
    "rlhf eval", "evaluation", "Score a parquet of generated responses with the reward function, print the metrics "
    "as JSON\n(verl's evaluation.yaml keys; like python -m verl.trainer.main_eval).",
    "rlhf eval data.path=responses.parquet data.response_key=responses", run_evaluation,
    lambda metrics: json.dumps(metrics, indent=2, sort_keys=True))

if __name__ == "__main__":
    sys.exit(main())
