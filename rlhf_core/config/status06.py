"""Statuses of the keys verl 0.6.0's full configs add beyond the reference (see schema.py for the meaning).

Kept apart from schema.py's tables so the two merge easily; schema.py folds these into ``SUPPORT`` and
``EFFECT``. Rules: a key we have no code for is never "supported"; a key for a backend we do not have
(Megatron, sglang, Ascend NPU, NVIDIA Nsight Systems, multimodal) is "default only" and its message names
that backend; every other unread key is "accepted, no effect yet" with what happens instead.

Keys marked ``_PENDING`` get their effect from work merged at the same time (the "algos" and "effects"
branches): they are "accepted, no effect yet" until that work flips them to supported.
"""

from __future__ import annotations

NO_EFFECT_ON_CPU = "no effect on CPU"
NO_EFFECT_YET = "accepted, no effect yet"

_A = "actor_rollout_ref."
_ROLES = (_A + "actor", _A + "ref", _A + "rollout", "critic", "reward_model")
_NSYS = "NVIDIA Nsight Systems (nsys) profiling, a backend we do not have"
_NPU = "Ascend NPU profiling, a backend we do not have"
_MM = "multimodal models, which we do not have yet"
_SHM = "shared-memory model loading"
_FSDP = ("fsdp", "fsdp2")
_FSDP_ONLY = "only FSDP backends; Megatron is a backend this project does not have"

# path -> (allowed values, why other values are refused)
SUPPORT06: dict[str, tuple[tuple, str]] = {
    _A + "actor.freeze_vision_tower": ((False,), _MM),
    _A + "actor.use_fused_kernels": ((False,), "fused kernels"),
    "data.video_key": (("videos",), _MM),
    "data.return_multi_modal_inputs": ((True,), _MM),
    "model.use_shm": ((False,), _SHM), "critic.model.use_shm": ((False,), _SHM),
    "reward_model.model.use_shm": ((False,), _SHM),
    _A + "ref.model": ((None,), "a separate reference model config (verl's new engine workers); the reference "
                               "is built from actor_rollout_ref.model"),
    _A + "rollout.data_parallel_size": ((1,), "vLLM data-parallel rollout engines"),
    _A + "rollout.expert_parallel_size": ((1,), "vLLM expert-parallel rollout engines"),
    _A + "rollout.pipeline_model_parallel_size": ((1,), "vLLM pipeline-parallel rollout engines"),
    "reward_model.enable_resource_pool": ((False,), "a separate Ray resource pool for the reward model; it runs "
                                                    "next to the actor"),
    "reward_model.sandbox_fusion.url": ((None,), "the Sandbox Fusion code-execution service"),
    "critic.optim.clip_grad": ((1.0,), "verl's new-engine spelling; set critic.grad_clip"),
}
for _r in (_A + "actor", _A + "ref", "critic.model"):
    SUPPORT06[f"{_r}.fsdp_config.ulysses_sequence_parallel_size"] = ((1,), "sequence parallelism")
    SUPPORT06[f"{_r}.fsdp_config.strategy"] = (_FSDP, _FSDP_ONLY)
for _r in _ROLES:
    _t = f"{_r}.profiler.tool_config"
    SUPPORT06[f"{_t}.nsys.discrete"] = ((False,), _NSYS)
    SUPPORT06[f"{_t}.npu.contents"] = (([],), _NPU)
    SUPPORT06[f"{_t}.npu.level"] = (("level1",), _NPU)
    SUPPORT06[f"{_t}.npu.analysis"] = ((True,), _NPU)
    SUPPORT06[f"{_t}.npu.discrete"] = ((False,), _NPU)
_G = "global_profiler.global_tool_config.nsys."
SUPPORT06.update({
    _G + "discrete": ((False,), _NSYS),
    _G + "controller_nsight_options.trace": (("cuda,nvtx,cublas,ucx",), _NSYS),
    _G + "controller_nsight_options.cuda-memory-usage": (("true",), _NSYS),
    _G + "controller_nsight_options.cuda-graph-trace": (("graph",), _NSYS),
    _G + "worker_nsight_options.trace": (("cuda,nvtx,cublas,ucx",), _NSYS),
    _G + "worker_nsight_options.cuda-memory-usage": (("true",), _NSYS),
    _G + "worker_nsight_options.cuda-graph-trace": (("graph",), _NSYS),
    _G + "worker_nsight_options.capture-range": (("cudaProfilerApi",), _NSYS),
    _G + "worker_nsight_options.capture-range-end": ((None,), _NSYS),
    _G + "worker_nsight_options.kill": (("none",), _NSYS),
})

# Values of otherwise accepted keys that need a backend we do not have: path -> {value: backend}.
BACKEND_VALUES: dict[str, dict[object, str]] = {
    "global_profiler.tool": {"nsys": "NVIDIA Nsight Systems (nsys)", "npu": "the Ascend NPU profiler"},
}
for _r in _ROLES:
    BACKEND_VALUES[f"{_r}.profiler.tool"] = BACKEND_VALUES["global_profiler.tool"]

_PENDING = "no code reads it yet"  # prefix of the reasons of keys given effect by parallel work
_PROF = _PENDING + ": no profiler traces are written"
_NEW_ENGINE = "a copy read by verl's new engine workers; this trainer reads the legacy-worker key"
_MT = "not built yet in the multi-turn agent loop (rlhf_core/agent/)"
_AGENT = "one agent loop per rollout rank; nothing reads it yet"
_VLLM_DEFAULT = "not passed to vLLM; the engine's default is used"
_SANDBOX = "read only with reward_model.sandbox_fusion.url, which is not supported"
_HOST_OFFLOAD = "CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory"
_FSDP_PREFETCH = "FSDP2's default prefetching is used; performance only"
# path -> (status, what happens instead)
EFFECT06: dict[str, tuple[str, str]] = {
    # ours for good: options we do not have
    _A + "nccl_timeout": (NO_EFFECT_YET, "the process group uses torch's default timeout"),
    _A + "model.hf_config_path": (NO_EFFECT_YET, "the HF config is read from model.path"),
    _A + "model.tokenizer_path": (NO_EFFECT_YET, "the tokenizer is read from model.path"),
    _A + "model.exclude_modules": (NO_EFFECT_YET, "every target_modules match gets a LoRA adapter"),
    _A + "model.use_liger": (NO_EFFECT_YET, "Liger kernels are not applied; same loss"),
    _A + "actor.use_remove_padding": (NO_EFFECT_YET, "the workers read actor_rollout_ref.model.use_remove_padding, "
                                                      "which this copy follows by default"),
    _A + "ref.entropy_from_logits_with_chunking": (NO_EFFECT_YET, "entropy is always computed in 1024-row chunks"),
    _A + "ref.entropy_checkpointing": (NO_EFFECT_YET, "the reference computes no gradients"),
    _A + "ref.fsdp_config.optimizer_offload": (NO_EFFECT_ON_CPU, "like param_offload for the reference (it has no "
                                                                 "optimizer): " + _HOST_OFFLOAD),
    _A + "ref.fsdp_config.offload_policy": (NO_EFFECT_ON_CPU, _HOST_OFFLOAD),
    "critic.model.fsdp_config.offload_policy": (NO_EFFECT_ON_CPU, _HOST_OFFLOAD),
    "critic.model.fsdp_config.forward_prefetch": (NO_EFFECT_YET, _FSDP_PREFETCH),
    _A + "rollout.gpu_memory_utilization": (NO_EFFECT_ON_CPU, "vLLM on CUDA only: vLLM's CPU backend sizes its KV "
                                                              "cache by VLLM_CPU_KVCACHE_SPACE"),
    _A + "rollout.cudagraph_capture_sizes": (NO_EFFECT_YET, _VLLM_DEFAULT),
    _A + "rollout.max_model_len": (NO_EFFECT_YET, "the engine's max length is prompt_length + response_length"),
    _A + "rollout.enable_chunked_prefill": (NO_EFFECT_YET, _VLLM_DEFAULT + " (off on CPU)"),
    _A + "rollout.enable_prefix_caching": (NO_EFFECT_YET, _VLLM_DEFAULT),
    _A + "rollout.disable_log_stats": (NO_EFFECT_YET, _VLLM_DEFAULT),
    _A + "rollout.multi_stage_wake_up": (NO_EFFECT_YET, "the engine is never put to sleep (see free_cache_engine)"),
    _A + "rollout.update_weights_bucket_megabytes": (NO_EFFECT_YET, "weights are sent to the engine in one pass"),
    _A + "rollout.trace.backend": (NO_EFFECT_YET, "rollout tracing (weave / mlflow) belongs to agent-loop rollout, "
                                                  "which is not supported yet"),
    _A + "rollout.trace.token2text": (NO_EFFECT_YET, "read only with rollout.trace.backend"),
    _A + "rollout.skip_tokenizer_init": (NO_EFFECT_YET, "the engine loads its tokenizer; same outputs"),
    _A + "rollout.layered_summon": (NO_EFFECT_YET, "FSDP weights are gathered whole for the engine update"),
    _A + "rollout.agent.num_workers": (NO_EFFECT_YET, _AGENT),
    **{_A + f"rollout.multi_turn.{k}": (NO_EFFECT_YET, _MT)
       for k in ("use_inference_chat_template", "tokenization_sanity_check_mode",
                 "num_repeat_rollouts")},
    "reward_model.n_gpus_per_node": (NO_EFFECT_YET, "read only with reward_model.enable_resource_pool"),
    "reward_model.nnodes": (NO_EFFECT_YET, "read only with reward_model.enable_resource_pool"),
    "reward_model.model.fsdp_config.wrap_policy.min_num_params": (
        NO_EFFECT_YET, "the reward model reads reward_model.model.fsdp_config.min_num_params"),
    "reward_model.model.fsdp_config.reshard_after_forward": (NO_EFFECT_YET, "the reward model always reshards"),
    "reward_model.model.fsdp_config.fsdp_size": (NO_EFFECT_YET, "the reward model shards over all workers"),
    "reward_model.model.fsdp_config.forward_prefetch": (NO_EFFECT_YET, _FSDP_PREFETCH),
    "reward_model.sandbox_fusion.max_concurrent": (NO_EFFECT_YET, _SANDBOX),
    "reward_model.sandbox_fusion.memory_limit_mb": (NO_EFFECT_YET, _SANDBOX),
    "trainer.esi_redundant_time": (NO_EFFECT_YET, "no cloud-instance expiry watch; save with trainer.save_freq"),
    "trainer.use_legacy_worker_impl": (NO_EFFECT_YET, "one worker implementation here"),
    "ray_kwargs.timeline_json_file": (NO_EFFECT_YET, "no Ray timeline is written"),
    **{"global_profiler.global_tool_config.torch_memory." + k: (NO_EFFECT_YET, _PROF)
       for k in ("trace_alloc_max_entries", "stack_depth", "context", "stacks", "kw_args")},
}
for _r in (_A + "actor", _A + "ref", "critic.model"):
    _f = f"{_r}.fsdp_config."
    EFFECT06.update({
        _f + "use_orig_params": (NO_EFFECT_YET, "an FSDP1 option; FSDP2 has no flat parameters"),
        _f + "entropy_from_logits_with_chunking": (NO_EFFECT_YET, _NEW_ENGINE),
        _f + "use_torch_compile": (NO_EFFECT_YET, _NEW_ENGINE),
        _f + "entropy_checkpointing": (NO_EFFECT_YET, _NEW_ENGINE),
        _f + "forward_only": (NO_EFFECT_YET, "set by verl's new engine itself; the reference never builds an "
                                             "optimizer here"),
    })
for _r in _ROLES:
    _p = f"{_r}.profiler."
    EFFECT06.update({_p + k: (NO_EFFECT_YET, _PROF) for k in ("tool_config.torch.step_start",
                                                                 "tool_config.torch.step_end",
                                                                 "tool_config.torch_memory.trace_alloc_max_entries",
                                                                 "tool_config.torch_memory.stack_depth")})

# Per config file, where a path means something else than in ppo_trainer.yaml: name -> {path: (status, why)}.
EFFECT_IN: dict[str, dict[str, tuple[str, str]]] = {
    "evaluation": {"ray_kwargs.timeline_json_file": (NO_EFFECT_YET, "no Ray timeline is written")},
    "sft_trainer": {
        "data.train_max_samples": (NO_EFFECT_YET, "the SFT dataset uses every row of data.train_files"),
        "data.val_max_samples": (NO_EFFECT_YET, "the SFT dataset uses every row of data.val_files"),
    },
}

CHOICES06: dict[str, tuple] = {
    "global_profiler.tool": ("nsys", "npu", "torch", "torch_memory"),
    **{f"{_r}.profiler.tool": ("nsys", "npu", "torch", "torch_memory") for _r in _ROLES},
    "algorithm.pf_ppo.reweight_method": ("pow", "max_min", "max_random"),
    _A + "actor.optim.warmup_style": ("constant", "cosine"), "critic.optim.warmup_style": ("constant", "cosine"),
    "trainer.use_legacy_worker_impl": ("auto", "enable", "disable"),
    _A + "rollout.multi_turn.tool_response_truncate_side": ("left", "middle", "right"),
    _A + "rollout.multi_turn.tokenization_sanity_check_mode": ("strict", "ignore_strippable", "disable"),
    _A + "rollout.trace.backend": ("weave", "mlflow"),
}
# free-form dicts (sub-keys not checked)
OPEN06 = ("data.apply_chat_template_kwargs", "global_profiler.global_tool_config.torch_memory.kw_args")
