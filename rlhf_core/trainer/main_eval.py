"""``rlhf eval key=value ...``: offline evaluation (verl ``python -m verl.trainer.main_eval``).

Loads ``evaluation.yaml`` with dotted overrides, scores the parquet, prints the metrics as JSON. Exit code 0 on
success, 1 on an input error (config, data, missing file: one line on stderr), 2 on a bad command line; any
other error propagates with its traceback (see :mod:`rlhf_core.cli`). The command line is parsed in
:mod:`rlhf_core.trainer.commands` before the scoring code is imported.
"""
from __future__ import annotations

import sys

from rlhf_core.trainer.commands import eval_main as main
from rlhf_core.trainer.evaluation import run_evaluation

__all__ = ["main", "run_evaluation"]

if __name__ == "__main__":
    sys.exit(main())
