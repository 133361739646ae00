"""generation.yaml: ``rlhf generate`` (verl's ``main_generation`` config).

Generated once from the YAML; now the one source of these keys (see rlhf_core/config/spec.py). Edit here, then
run `python -m rlhf_core.config.gen_yaml` to rewrite rlhf_core/configs/*.yaml and docs/CONFIG_KEYS.md.
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from rlhf_core.config.spec import free_form, key, section

# The comment lines at the top of the generated YAML file.
YAML_HEADER = (
    'generation.yaml — generate responses to a parquet of prompts (verl 0.6 main_generation keys + ours).',
    'rlhf generate data.path=prompts.parquet model.path=MODEL data.output_path=responses.parquet',
    'Generated from rlhf_core/config/schemas/ by `python -m rlhf_core.config.gen_yaml`: edit the classes, not this file.',
)


_ENGINE_LOG_PROBS = ("no separate log-prob forward: calculate_log_probs takes the engine's own log-probs at "
                     "sampling time (verl 0.6's rollout-only generation worker does not read it either)")
@dataclass
class TrainerConfig:
    """``trainer``."""

    nnodes: int = key(1, 'nodes of the Ray worker group: nnodes x n_gpus_per_node rollout ranks share each batch '
        '(hf engine; one rank without a timeline runs in this process; vllm: one engine here)')
    n_gpus_per_node: int = key(1, 'rollout ranks per node (GPUs, or on CPU worker processes of max(1, CPUs / '
        'ranks) threads; more ranks than CPUs run, with a warning). Ours 1, verl 8: one rank runs in this process, '
        'as rlhf generate did before the key had effect; 8 would start 8 model copies on a CPU machine')
    device: str = key('auto', 'device: auto (cuda if available else cpu) | cuda | cpu',
        choices=('auto', 'cpu', 'cuda'), ours=True)


@dataclass
class DataConfig:
    """``data``."""

    path: str = key('~/data/rlhf/math/test.parquet',
        'parquet of prompts (verl RL schema; a local path or any fsspec URL)')
    prompt_key: str = key('prompt', 'column holding the prompt (a list of chat messages)')
    n_samples: int = key(5, "responses generated per prompt (the length of each row's responses list)")
    output_path: str = key('/opt/tiger/math_Qwen2-7B-Instruct.parquet',
        'parquet written: the input rows plus a responses column')
    batch_size: int = key(128, 'prompts per generate call')
    trust_remote_code: bool = key(False,
        'let the tokenizer folder run its own code (verl reads it with default False)', ours=True)
    apply_chat_template_kwargs: Dict[str, Any] = free_form('extra variables the chat template sees, e.g. {enable_thinking: false} (verl reads it with default {})',
        ours=True)


@dataclass
class ModelConfig:
    """``model``."""

    path: str = key('~/models/Qwen2-7B-Instruct', 'model folder, hub id or fsspec URL')
    external_lib: Optional[str] = key(None,
        'module(s) imported before loading the model (registers custom architectures)')
    trust_remote_code: bool = key(False, 'let the model folder run its own code (verl reads it with default False)',
        ours=True)


@dataclass
class RolloutConfig:
    """``rollout``."""

    name: str = key('hf', "rollout engine: hf (transformers) | vllm (needs vLLM installed; verl's default)",
        choices=('hf', 'vllm'))
    mode: str = key('sync', 'sync = one generate call per batch (verl 0.6); async is not supported by rlhf generate',
        why='rlhf generate calls the engine once per batch')
    seed: int = key(0, 'sampling seed: hf seeds call i of rollout rank r with seed + 7919*r + i (one stream per call '
        'and rank: sampled responses depend on the rank count); vllm seeds request j of call i with '
        'seed + 104729*i + j', ours=True)
    temperature: float = key(1.0, 'sampling temperature')
    top_k: int = key(50, 'top-k sampling; 0 (hf) or -1 (vllm) = disabled')
    top_p: float = key(0.7, 'top-p (nucleus) sampling')
    prompt_length: int = key(1536,
        'longest prompt in tokens, chat template included (longer prompts are refused, naming the row)')
    response_length: int = key(512, 'max generated tokens per response')
    dtype: str = key('bfloat16', 'dtype the model generates in',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16'))
    gpu_memory_utilization: float = key(0.5, 'vllm: fraction of GPU memory for the engine',
        no_effect_on_cpu="vLLM on CUDA only: vLLM's CPU backend sizes its KV cache by VLLM_CPU_KVCACHE_SPACE",
        engine='vllm')
    ignore_eos: bool = key(False, 'keep generating after EOS')
    enforce_eager: bool = key(True, 'vllm: disable CUDA graphs',
        engine='vllm')
    free_cache_engine: bool = key(True, 'vllm: release the KV cache after generation',
        no_effect_on_cpu="on CUDA the engine sleeps after each batch (level 1: weights to host memory, KV cache "
                         "freed) and wakes before the next; vLLM's sleep mode is CUDA only", engine='vllm')
    load_format: str = key('auto', "vllm: weight loader; verl's dummy_* (random weights, replaced by an actor's) "
        "loads model.path's weights (auto): generation has no actor", engine='vllm')
    tensor_model_parallel_size: int = key(1, 'vllm: tensor-parallel size of the engine',
        engine='vllm')
    data_parallel_size: int = key(1, 'vllm: data-parallel size of the engine (default only)',
        why='vLLM data-parallel rollout engines')
    max_num_batched_tokens: int = key(8192, 'vllm: max tokens per engine batch',
        engine='vllm')
    max_model_len: Optional[int] = key(None,
        'vllm: max prompt + response tokens; null = prompt_length + response_length',
        engine='vllm')
    max_num_seqs: int = key(1024, 'vllm: max sequences per engine batch',
        engine='vllm')
    log_prob_micro_batch_size: Optional[int] = key(None, 'deprecated global micro-batch for log-probs',
        no_effect_yet=_ENGINE_LOG_PROBS)
    log_prob_micro_batch_size_per_gpu: Optional[int] = key(8, 'sequences per forward when computing log-probs',
        no_effect_yet=_ENGINE_LOG_PROBS)
    do_sample: bool = key(True, 'sample (True) or greedy decode (False)')
    disable_log_stats: bool = key(True, "vllm: silence the engine's periodic statistics log",
        engine='vllm')
    enable_chunked_prefill: bool = key(True, 'vllm: split long prompts over engine steps',
        no_effect_on_cpu='off on CPU: vLLM 0.32 CPU fails on a seeded request whose prompt is split over two steps '
                         '("CPU Generator does not use offset"); passed to vLLM on CUDA', engine='vllm')
    n: int = key(1, 'responses per generate call (data.n_samples sets the responses per prompt)',
        no_effect_yet="data.n_samples sets the responses per prompt; the engine samples one response per request, "
                      "as verl 0.6's main_generation, whose rollout sets n=1 (the batch is repeated instead)")
    calculate_log_probs: bool = key(False, "also write a rollout_log_probs column: per response, the engine's "
        "log-prob of each sampled token (of the logits it was drawn from: / temperature, cut to top_k/top_p); "
        "verl computes them but writes text only")


@dataclass
class ActorFSDPConfig:
    """``actor.fsdp_config``."""

    fsdp_size: int = key(-1, 'FSDP shard group size; -1 = all ranks',
        no_effect_yet='generation builds no actor: the rollout engine loads model.path itself')
    forward_prefetch: bool = key(False, 'FSDP1 forward prefetch',
        no_effect_yet='generation builds no actor: the rollout engine loads model.path itself')


@dataclass
class ActorConfig:
    """``actor``."""

    strategy: str = key('fsdp', 'training backend (kept for backward compatibility)', only=('fsdp', 'fsdp2'),
        why='only FSDP backends; Megatron is a backend this project does not have')
    ulysses_sequence_parallel_size: int = key(1, 'sequence-parallel size', why='sequence parallelism')
    entropy_from_logits_with_chunking: bool = key(False, 'compute entropy in chunks',
        no_effect_yet='generation builds no actor: the rollout engine loads model.path itself')
    entropy_checkpointing: bool = key(False, 'recompute entropy in the backward',
        no_effect_yet='generation builds no actor: the rollout engine loads model.path itself')
    fsdp_config: ActorFSDPConfig = section(ActorFSDPConfig)


@dataclass
class RayInitConfig:
    """``ray_init``."""

    num_cpus: Optional[int] = key(None, 'CPUs of the embedded Ray instance the rollout ranks run on (each rank: '
        'CPUs / ranks threads); null = all. A one-rank run without a timeline starts no Ray')
    timeline_json_file: Optional[str] = key(None, "write Ray's timeline of the rollout ranks to this file (runs "
        'even one rank on Ray); null = none')


@dataclass
class RayKwargsRayInitConfig:
    """``ray_kwargs.ray_init``."""

    num_cpus: Optional[int] = key(None, 'CPUs of the embedded Ray instance; null = all (alias of ray_init.num_cpus)',
        same_as='ray_init.num_cpus')


@dataclass
class RayKwargsConfig:
    """``ray_kwargs``."""

    ray_init: RayKwargsRayInitConfig = section(RayKwargsRayInitConfig)
    timeline_json_file: Optional[str] = key(None,
        "write Ray's timeline to this file; null = none (alias of ray_init.timeline_json_file)",
        same_as='ray_init.timeline_json_file')


@dataclass
class GenerationConfig:
    """the root of generation.yaml."""

    trainer: TrainerConfig = section(TrainerConfig)
    data: DataConfig = section(DataConfig)
    model: ModelConfig = section(ModelConfig)
    rollout: RolloutConfig = section(RolloutConfig)
    actor: ActorConfig = section(ActorConfig)
    ray_init: RayInitConfig = section(RayInitConfig)
    ray_kwargs: RayKwargsConfig = section(RayKwargsConfig,
        'verl 0.6 spelling of the ray_init section; the two are aliases (set one, or both to the same value)')
