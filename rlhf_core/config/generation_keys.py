"""Schema tables and load-time rules of ``configs/generation.yaml`` (``rlhf generate``, verl's ``main_generation``).

Kept apart from schema.py's tables (as status06.py is); schema.py folds them into ``TYPES``, ``NULL_OK``, ``CHOICES``,
``SUPPORT`` and ``EFFECT_IN["generation"]``. The generation config's sections are top-level ``rollout``/``actor``/
``model``, so its paths never collide with ppo_trainer's (``actor_rollout_ref.rollout.*``); ``model.*``, ``data.*``
and ``trainer.*`` paths shared with sft_trainer or evaluation mean the same thing there.

How the keys act: ``rlhf_core/trainer/main_generation.py`` runs the HF rollout engine
(:class:`~rlhf_core.workers.rollout.hf_rollout.HFRollout`) in the calling process, so the keys of verl's Ray worker
group, vLLM engine and FSDP actor are accepted and change nothing (a notice names each one set).
"""
from __future__ import annotations

from omegaconf import DictConfig

from .errors import ConfigError
from .status06 import NO_EFFECT_YET

_INT, _FLOAT, _STR = (int,), (int, float), (str,)
_DTYPES = ("fp32", "bf16", "fp16", "float32", "bfloat16", "float16")

GEN_TYPES: dict[str, tuple] = {
    "model.external_lib": _STR, "rollout.max_model_len": _INT, "rollout.log_prob_micro_batch_size": _INT,
    "ray_kwargs.ray_init.num_cpus": _INT, "ray_kwargs.timeline_json_file": _STR,
}
GEN_NULL_OK = {"rollout.log_prob_micro_batch_size_per_gpu"}
GEN_CHOICES: dict[str, tuple] = {"rollout.dtype": _DTYPES}
GEN_SUPPORT: dict[str, tuple[tuple, str]] = {
    "rollout.name": (("hf",), "rlhf generate runs the hf engine; vllm generation is not wired yet"),
    "rollout.mode": (("sync",), "rlhf generate calls the engine once per batch"),
    "rollout.data_parallel_size": ((1,), "vLLM data-parallel rollout engines"),
    "actor.strategy": (("fsdp", "fsdp2"), "only FSDP backends; Megatron is a backend this project does not have"),
    "actor.ulysses_sequence_parallel_size": ((1,), "sequence parallelism"),
}
_ONE_PROCESS = "generation runs the HF engine in one process on one device (trainer.device)"
_VLLM = "read only by the vllm engine; rlhf generate runs the hf engine"
_NO_ACTOR = "generation builds no actor: the rollout engine loads model.path itself"
_NO_RAY = "generation runs in the calling process and starts no Ray"
GEN_EFFECT: dict[str, tuple[str, str]] = {
    **{f"trainer.{k}": (NO_EFFECT_YET, _ONE_PROCESS) for k in ("nnodes", "n_gpus_per_node")},
    **{f"rollout.{k}": (NO_EFFECT_YET, _VLLM) for k in (
        "gpu_memory_utilization", "enforce_eager", "free_cache_engine", "load_format", "tensor_model_parallel_size",
        "max_num_batched_tokens", "max_model_len", "max_num_seqs", "disable_log_stats", "enable_chunked_prefill")},
    **{f"rollout.{k}": (NO_EFFECT_YET, "no log-probs are computed: the responses parquet holds text only")
       for k in ("log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu")},
    "rollout.calculate_log_probs": (NO_EFFECT_YET, "the responses parquet holds text only, as verl's"),
    "rollout.n": (NO_EFFECT_YET, "data.n_samples sets the responses per prompt"),
    **{f"actor.{k}": (NO_EFFECT_YET, _NO_ACTOR) for k in (
        "entropy_from_logits_with_chunking", "entropy_checkpointing", "fsdp_config.fsdp_size",
        "fsdp_config.forward_prefetch")},
    **{k: (NO_EFFECT_YET, _NO_RAY) for k in (
        "ray_init.num_cpus", "ray_init.timeline_json_file", "ray_kwargs.ray_init.num_cpus",
        "ray_kwargs.timeline_json_file")},
}


def validate_generation_config(cfg: DictConfig) -> None:
    """verl ``main_generation``'s rules, at load: ``data.n_samples >= 1``; ``rollout.temperature == 0`` only with
    ``data.n_samples == 1`` (greedy decoding gives one response; ``rollout.do_sample=False`` is the way to ask for
    greedy copies); ``data.batch_size``, ``rollout.prompt_length`` and ``rollout.response_length`` positive.

    Raises:
        ConfigError: one line per broken rule, naming the keys and values.
    """
    data, rollout = cfg.data, cfg.rollout
    errors = [f"{key}={value!r} must be >= 1" for key, value in (
        ("data.n_samples", data.n_samples), ("data.batch_size", data.batch_size),
        ("rollout.prompt_length", rollout.prompt_length), ("rollout.response_length", rollout.response_length))
        if int(value) < 1]
    if float(rollout.temperature) == 0.0 and int(data.n_samples) != 1:
        errors.append(f"rollout.temperature=0 needs data.n_samples=1 (got {data.n_samples}), as in verl's "
                      "main_generation; set rollout.do_sample=False for greedy decoding")
    if errors:
        raise ConfigError("Invalid config:\n  - " + "\n  - ".join(errors))
