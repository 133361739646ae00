"""The ``rlhf`` command: one entry point for the core (verl-style) and the results store.

``rlhf ppo key=value ...`` runs exactly like ``python -m verl.trainer.main_ppo key=value ...``.
Every subcommand parses its arguments with ``argparse`` (``rlhf <command> --help``) and shows errors the same
way (:mod:`rlhf_core.cli`): an input error (config, data, missing file) as one line with exit code 1, a bad
command line with argparse's usage and exit code 2, anything else (a bug) with its traceback.
Subcommands import their module lazily, so ``rlhf config check`` never imports torch's heavy parts,
Ray or DuckDB; ``rlhf ppo|sft|eval`` parse their command line and load their config before the trainer is
imported (:mod:`rlhf_core.trainer.commands`): ``--help`` and a bad flag or key answer in about a second. This package sits above the layers: it may import ``rlhf_core`` and ``infra``.
"""
from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import Any

from rlhf_core.cli import INTERRUPTED, exit_now, run_command
from rlhf_core.distributed.threads import OMP_WAIT_POLICY
from rlhf_core.progress import quiet_progress_bars_when_redirected

# subcommand -> (module, function, one-line help); the function takes argv (list[str]) and returns an exit code.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "ppo": ("rlhf_core.trainer.commands", "ppo_main", "PPO / GRPO / RLOO / REINFORCE++ training (ppo_trainer.yaml keys)"),
    "sft": ("rlhf_core.trainer.commands", "sft_main", "supervised fine-tuning (sft_trainer.yaml keys)"),
    "eval": ("rlhf_core.trainer.commands", "eval_main", "score a responses parquet (evaluation.yaml keys)"),
    "generate": ("rlhf_core.trainer.commands", "generate_main", "responses of a model to a prompts parquet (generation.yaml keys)"),
    "config": ("rlhf_core.config.cli", "main", "show or check a resolved config: rlhf config show|check [overrides]"),
    "data": ("rlhf_core.data.cli", "main", "prepare datasets: rlhf data gsm8k|countdown --out OUT ..."),
    "merge": ("rlhf_core.workers.merger", "main", "merge an FSDP checkpoint into a Hugging Face directory"),
    "results": ("infra.results_cli", "main", "results store: rlhf results sql|compare|register|path"),
    "pipeline": ("flows.rlhf", "main", "run the whole Prefect flow locally (what `make demo` runs)"),
    "experiment": ("flows.from_verl", "main", "experiment files: rlhf experiment from-verl SCRIPT.sh [--out FILE]"),
    "deploy": ("flows.deploy", "main", "an experiment file as Prefect deployment rlhf/<name>: rlhf deploy FILE"),
}


# with RLHF_HOME set, these run through rlhf_cli.tracked: MLflow under $RLHF_HOME, rows in the results store
TRACKED: dict[str, tuple[str, str]] = {"ppo": ("rlhf_cli.tracked", "ppo_main"),
                                       "eval": ("rlhf_cli.tracked", "eval_main")}


def _usage() -> str:
    lines = ["usage: rlhf <command> [args]", "", "commands:"]
    width = max(map(len, SUBCOMMANDS))  # "experiment" ran into its help at a fixed 9
    lines += [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in SUBCOMMANDS.items()]
    lines += ["", "rlhf <command> --help shows a command's arguments."]
    return "\n".join(lines)


QUICK_EXIT = ("ppo", "sft")
"""Commands that, run as the ``rlhf`` program and interrupted by Ctrl-C, end the process as soon as they have said
so (:func:`rlhf_core.cli.exit_now`): their run is stopped, checkpointed state complete and Ray stopped by then."""


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``rlhf <command> ...``; returns the subcommand's exit code (2 for a usage error). As the ``rlhf``
    program (``argv`` None), a :data:`QUICK_EXIT` command interrupted by Ctrl-C (exit 130) ends the process there:
    the at-exit handlers run, the interpreter's finalization (about 2.3 s after ``rlhf ppo``) does not."""
    args = list(sys.argv[1:] if argv is None else argv)
    code = _dispatch(args)
    if argv is None and code == INTERRUPTED and args[:1] and args[0] in QUICK_EXIT:
        exit_now(code)
    return code


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        near = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        print(f"rlhf: unknown command {name!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = SUBCOMMANDS[name]
    # before any subcommand imports torch (libgomp reads it once, at load): idle OpenMP threads sleep instead of
    # spinning on cores other processes need; Ray workers started from here inherit it (rlhf_core.distributed.threads)
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)
    quiet_progress_bars_when_redirected()
    if name in TRACKED and os.environ.get("RLHF_HOME"):
        # --help, a bad flag or key answer here, before the tracked runner imports DuckDB, MLflow and torch
        code = run_command(f"rlhf {name}", getattr(importlib.import_module(module), func).check, rest)
        if code != 0 or any(a in ("-h", "--help") for a in rest):
            return code
        module, func = TRACKED[name]
    # every main already runs under run_command; this also covers a module imported with an input error
    return run_command(f"rlhf {name}", lambda args: getattr(importlib.import_module(module), func)(args), rest)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
