"""The sections verl 0.9's engine-shaped SFT config adds (``sft_trainer_engine.yaml``): ``engine``, ``profiler``,
``model.lora``, ``model.mtp``, ``model.tiled_mlp``, ``model.fused_kernel_options``.

Keys whose meaning equals a verl 0.6 key are not here: they are ``aliases`` of that key in sft_trainer.py
(``engine.model_dtype`` is read as ``model.fsdp_config.model_dtype``). What is left is declared here with verl
0.9.1's name and default and its status on this project.
"""

from dataclasses import dataclass
from typing import Any, List, Optional

from rlhf_core.config.schemas.engine09 import USE_ORIG_PARAMS
from rlhf_core.config.spec import key, section
from rlhf_core.config.schemas.ppo_common import check_schedule

# verl 0.9: engine SFT

_MEGATRON = 'Megatron LoRA (verl 0.9 model.lora.*), a backend this project does not have; FSDP LoRA is model.lora_rank'
_TURBO = 'the fsdp_turbo engine, a backend this project does not have'
_QAT = 'quantization-aware training (NVFP4 kernels), which this project does not have'
_TOKEN = 'SFT generates no tokens: it has no rollout to trace'
_CPU = ('read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); '
        'profiler tool torch_memory is refused here')
_MSPROBE = 'the msprobe precision debugger (Ascend tooling), which this project does not have'
_NPU = 'Ascend NPU profiling, a backend we do not have'


SFT_NO_ENTROPY = ("SFT computes no entropy, as verl 0.9.1's SFT trainer, whose loss (sft_loss, "
                  "verl/workers/utils/losses.py) takes log-probs only")

@dataclass
class EngineQatConfig:
    """``engine.qat``."""

    enable: bool = key(False, 'quantization-aware training (default only)', why=_QAT)
    mode: str = key('w4a16', 'QAT mode: w4a16 | w4a4 (default only)', why=_QAT)
    group_size: int = key(16, 'QAT quantization group size (default only)', why=_QAT)
    ignore_patterns: List[str] = key(['lm_head', 'embed_tokens', 're:.*mlp.gate$'],
        'module patterns QAT leaves alone (default only)', why=_QAT)
    activation_observer: str = key('static_minmax', 'QAT activation observer of w4a4 (default only)', why=_QAT)
    quantization_config_path: Optional[str] = key(None, "vLLM quantization config JSON of QAT (default only)",
        why=_QAT)


@dataclass
class TurboFsdpPlanConfig:
    """``engine.turbo_config.distributed.fsdp_plan``."""

    param_dtype: str = key('bf16', 'fsdp_turbo: parameter dtype (default only)', why=_TURBO)
    reduce_dtype: str = key('fp32', 'fsdp_turbo: gradient reduce dtype (default only)', why=_TURBO)
    output_dtype: str = key('bf16', 'fsdp_turbo: output dtype (default only)', why=_TURBO)
    fsdp_implementation: str = key('native', 'fsdp_turbo: FSDP implementation (default only)', why=_TURBO)
    num_to_forward_prefetch: int = key(1, 'fsdp_turbo: modules prefetched in forward (default only)', why=_TURBO)
    num_to_backward_prefetch: int = key(1, 'fsdp_turbo: modules prefetched in backward (default only)', why=_TURBO)


@dataclass
class TurboDistributedConfig:
    """``engine.turbo_config.distributed``."""

    fully_shard_parallel_size: int = key(16, 'fsdp_turbo: fully-shard group size (default only)', why=_TURBO)
    tensor_parallel_size: int = key(1, 'fsdp_turbo: tensor-parallel size (default only)', why=_TURBO)
    expert_parallel_size: int = key(1, 'fsdp_turbo: expert-parallel size (default only)', why=_TURBO)
    expert_fully_shard_parallel_size: int = key(1, 'fsdp_turbo: expert fully-shard size (default only)', why=_TURBO)
    ulysses_parallel_size: int = key(1, 'fsdp_turbo: Ulysses size (default only)', why=_TURBO)
    fsdp_plan: TurboFsdpPlanConfig = section(TurboFsdpPlanConfig)


@dataclass
class TurboConfig:
    """``engine.turbo_config``."""

    distributed: TurboDistributedConfig = section(TurboDistributedConfig)


@dataclass
class EngineConfig:
    """``engine``: verl 0.9's FSDP engine settings (its ``engine@engine: fsdp`` default). The settings verl 0.6 had
    under ``model.fsdp_config`` / the root are aliases there: ``engine.model_dtype``, ``engine.wrap_policy.*``,
    ``engine.strategy``, ``engine.ulysses_sequence_parallel_size``."""

    param_offload: bool = key(False, 'offload parameters to CPU between uses',
        no_effect_on_cpu='on CPU the weights already live in host memory')
    optimizer_offload: bool = key(False, 'offload optimizer state to CPU between steps',
        no_effect_on_cpu='on CPU the optimizer state already lives in host memory')
    offload_policy: bool = key(False, 'FSDP2 CPUOffloadPolicy during training',
        no_effect_on_cpu='on CPU the weights already live in host memory')
    reshard_after_forward: bool = key(True, 'reshard parameters after forward (FSDP2)')
    fsdp_size: int = key(-1, 'FSDP shard group size; -1 = all workers')
    forward_prefetch: bool = key(False, "prefetch the next layer's all-gather in forward (FSDP2 "
        "set_modules_to_forward_prefetch, depth 1, as verl's FSDP2 path; the same outputs)")
    use_orig_params: bool = key(False, 'FSDP1 flat-parameter option (FSDP2 has no flat parameters)',
        no_effect_yet=USE_ORIG_PARAMS)
    seed: int = key(42, "with full_determinism: the seed of every RNG while the model is built (instead of "
        "trainer.seed); read only with full_determinism, as in verl 0.9's FSDP engine")
    full_determinism: bool = key(False, 'deterministic kernels for debugging: torch.use_deterministic_algorithms('
        'warn_only), cuDNN deterministic, the cuBLAS/flash-attention/NCCL deterministic environment and RNGs seeded '
        "with engine.seed (verl 0.9's enable_full_determinism)")
    entropy_from_logits_with_chunking: bool = key(False, 'compute entropy in chunks',
        no_effect_yet=SFT_NO_ENTROPY)
    entropy_from_logits_chunk_size: int = key(2048, 'chunk size of the chunked entropy',
        no_effect_yet=SFT_NO_ENTROPY)
    use_torch_compile: bool = key(True, 'torch.compile the entropy helper',
        no_effect_yet="verl 0.9.1's FSDP engine (verl/workers/engine/fsdp/transformer_impl.py) compiles only "
                      "entropy_from_logits with it, which SFT never calls (" + SFT_NO_ENTROPY + "); nothing is "
                      "compiled here either")
    entropy_checkpointing: bool = key(False, 'recompute entropy in backward', no_effect_yet=SFT_NO_ENTROPY)
    use_no_sync_for_gradient_accumulation: bool = key(False, "defer FSDP2's gradient reduce-scatter to a step's "
        'last micro-batch (set_requires_gradient_sync, as verl 0.9; the same update, one reduction per step)')
    pad_to_length: bool = key(False, 'round every packed micro-batch up to a multiple of pad_to_length_bucket tokens '
        '(dummy rows that weigh 0 in the loss; the same loss): few distinct shapes for compiled/tuned kernels; read '
        'with use_remove_padding or data.pad_mode=no_padding only')
    pad_to_length_bucket: int = key(1024, 'token granularity of pad_to_length')
    forward_only: bool = key(False, 'build the engine without optimizer (inference)', only=(False,),
        why='SFT always trains')
    dtype: str = key('bfloat16', 'mixed-precision parameter dtype: bfloat16 | float16 (checked, as verl does)',
        choices=('bfloat16', 'float16'),
        no_effect_yet="verl 0.9.1 checks it (verl/workers/config/engine.py) and reads it nowhere; SFT here has no mixed-precision "
                      'policy: it trains in model.fsdp_config.model_dtype (engine.model_dtype)')
    qat: EngineQatConfig = section(EngineQatConfig)
    turbo_config: TurboConfig = section(TurboConfig)


@dataclass
class SftLoraConfig:
    """``model.lora``: verl 0.9's Megatron LoRA (FSDP LoRA is ``model.lora_rank``/``lora_alpha``)."""

    type: str = key('lora', 'Megatron LoRA type: lora | vlm_lora | canonical_lora | dora (default only)',
        why=_MEGATRON)
    merge: bool = key(False, 'merge adapters before syncing weights (default only)', why=_MEGATRON)
    rank: int = key(0, 'Megatron LoRA rank (default only)', why=_MEGATRON)
    alpha: int = key(32, 'Megatron LoRA alpha (default only)', why=_MEGATRON)
    dropout: float = key(0.0, 'Megatron LoRA dropout (default only)', why=_MEGATRON)
    target_modules: List[str] = key(['linear_qkv', 'linear_proj', 'linear_fc1', 'linear_fc2'],
        'Megatron LoRA target modules (default only)', why=_MEGATRON)
    exclude_modules: List[str] = key([], 'Megatron LoRA excluded modules (default only)', why=_MEGATRON)
    dropout_position: str = key('pre', 'Megatron LoRA dropout position (default only)', why=_MEGATRON)
    lora_A_init_method: str = key('xavier', 'Megatron LoRA A init (default only)', why=_MEGATRON)
    lora_B_init_method: str = key('zero', 'Megatron LoRA B init (default only)', why=_MEGATRON)
    a2a_experimental: bool = key(False, 'Megatron LoRA all-to-all (default only)', why=_MEGATRON)
    dtype: Optional[str] = key(None, 'Megatron LoRA weight dtype (default only)', why=_MEGATRON)
    adapter_path: Optional[str] = key(None, 'Megatron LoRA adapter to load (default only)', why=_MEGATRON)
    freeze_vision_model: bool = key(True, 'VLM LoRA: freeze the vision model (default only)', why=_MEGATRON)
    freeze_vision_projection: bool = key(True, 'VLM LoRA: freeze the vision projection (default only)',
        why=_MEGATRON)
    freeze_language_model: bool = key(True, 'VLM LoRA: freeze the language model (default only)', why=_MEGATRON)


@dataclass
class SftMtpConfig:
    """``model.mtp``: multi-token prediction (Megatron / speculative decoding)."""

    enable: bool = key(False, 'multi-token prediction heads (default only)', why='multi-token prediction')
    enable_train: bool = key(False, 'train the MTP heads (default only)', why='multi-token prediction')
    enable_rollout: bool = key(False, 'MTP speculative decoding (default only)', why='multi-token prediction')
    detach_encoder: bool = key(False, 'MTP: detach the encoder (default only)', why='multi-token prediction')
    mtp_loss_scaling_factor: float = key(0.1, 'MTP loss weight (default only)', why='multi-token prediction')
    speculative_algorithm: str = key('EAGLE', 'MTP speculative algorithm (default only)', why='multi-token prediction')
    speculative_num_steps: int = key(3, 'MTP speculative steps (default only)', why='multi-token prediction')
    speculative_eagle_topk: int = key(1, 'MTP EAGLE top-k (default only)', why='multi-token prediction')
    speculative_num_draft_tokens: int = key(4, 'MTP draft tokens (default only)', why='multi-token prediction')
    method: str = key('mtp', 'MTP method (default only)', why='multi-token prediction')
    num_speculative_tokens: int = key(1, 'MTP speculative tokens (default only)', why='multi-token prediction')


@dataclass
class SftTiledMlpConfig:
    """``model.tiled_mlp``."""

    enabled: bool = key(False, 'TiledMLP: compute the MLP in sequence tiles to cut peak memory (same result)')
    num_shards: int = key(4, 'TiledMLP: sequence tiles per MLP input (read with tiled_mlp.enabled)')


@dataclass
class SftFusedKernelOptionsConfig:
    """``model.fused_kernel_options``."""

    impl_backend: str = key('torch', 'fused-kernel backend: torch | triton | liger',
        choices=('torch', 'triton', 'liger'), only=('torch',),
        why='fused-kernel backends other than torch: Triton kernels are GPU-only and model.use_fused_kernels is default only')


@dataclass
class SchedulePlanConfig:
    """``profiler.tool_config.torch.schedule``: torch.profiler.schedule over the profiled SFT steps (one training
    step advances it, as in verl's SFT trainer)."""

    skip_first: int = key(0, 'torch profiler schedule: steps skipped first')
    wait: int = key(0, 'torch profiler schedule: idle steps')
    warmup: int = key(0, 'torch profiler schedule: warmup steps')
    active: int = key(0, 'torch profiler schedule: traced steps')
    repeat: int = key(0, 'torch profiler schedule: cycles; 0 = until the end')

    def __post_init__(self) -> None:
        check_schedule(self)


@dataclass
class SftNpuToolConfig:
    """``profiler.tool_config.npu``."""

    contents: List[Any] = key([], 'Ascend NPU profiler: what to collect (default only)', why=_NPU)
    level: str = key('level0', 'Ascend NPU profiler: level (default only)', why=_NPU)
    analysis: bool = key(True, 'Ascend NPU profiler: parse after collection (default only)', why=_NPU)
    discrete: bool = key(False, 'Ascend NPU profiler: one trace per task (default only)', why=_NPU)
    profile_token_start: Optional[int] = key(None, 'Ascend NPU profiler: first token (default only)', why=_NPU)
    profile_token_end: Optional[int] = key(None, 'Ascend NPU profiler: last token (default only)', why=_NPU)
    name: str = key('npu', 'tool name (fixed)', only=('npu',), why='the name of this tool section')


@dataclass
class SftNsysToolConfig:
    """``profiler.tool_config.nsys``."""

    discrete: Optional[bool] = key(None, 'Nsight Systems: one trace per task (default only)',
        why='NVIDIA Nsight Systems (nsys) profiling, a backend we do not have')
    name: str = key('nsight', 'tool name (fixed)', only=('nsight',), why='the name of this tool section')


@dataclass
class SftTorchToolConfig:
    """``profiler.tool_config.torch``."""

    contents: List[Any] = key([], 'torch profiler: what to record (cpu, cuda, memory, shapes, stack); [] = cpu+cuda',
        item_choices=('cpu', 'cuda', 'memory', 'shapes', 'stack'))
    discrete: bool = key(False, 'torch profiler: one trace per training step instead of one for the interval')
    profile_token_start: Optional[int] = key(None, 'torch profiler: first token', no_effect_yet=_TOKEN)
    profile_token_end: Optional[int] = key(None, 'torch profiler: last token', no_effect_yet=_TOKEN)
    schedule: SchedulePlanConfig = section(SchedulePlanConfig)
    name: str = key('torch', 'tool name (fixed)', only=('torch',), why='the name of this tool section')


@dataclass
class SftTorchMemoryToolConfig:
    """``profiler.tool_config.torch_memory``."""

    trace_alloc_max_entries: int = key(100000, 'torch memory snapshot: max allocation events', no_effect_on_cpu=_CPU)
    stack_depth: int = key(32, 'torch memory snapshot: stack frames per event', no_effect_on_cpu=_CPU)
    memory_snapshot_num_steps: int = key(1, 'torch memory snapshot: steps recorded', no_effect_on_cpu=_CPU)
    name: str = key('torch_memory', 'tool name (fixed)', only=('torch_memory',), why='the name of this tool section')


@dataclass
class SftPrecisionDebuggerToolConfig:
    """``profiler.tool_config.precision_debugger``."""

    config_path: Optional[str] = key(None, 'msprobe precision-debugger config (default only)', why=_MSPROBE)
    steps: Optional[List[Any]] = key(None, 'precision debugger: steps (default only)', why=_MSPROBE)
    stages: Optional[List[Any]] = key(None, 'precision debugger: stages (default only)', why=_MSPROBE)
    name: str = key('precision_debugger', 'tool name (fixed)', only=('precision_debugger',),
        why='the name of this tool section')


@dataclass
class SftProfilerToolConfig:
    """``profiler.tool_config``."""

    npu: SftNpuToolConfig = section(SftNpuToolConfig)
    nsys: SftNsysToolConfig = section(SftNsysToolConfig)
    torch: SftTorchToolConfig = section(SftTorchToolConfig)
    torch_memory: SftTorchMemoryToolConfig = section(SftTorchMemoryToolConfig)
    precision_debugger: SftPrecisionDebuggerToolConfig = section(SftPrecisionDebuggerToolConfig)


@dataclass
class SftProfilerConfig:
    """``profiler`` (verl 0.9's ``profiler@profiler: profiler`` default; steps in trainer.profile_interval)."""

    tool: Optional[str] = key('torch', 'profiler: torch | torch_memory | nsys | npu | precision_debugger',
        choices=('torch', 'torch_memory', 'nsys', 'npu', 'precision_debugger'),
        backend_values={'nsys': 'NVIDIA Nsight Systems (nsys)', 'npu': 'the Ascend NPU profiler',
                        'precision_debugger': 'the msprobe precision debugger (Ascend tooling)',
                        'torch_memory': 'CUDA (a torch.cuda memory snapshot: no effect on CPU)'})
    enable: bool = key(False, 'profile the steps of trainer.profile_interval (torch traces)')
    all_ranks: bool = key(False, 'profile every rank')
    ranks: List[Any] = key([], 'ranks to profile when all_ranks is False')
    save_path: str = key('outputs/profile', 'folder for the traces')
    relocate_results: bool = key(False,
        'move each trace out of save_path/step_<n>/ into save_path as step_<n>_<file> when profiling ends')
    finish_hook_cmd: Optional[str] = key(None,
        'shell command run once when profiling ends (env VERL_PROFILE_SAVE_PATH, VERL_PROFILE_TRACES...); killed '
        'after 900 s; a failure is a warning; null = none')
    finish_hook_all_ranks: bool = key(False, 'run finish_hook_cmd on every rank (False = finish_hook_ranks)')
    finish_hook_ranks: List[Any] = key([],
        'ranks that run finish_hook_cmd; [] (and finish_hook_all_ranks False) = the profiled ranks')
    tool_config: SftProfilerToolConfig = section(SftProfilerToolConfig)
