"""``rlhf ppo|sft|eval|generate``: the command line, import-light.

Each ``main(argv) -> int`` here parses the command line, loads and validates the config, and runs the cheap
checks that need no torch (a hub id that cannot load here, :mod:`rlhf_core.models.hub`) **before** the trainer
module is imported: torch, Ray and transformers take 7-16 s to import, so ``--help``, a bad flag, an unknown key
or an unreachable hub id answer in about a second. ``rlhf_core.trainer.main_ppo`` / ``main_sft`` / ``main_eval``
re-export these ``main`` functions (``python -m rlhf_core.trainer.main_ppo`` works as before; ``main_generation.main``
calls ``generate_main``).

Ctrl-C (SIGINT) during ``rlhf ppo`` or ``rlhf sft`` prints one line naming the last complete checkpoint under
``trainer.default_local_dir`` and how to resume (:func:`resume_hint`), stops the Ray instance the run started and
exits 130 (as the ``rlhf`` program, at once: ``rlhf_cli.main``, :func:`rlhf_core.cli.exit_now`).

A plain ``rlhf ppo`` (no ``RLHF_METRICS_FILE`` set, e.g. without ``RLHF_HOME``) writes its per-step metrics to
``<trainer.default_local_dir>/metrics.jsonl`` (the ``file`` sink), so ``rlhf results register
<trainer.default_local_dir>`` can add the run to the results store later.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator

from omegaconf import DictConfig

from rlhf_core.cli import config_command

TRACKER_FILE = "latest_checkpointed_iteration.txt"
"""``checkpoint_manager.TRACKER_FILE`` (that module imports torch; a test keeps the two equal)."""


def resume_hint(config: DictConfig) -> str:
    """What an interrupted ``rlhf ppo``/``rlhf sft`` run leaves to resume from: ``last checkpoint: <dir>/global_step_N
    (...)`` with the keys to resume it, or why there is none. Reads the tracker file only (no torch)."""
    trainer = config.trainer
    root = str(trainer.default_local_dir)
    step = None
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(root, TRACKER_FILE), encoding="utf-8") as fh:
            step = int(fh.read().strip())
    if step is None:
        saves = "trainer.save_freq=-1 writes none until the last step" if int(trainer.save_freq) <= 0 else \
            f"the first is written at step {int(trainer.save_freq)} (trainer.save_freq)"
        return f"no checkpoint in trainer.default_local_dir={root} yet ({saves}): a rerun starts from the beginning"
    how = "run the same command again" if str(trainer.resume_mode) == "auto" else \
        "run the same command with trainer.resume_mode=auto"
    return (f"last checkpoint: {os.path.join(root, f'global_step_{step}')}; to resume from it, {how} (same "
            f"trainer.default_local_dir={root})")


@contextlib.contextmanager
def metrics_file_in_output(config: DictConfig) -> Iterator[str]:
    """Set ``RLHF_METRICS_FILE`` to ``<trainer.default_local_dir>/metrics.jsonl`` for the block unless it is set
    already (the pipeline and ``RLHF_HOME`` runs choose their own); yields the file in use. The trainer's tracker
    adds the ``file`` sink whenever that variable is set (:mod:`rlhf_core.trainer.tracking`)."""
    if os.environ.get("RLHF_METRICS_FILE"):
        yield os.environ["RLHF_METRICS_FILE"]
        return
    path = os.path.join(os.path.abspath(str(config.trainer.default_local_dir)), "metrics.jsonl")
    os.environ["RLHF_METRICS_FILE"] = path
    try:
        yield path
    finally:
        os.environ.pop("RLHF_METRICS_FILE", None)


def _run_ppo(config: DictConfig) -> dict[str, Any]:
    from rlhf_core.data.fs import check_local_files
    from rlhf_core.models.hub import check_hub_models, ppo_model_keys

    check_local_files(config, ("data.train_files", "data.val_files"))
    check_hub_models(config, ppo_model_keys(config) + ["data.tokenizer"])  # before 10 s of imports
    from rlhf_core.trainer.main_ppo import run_ppo

    with metrics_file_in_output(config):
        return run_ppo(config)


def _run_sft(config: DictConfig) -> dict[str, Any]:
    from rlhf_core.data.fs import check_local_files
    from rlhf_core.models.hub import check_hub_model

    check_local_files(config, ("data.train_files", "data.val_files"))
    check_hub_model("model.partial_pretrain", str(config.model.partial_pretrain))
    from rlhf_core.trainer.sft_trainer import run_sft

    return run_sft(config)


def _run_generation(config: DictConfig) -> str:
    from rlhf_core.data.fs import check_local_files
    from rlhf_core.models.hub import check_hub_model

    check_local_files(config, ("data.path",))
    check_hub_model("model.path", str(config.model.path))  # before 10 s of imports
    from rlhf_core.trainer.main_generation import run_generation

    return run_generation(config)


def _run_eval(config: DictConfig) -> dict[str, float]:
    from rlhf_core.trainer.evaluation import run_evaluation

    return run_evaluation(config)


ppo_main = config_command(
    "rlhf ppo", "ppo_trainer", "PPO / GRPO / RLOO / REINFORCE++ training with verl's ppo_trainer.yaml keys\n"
    "(like python -m verl.trainer.main_ppo). Metrics also go to <trainer.default_local_dir>/metrics.jsonl, which\n"
    "rlhf results register <trainer.default_local_dir> adds to the results store.",
    "rlhf ppo data.train_files=train.parquet actor_rollout_ref.model.path=MODEL algorithm.adv_estimator=grpo "
    "actor_rollout_ref.rollout.n=4", _run_ppo,
    lambda result: f"ppo finished at global step {result['global_step']}; checkpoint: {result['checkpoint_dir']}",
    interrupted=resume_hint)

sft_main = config_command(
    "rlhf sft", "sft_trainer", "Supervised fine-tuning with verl's sft_trainer.yaml keys\n"
    "(like torchrun -m verl.trainer.fsdp_sft_trainer).",
    "rlhf sft data.train_files=train.parquet model.partial_pretrain=MODEL trainer.total_epochs=1", _run_sft,
    lambda result: f"sft finished at step {result['global_step']}; model: {result['hf_model_dir']}",
    interrupted=resume_hint)

eval_main = config_command(
    "rlhf eval", "evaluation", "Score a parquet of generated responses with the reward function, print the metrics "
    "as JSON\n(verl's evaluation.yaml keys; like python -m verl.trainer.main_eval).",
    "rlhf eval data.path=responses.parquet data.response_key=responses", _run_eval,
    lambda metrics: json.dumps(metrics, indent=2, sort_keys=True))

generate_main = config_command(
    "rlhf generate", "generation", "Generate data.n_samples responses per prompt of a parquet with any model and write\n"
    "the rows plus a responses column (verl's generation.yaml keys; like python -m verl.trainer.main_generation);\n"
    "rlhf eval data.path=<data.output_path> scores it.",
    "rlhf generate data.path=test.parquet model.path=MODEL data.output_path=responses.parquet data.n_samples=4 "
    "rollout.temperature=1.0 rollout.response_length=256", _run_generation,
    lambda path: f"responses written: {path}")
