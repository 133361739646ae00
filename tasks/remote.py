"""Driver functions that run inside Ray (one per stage). No Prefect import here.

Each takes plain, picklable arguments (config name + override list), loads the config on
the remote side and calls the core's entry point. The MLflow run and metrics file come in
through environment variables set by ``infra.ray_cluster.run_on_ray``.
"""

from __future__ import annotations

from typing import Any


def _plain(result: Any) -> Any:
    """Make a core result picklable and small: numbers, strings, lists and dicts only."""
    if isinstance(result, dict):
        return {str(k): _plain(v) for k, v in result.items()}
    if isinstance(result, (list, tuple)):
        return [_plain(v) for v in result]
    if hasattr(result, "item") and getattr(result, "ndim", 1) == 0:
        return result.item()
    if result is None or isinstance(result, (bool, int, float, str)):
        return result
    return str(result)


def build_model_remote(train_file: str, out_dir: str, sizes: dict[str, int]) -> str:
    """Build the tiny model from the warm-up pairs, the prompts (and SFT ``messages``, when present) of a verl-schema
    parquet, role names included (:func:`rlhf_core.models.tiny.chat_texts`). A row's warm-up pair is its
    ``extra_info`` ``warmup_question``/``warmup_answer`` (Countdown) or else ``question``/``answer`` (GSM8K)."""
    import pandas as pd

    from rlhf_core.models.tiny import build_tiny_model, chat_texts

    df = pd.read_parquet(train_file)
    texts: list[str] = []
    for extra in df["extra_info"]:
        keys = ("warmup_question", "warmup_answer") if "warmup_question" in extra else ("question", "answer")
        texts.extend(str(extra.get(k, "")) for k in keys)
    for prompt in df["prompt"]:
        texts.extend(chat_texts(prompt))
    if "messages" in df:  # gsm8k_tools: the SFT traces' tool calls and responses
        for messages in df["messages"]:
            texts.extend(chat_texts(messages))
    return build_tiny_model(texts, out_dir, **sizes)


def sft_remote(overrides: list[str]) -> dict[str, Any]:
    """``run_sft(load_config("sft_trainer", overrides))``; returns its result dict."""
    from rlhf_core.config import load_config
    from rlhf_core.trainer.main_sft import run_sft

    return _plain(run_sft(load_config("sft_trainer", overrides)))


def ppo_remote(overrides: list[str]) -> dict[str, Any]:
    """``run_ppo(load_config("ppo_trainer", overrides))``; returns final metrics, global_step, checkpoint_dir."""
    from rlhf_core.config import load_config
    from rlhf_core.trainer.main_ppo import run_ppo

    return _plain(run_ppo(load_config("ppo_trainer", overrides)))


def evaluation_remote(overrides: list[str]) -> dict[str, Any]:
    """``run_evaluation(load_config("evaluation", overrides))``; returns its metrics."""
    from rlhf_core.config import load_config
    from rlhf_core.trainer.evaluation import run_evaluation

    return _plain(run_evaluation(load_config("evaluation", overrides)))


def generation_remote(overrides: list[str]) -> dict[str, Any]:
    """``run_generation(load_config("generation", overrides))`` (``rlhf generate``): returns ``output_path`` (the
    responses parquet written), ``rows`` (its prompts) and ``responses`` (per row: ``data.n_samples``)."""
    import pyarrow.parquet as pq

    from rlhf_core.config import load_config
    from rlhf_core.trainer.main_generation import run_generation

    config = load_config("generation", overrides)
    path = run_generation(config)
    return {"output_path": path, "rows": pq.read_metadata(path).num_rows, "responses": int(config.data.n_samples)}


def merge_remote(actor_dir: str, target_dir: str) -> str:
    """``merge_checkpoint(actor_dir, target_dir)``: an actor checkpoint as a loadable HF folder."""
    from rlhf_core.workers.merger import merge_checkpoint

    return merge_checkpoint(actor_dir, target_dir)
