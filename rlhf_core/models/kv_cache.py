"""The rollout's KV cache, estimated from ``config.json`` before Ray starts: refuse lengths and batch sizes whose
cache cannot fit in the memory the rollout has (one line with the estimate in GiB, the keys and what to lower).

What is counted: the KV cache of a batch at full length. The HF engine pads the cache of a whole batch to its
longest sequence, so one response running to ``max_response_length`` (likely among many sampled ones) sizes it
for all; vLLM refuses to start when one sequence of ``max_model_len`` cannot fit in its cache. Not counted: the
weights, activations, logits and the allocator's slack, which come on top (a run that passes may still run out of
memory), and forward passes for log-probs (``log_prob_micro_batch_size_per_gpu``), which keep no KV cache.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from omegaconf import DictConfig

from rlhf_core.config.errors import ConfigError
from rlhf_core.models.preflight import local_dir

GIB = 1024 ** 3
_DTYPE_BYTES = {"fp32": 4, "float32": 4, "float": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2}


@dataclass(frozen=True)
class Geometry:
    """What sets a decoder's KV cache size: ``full_layers`` keep every token, ``sliding_layers`` at most
    ``sliding_window`` tokens; each layer stores ``num_kv_heads × head_dim`` values for k and for v per token."""

    full_layers: int
    sliding_layers: int
    sliding_window: int | None
    num_kv_heads: int
    head_dim: int


def geometry(hf_config: Mapping[str, Any]) -> Geometry | None:
    """The KV geometry of a Hugging Face ``config.json`` dict (a multimodal one's ``text_config``), or None when it
    lacks ``num_hidden_layers``, ``num_attention_heads`` or a head size. ``num_key_value_heads`` defaults to
    ``num_attention_heads`` (multi-head attention), ``head_dim`` to ``hidden_size // num_attention_heads``;
    ``layer_types`` entries ``sliding_attention`` are sliding layers when ``sliding_window`` is set."""
    hf_config = hf_config.get("text_config") or hf_config
    layers, heads = hf_config.get("num_hidden_layers"), hf_config.get("num_attention_heads")
    head_dim = hf_config.get("head_dim") or (hf_config["hidden_size"] // heads if hf_config.get("hidden_size") and heads else None)
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(head_dim, int)):
        return None
    window = hf_config.get("sliding_window") if isinstance(hf_config.get("sliding_window"), int) else None
    types = hf_config.get("layer_types") if isinstance(hf_config.get("layer_types"), list) else []
    sliding = sum(t == "sliding_attention" for t in types) if window else 0
    return Geometry(layers - sliding, sliding, window, int(hf_config.get("num_key_value_heads") or heads), head_dim)


def kv_cache_bytes(geo: Geometry, dtype_bytes: int, seq_len: int, sequences: int, tp: int = 1) -> int:
    """Bytes of KV cache for ``sequences`` sequences of ``seq_len`` tokens each, on one of ``tp`` tensor-parallel
    shards (the kv heads are split over them):

    ``2 (k and v) × Σ_layers tokens(layer) × ceil(num_kv_heads / tp) × head_dim × dtype_bytes × sequences``,
    where tokens(layer) is ``seq_len`` for a full-attention layer and ``min(seq_len, sliding_window)`` for a
    sliding one. E.g. Qwen2.5-7B (28 layers, 4 kv heads, head_dim 128) in bf16: 2 × 28 × 4 × 128 × 2 = 57,344
    bytes (56 KiB) per token."""
    tokens = geo.full_layers * seq_len + geo.sliding_layers * min(seq_len, geo.sliding_window or seq_len)
    return 2 * tokens * -(-geo.num_kv_heads // tp) * geo.head_dim * dtype_bytes * sequences


def _model_geometry(model_cfg: DictConfig) -> Geometry | None:
    """The actor model's geometry from its local ``config.json`` (``hf_config_path`` when set), with
    ``override_config`` (its ``model_config`` entries) applied; None when not local or unreadable."""
    folder = local_dir(str(model_cfg.hf_config_path if model_cfg.hf_config_path is not None else model_cfg.path))
    if folder is None or not (folder / "config.json").is_file():
        return None
    try:
        hf_config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None  # check_model_files / the loader name the file
    overrides = {k: v for k, v in dict(model_cfg.override_config).items() if k not in ("model_config", "moe_config")}
    return geometry({**hf_config, **overrides, **dict(model_cfg.override_config.model_config)})


def _device(config: DictConfig) -> str | None:
    """``cpu`` or ``cuda`` for an embedded Ray on this machine; None when the workers are elsewhere
    (``ray_init.address`` set) or ``trainer.device=cuda`` without a GPU here: their memory is not measurable."""
    import torch

    if config.ray_init.address is not None:
        return None
    device = str(config.trainer.device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device if device == "cpu" or torch.cuda.is_available() else None


def _gpu_bytes() -> int:
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory)


def check_rollout_kv_cache(config: DictConfig, val_rows: int | None) -> None:
    """Refuse a PPO config whose rollout KV cache (:func:`kv_cache_bytes`) exceeds the memory it may use.

    * ``rollout.name=hf`` (sync mode): each rank generates its whole share of the batch in one call, so the
      sequences in flight are ``data.train_batch_size × rollout.n`` (and, when validation runs,
      ``(data.val_batch_size or the val_rows validation rows) × val_kwargs.n``) ÷ world size per GPU, compared with
      the GPU's total memory; on CPU all ranks share this machine: the whole batch ÷ ``trainer.nnodes``, compared
      with ``psutil.virtual_memory().available``. KV dtype: the actor's compute dtype (the engine copy's).
    * ``rollout.name=vllm``/``sglang``: the engine schedules what fits, but one sequence of
      ``max_prompt_length + max_response_length`` tokens must fit: compared with
      ``rollout.gpu_memory_utilization`` × GPU memory (per tensor-parallel shard), and on CPU with vLLM's
      ``VLLM_CPU_KVCACHE_SPACE`` GiB (1 unless set, rlhf_core/workers/rollout/vllm_rollout.py). KV dtype: 1 byte
      for an ``fp8`` ``engine_kwargs.vllm.kv_cache_dtype``, else ``rollout.dtype`` (fp32 on CPU).

    Skipped (nothing to measure) when the model is not a local folder with a usable ``config.json``, the workers
    run on an existing cluster (``ray_init.address``), or for the hf engine in async mode.

    Raises:
        ConfigError: one line with the estimate and the budget in GiB, the formula's factors, and the keys to lower.
    """
    arr = config.actor_rollout_ref
    rollout, geo, device = arr.rollout, _model_geometry(arr.model), _device(config)
    if geo is None or device is None:
        return
    prompt, response = int(config.data.max_prompt_length), int(config.data.max_response_length)
    lengths = f"data.max_prompt_length={prompt} + data.max_response_length={response} tokens"
    if rollout.name == "hf" and rollout.mode == "sync":
        _check_hf(config, geo, device, prompt + response, lengths, val_rows)
    elif rollout.name == "vllm" or (rollout.name == "sglang" and device == "cuda"):
        _check_engine(rollout, geo, device, prompt + response, lengths)


def _check_hf(config: DictConfig, geo: Geometry, device: str, seq_len: int, lengths: str, val_rows: int | None) -> None:
    from rlhf_core.workers.rollout.engine_copy import compute_dtype

    rollout, data, trainer = config.actor_rollout_ref.rollout, config.data, config.trainer
    dtype = str(compute_dtype(config.actor_rollout_ref.actor.fsdp_config)).replace("torch.", "")
    if device == "cuda":
        share, per = int(trainer.nnodes) * int(trainer.n_gpus_per_node), "ranks"
        budget, where = _gpu_bytes(), "one GPU's memory"
    else:
        share, per = int(trainer.nnodes), "nodes"
        budget, where = _available_bytes(), "this machine's available memory"
    batches = [(int(data.train_batch_size) * int(rollout.n),
                f"data.train_batch_size={data.train_batch_size} x actor_rollout_ref.rollout.n={rollout.n}",
                "data.train_batch_size or actor_rollout_ref.rollout.n")]
    if val_rows and (int(trainer.test_freq) > 0 or bool(trainer.val_before_train)):
        rows = val_rows if data.val_batch_size is None else int(data.val_batch_size)
        what = (f"the {val_rows} validation rows (data.val_batch_size=null: one batch)" if data.val_batch_size is None
                else f"data.val_batch_size={rows}")
        batches.append((rows * int(rollout.val_kwargs.n), f"{what} x rollout.val_kwargs.n={rollout.val_kwargs.n}",
                        "data.val_batch_size, data.val_max_samples or actor_rollout_ref.rollout.val_kwargs.n"))
    for total, how, keys in batches:
        seqs = -(-total // share)
        _refuse_over(kv_cache_bytes(geo, _DTYPE_BYTES[dtype], seq_len, seqs), budget, geo, _DTYPE_BYTES[dtype], dtype,
                     lengths, f"{seqs} sequences in flight ({how} = {total} / {share} {per})", where,
                     f"lower {keys} or the lengths")


def _check_engine(rollout: DictConfig, geo: Geometry, device: str, seq_len: int, lengths: str) -> None:
    kv_dtype = str(dict(rollout.engine_kwargs.vllm).get("kv_cache_dtype") or "") if rollout.name == "vllm" else ""
    kv_dtype = "" if kv_dtype == "auto" else kv_dtype  # vLLM's default: the model's dtype
    dtype = kv_dtype or ("float32" if device == "cpu" else str(rollout.dtype))  # CPU: engine_kwargs() forces fp32
    nbytes = 1 if dtype.startswith("fp8") else _DTYPE_BYTES.get(dtype)
    if nbytes is None:
        return  # a dtype spelling this estimate does not know: the engine reports a bad one
    if device == "cuda":
        util, tp = float(rollout.gpu_memory_utilization), int(rollout.tensor_model_parallel_size)
        budget = int(util * _gpu_bytes())
        where = f"actor_rollout_ref.rollout.gpu_memory_utilization={util} x one GPU's memory"
        advice = ("raise actor_rollout_ref.rollout.gpu_memory_utilization or tensor_model_parallel_size, or lower "
                  "the lengths")
    else:
        tp, space = 1, float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        budget, where = int(space * GIB), f"vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE={space:g} GiB)"
        advice = "raise VLLM_CPU_KVCACHE_SPACE or lower the lengths"
    seqs = "1 sequence (the least the engine runs)" + (f", on 1 of {tp} tensor-parallel shards" if tp > 1 else "")
    _refuse_over(kv_cache_bytes(geo, nbytes, seq_len, 1, tp), budget, geo, nbytes, dtype, lengths, seqs, where, advice)


def _available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _refuse_over(need: int, budget: int, geo: Geometry, nbytes: int, dtype: str, lengths: str, seqs: str, where: str,
                 advice: str) -> None:
    if need <= budget:
        return
    layers = f"{geo.full_layers} layers" + (f" (+ {geo.sliding_layers} sliding-window layers of "
                                            f"{geo.sliding_window} tokens)" if geo.sliding_layers else "")
    raise ConfigError(
        f"the rollout's KV cache at full length needs {need / GIB:.1f} GiB, more than {where} "
        f"({budget / GIB:.1f} GiB): "
        f"2 (k, v) x {layers} x {geo.num_kv_heads} kv heads x head_dim {geo.head_dim} x {nbytes} bytes ({dtype}) x "
        f"({lengths}) x {seqs}; {advice}")
