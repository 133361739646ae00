"""What the Prefect UI shows of a flow run: its log lines and its task-run names.

:func:`log_line` sends a line through Prefect's run logger, so the flow run's Logs tab (and the
worker's console) shows it: the stage lines (``stage sft: FINISHED, 105.2 s, ...``), the PPO step
lines, the learning summary and the regression gate's verdict. The ``*_run_name`` functions are
Prefect ``task_run_name`` callables: Prefect calls them with the task run's ``parameters`` dict and
shows the result in the run graph (``sft · 64 rows, 1 epoch`` instead of ``sft-511``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from prefect import get_run_logger
from prefect.exceptions import MissingContextError


def log_line(line: str, level: int = logging.INFO) -> str:
    """Log ``line`` at ``level`` on the current Prefect flow or task run's logger (stored with the run, shown in
    its Logs tab and on the console); outside a run (a task called as ``.fn``, a plain script) it is printed.

    Returns:
        ``line``.
    """
    try:
        logger = get_run_logger()
    except MissingContextError:
        print(line, flush=True)
        return line
    logger.log(level, line)
    return line


def _count(n: Any) -> str:
    """A row count as the data stages read it: ``<= 0`` keeps every row."""
    return str(n) if int(n) > 0 else "all"


def prepare_data_run_name(parameters: Mapping[str, Any]) -> str:
    """``prepare_data · gsm8k · 64 train, 8 val prompts`` (the generator, or ``files``; ``all`` where a count
    ``<= 0`` keeps every row)."""
    data = parameters["data"]
    return (f"prepare_data · {data['generator'] or 'files'} · {_count(data['train_prompts'])} train, "
            f"{_count(data['val_prompts'])} val prompts")


def filter_prompts_run_name(parameters: Mapping[str, Any]) -> str:
    """``filter_prompts · <= 256 tokens, 4 workers`` (the PPO config's data.max_prompt_length and workers)."""
    cfg = parameters["cfg"]
    return f"filter_prompts · <= {cfg['max_prompt_length']} tokens, {cfg['workers']} workers"


def build_model_run_name(parameters: Mapping[str, Any]) -> str:
    """``build_model · 4 layers × 128 hidden, vocab 2000`` (the sizes given; a size left out is not named)."""
    sizes = parameters["sizes"]
    parts = [f"{sizes[k]} {label}" for k, label in (("num_layers", "layers"), ("hidden_size", "hidden"))
             if k in sizes]
    shape = " × ".join(parts) or "default sizes"
    return f"build_model · {shape}" + (f", vocab {sizes['vocab_size']}" if "vocab_size" in sizes else "")


def _override(overrides: list[str], key: str) -> str | None:
    """The last ``key=value`` of ``overrides`` (the one that wins), or None."""
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == key and "=" in o]
    return values[-1] if values else None


def parquet_rows(path: str) -> int | None:
    """Rows of a parquet file from its footer (nothing else is read); None when it cannot be read."""
    import pyarrow.parquet as pq

    try:
        return int(pq.read_metadata(path).num_rows)
    except (OSError, ValueError):
        return None


def sft_run_name(parameters: Mapping[str, Any]) -> str:
    """``sft · 64 rows, 1 epoch``: the training file's rows and ``trainer.total_epochs`` of the overrides (the
    file's name when its footer cannot be read; the epochs left out when the overrides do not set them)."""
    rows = parquet_rows(parameters["train_file"])
    what = f"{rows} rows" if rows is not None else Path(parameters["train_file"]).name
    epochs = _override(list(parameters["overrides"]), "trainer.total_epochs")
    if epochs is not None:
        what += f", {epochs} epoch" + ("" if epochs == "1" else "s")
    return f"sft · {what}"


def ppo_segment_run_name(segment: int, segments: int, first_step: int, last_step: int) -> str:
    """``ppo_segment 1/2 (steps 1-10)``: the flow names each segment when it submits it."""
    return f"ppo_segment {segment}/{segments} (steps {first_step}-{last_step})"


def validate_run_name(parameters: Mapping[str, Any]) -> str:
    """``validate · step 10``: the global step of the checkpoint validated (0: the starting model)."""
    return f"validate · step {int(parameters['global_step'])}"


def evaluate_run_name(parameters: Mapping[str, Any]) -> str:
    """``evaluate · step 20``: the PPO step whose validation responses are scored."""
    return f"evaluate · step {int(parameters['global_step'])}"


__all__ = ["build_model_run_name", "evaluate_run_name", "filter_prompts_run_name", "log_line", "parquet_rows",
           "ppo_segment_run_name",
           "prepare_data_run_name", "sft_run_name", "validate_run_name"]
