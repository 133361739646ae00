"""``rlhf eval key=value ...``: offline evaluation (verl ``python -m verl.trainer.main_eval``)."""
from __future__ import annotations

import json
import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Load ``evaluation.yaml`` with dotted overrides, score the parquet, print the metrics as JSON.

    Returns 0 on success, 1 on a configuration or data error (the message goes to stderr).
    """
    from rlhf_core.config import load_config
    from rlhf_core.trainer.evaluation import run_evaluation

    overrides = list(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config("evaluation", overrides)
        metrics = run_evaluation(config)
    except (FileNotFoundError, KeyError, AttributeError, ValueError, RuntimeError) as exc:
        print(f"rlhf eval: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
