"""verl 0.9.1 engine and trainer sections: ``reward.reward_model.rollout`` (the engine of a generative reward model,
served here by the hf engine: its sampling keys have effect, vLLM's engine settings none) and ``trainer.v1`` (verl's
experimental v1 trainer loop: ``trainer.v1.trainer_mode`` and ``trainer.v1.separate_async`` choose and set the fully
async driver (rlhf_core/config/v1_trainer.py); the v1 keys without a counterpart here are accepted at verl's default
and refused, naming why, at any other value)."""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from rlhf_core.config.schemas.sections09 import DisaggregationConfig
from rlhf_core.config.spec import free_form, key, section

COLOCATE = ("verl's colocate_async: rollout replicas on the actor's own devices keep num_warmup_batches + 1 batches "
            "of prompts in flight, are aborted once a batch of groups has finished and resume the unfinished ones "
            "with the new weights after the update (partial rollout on hybrid replicas); here the on-policy driver's "
            "colocated hf rollout generates exactly one batch per step and cannot keep requests open across an "
            "update, and the off-policy drivers generate on a standalone rollout group (the nearest: "
            "trainer.v1.trainer_mode=separate_async)")
COLOCATE_READ = "read only by trainer.v1.trainer_mode=colocate_async, which is refused here (" + COLOCATE + ")"
HYBRID = ("verl's separate_async lends the trainer's hybrid replicas (rollout engines on the actor's devices, asleep "
          "during training) to the standalone rollout's load balancer while the trainer waits for samples; the fully "
          "async driver here has no rollout engine on the actor workers and no load balancer (each rollout rank "
          "generates its share of a sub-batch), as for async_training.use_dynamic_resource_scheduling")
HYBRID_READ = "read only with trainer.v1.separate_async.hybrid_rollout.enable_switch=True, which is refused (" + HYBRID + ")"
CUSTOM_SAMPLER = ("verl builds the class with its ReplayBuffer's arguments (refill_fn, trainer_config, ...) and its "
                  "sample(global_steps, partition_id, batch_size) returns TransferQueue KVBatchMeta read from the "
                  "TransferQueue store; this project has no TransferQueue: its fully async trainer takes groups from an "
                  "in-process queue in loader order")
SAMPLER_KWARGS = ("verl hands them only to a custom sampler's constructor (its built-in ReplayBuffer stores them unread); "
                  "trainer.v1.sampler.custom_sampler is refused here (" + CUSTOM_SAMPLER + ")")
REFILL = ("verl marks a prompt group 'failure' when one of its agent-loop sessions raises, and its sync sampler then "
          "pads the missing trajectories or, with this key, replaces the group with a fresh prompt; here a session "
          "that raises fails the generation and the step with its error, so there is no failed group to refill")
SYNC_SECTION = ("verl 0.9.1 defines no sync-mode setting: its sync trainer hands this empty section to the replay "
                "buffer, which stores it unread")
# the judge of a generative reward model is served by the hf engine (rlhf_core/workers/genrm_server.py): one process
# on CPU, requests one at a time; these are the settings of vLLM's engine it does not have
_HF_JUDGE = "the generative reward model's judge is served by the hf engine here (rlhf_core/workers/genrm_server.py: " \
    "one process on CPU, one request at a time), which has no "
GEN_RM_QUANT = "weight quantization of a vLLM/SGLang judge engine; the hf judge loads its weights in rollout.dtype"
GEN_RM_NAME = ("engines other than hf for the judge: vLLM/SGLang reward-model servers are not built here (a verl "
               "0.9 script's reward.reward_model.rollout.name=vllm becomes hf)")


@dataclass
class RewardModelEngineConfig:
    """``reward.reward_model.rollout``: the engine serving a generative reward model (verl 0.9.1 ``RolloutConfig``
    defaults). Set ``name`` (with ``reward_model.enable`` and ``custom_reward_function.path``) and the judge runs
    here (rlhf_core/reward/genrm.py); the sampling keys are the defaults of requests that do not set their own
    (verl's ``override_generation_config``). The legacy ``reward_model.rollout.*``, when not null, replace them."""

    name: Optional[str] = key(None, 'engine of the generative reward model (the judge): hf; null = no generative '
        'reward model (reward_model.enable then runs a discriminative one)', only=(None, 'hf'), why=GEN_RM_NAME,
        verl_default='???', differs='verl requires it whenever a reward model is enabled; null here keeps the '
        'discriminative reward-model workers')
    dtype: str = key('bfloat16', 'generative reward model engine: dtype the judge is loaded in',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16'))
    gpu_memory_utilization: float = key(0.5, 'generative reward model engine: engine memory fraction',
        no_effect_on_cpu=_HF_JUDGE + 'GPU memory pool')
    enforce_eager: bool = key(True, 'generative reward model engine: no CUDA graphs',
        no_effect_on_cpu=_HF_JUDGE + 'CUDA graphs (it always runs eagerly)')
    cudagraph_capture_sizes: Optional[Any] = key(None, 'generative reward model engine: CUDA-graph batch sizes',
        no_effect_on_cpu=_HF_JUDGE + 'CUDA graphs')
    free_cache_engine: bool = key(True, 'generative reward model engine: free the KV cache after generation',
        no_effect_on_cpu=_HF_JUDGE + 'sleep mode: its KV cache lives for one request only')
    data_parallel_size: int = key(1, 'generative reward model engine: data-parallel size',
        no_effect_on_cpu=_HF_JUDGE + 'data-parallel replicas')
    expert_parallel_size: int = key(1, 'generative reward model engine: expert-parallel size',
        no_effect_on_cpu=_HF_JUDGE + 'expert parallelism')
    tensor_model_parallel_size: int = key(2, 'generative reward model engine: tensor-parallel size',
        no_effect_on_cpu=_HF_JUDGE + 'tensor parallelism')
    pipeline_model_parallel_size: int = key(1, 'generative reward model engine: pipeline-parallel size',
        no_effect_on_cpu=_HF_JUDGE + 'pipeline parallelism')
    max_num_batched_tokens: int = key(8192, 'generative reward model engine: tokens per engine step',
        no_effect_on_cpu=_HF_JUDGE + 'continuous batching')
    max_model_len: Optional[Any] = key(None, "generative reward model engine: prompt + completion tokens of a request "
        "(longer ones are refused); null = the judge's max_position_embeddings (verl's vLLM server)", null_ok=True)
    max_num_seqs: int = key(1024, 'generative reward model engine: sequences per batch',
        no_effect_on_cpu=_HF_JUDGE + 'batching of requests')
    load_format: str = key('auto', 'generative reward model engine: weight loading format',
        no_effect_on_cpu=_HF_JUDGE + "load formats: it loads the folder's weights with transformers")
    layered_summon: bool = key(False, 'generative reward model engine: gather weights layer by layer',
        no_effect_on_cpu=_HF_JUDGE + 'sharded weights to gather')
    scheduling_policy: str = key('fcfs', 'generative reward model engine: request scheduling policy',
        only=('fcfs',), why=_HF_JUDGE + 'scheduler but arrival order (fcfs)')
    full_determinism: bool = key(False, 'generative reward model engine: deterministic kernels',
        no_effect_on_cpu=_HF_JUDGE + "batch-invariant kernels; one request at a time from a seeded generator is "
        "already reproducible for a given request order")
    seed: int = key(42, 'generative reward model engine: seed of its sampling generator (a request may set its own)')
    multi_stage_wake_up: bool = key(False, 'generative reward model engine: wake weights and KV cache in stages',
        no_effect_on_cpu=_HF_JUDGE + 'sleep mode')
    engine_kwargs: Dict[str, Any] = free_form('generative reward model engine: extra engine arguments',
        no_effect_on_cpu=_HF_JUDGE + 'vLLM/SGLang engine arguments')
    limit_images: Optional[Any] = key(None, 'generative reward model engine: images per prompt',
        why=_HF_JUDGE + 'image inputs: it takes text messages')
    enable_chunked_prefill: bool = key(True, 'generative reward model engine: chunked prefill',
        no_effect_on_cpu=_HF_JUDGE + 'chunked prefill')
    enable_prefix_caching: bool = key(True, 'generative reward model engine: prefix caching',
        no_effect_on_cpu=_HF_JUDGE + 'prefix cache')
    disable_log_stats: bool = key(True, 'generative reward model engine: no statistics logging',
        no_effect_on_cpu=_HF_JUDGE + 'statistics log')
    skip_tokenizer_init: bool = key(False, 'generative reward model engine: no tokenizer in the engine',
        only=(False,), why='a judge server without its tokenizer (verl asserts it is False for a reward model)')
    ignore_eos: bool = key(False, "generative reward model engine: requests' default ignore_eos (verl's server reads "
        'it nowhere)')
    temperature: float = key(1.0, 'generative reward model engine: temperature of requests that set none')
    top_k: int = key(-1, 'generative reward model engine: top-k of requests that set none; -1 = off')
    top_p: float = key(1, 'generative reward model engine: top-p of requests that set none')
    do_sample: bool = key(True, 'generative reward model engine: false = requests that set no temperature are greedy '
        "(verl's server reads it nowhere)")
    n: int = key(1, 'generative reward model engine: samples per prompt',
        no_effect_yet="verl 0.9.1's reward-model server reads it nowhere either: a request's own n (default 1) decides")
    prompt_length: int = key(2048, 'generative reward model engine: prompt tokens',
        no_effect_yet="verl 0.9.1's reward-model server reads it nowhere either: max_model_len bounds a request")
    response_length: int = key(2048, 'generative reward model engine: max_tokens of requests that set none')
    quantization: Optional[Any] = key(None, 'generative reward model engine: weight quantization', why=GEN_RM_QUANT)
    quantization_config_file: Optional[Any] = key(None, 'generative reward model engine: quantization config file',
        why=GEN_RM_QUANT)
    mtp: Optional[Any] = key(None, 'generative reward model engine: multi-token prediction settings',
        why='multi-token prediction (speculative decoding) of a vLLM/SGLang judge engine')
    disaggregation: DisaggregationConfig = section(DisaggregationConfig)


@dataclass
class RewardRewardModelConfig:
    """``reward.reward_model``: its ``enable``, ``enable_resource_pool``, ``n_gpus_per_node``, ``nnodes`` and
    ``model_path`` are aliases of the ``reward_model.*`` keys (declared there); the engine section is here."""

    rollout: RewardModelEngineConfig = section(RewardModelEngineConfig, 'engine of a generative reward model')


@dataclass
class HybridRolloutConfig:
    """``trainer.v1.separate_async.hybrid_rollout``: lending the trainer's devices to rollout while it waits."""

    enable_switch: bool = key(False, 'v1 separate_async: lend the trainer\'s hybrid replicas to rollout while it '
                              'waits for samples', why=HYBRID)
    switch_threshold_ratio: float = key(0.4, 'v1 separate_async: sampleable fraction of the batch before the hybrid '
                                        'replicas return to training', why=HYBRID_READ)
    adaptive_switch_threshold: bool = key(True, 'v1 separate_async: adapt switch_threshold_ratio to the trainer\'s '
                                          'idle time', why=HYBRID_READ)
    switch_threshold_step_up: float = key(0.05, 'v1 separate_async: ratio added after sustained idle', why=HYBRID_READ)
    switch_threshold_step_down: float = key(0.03, 'v1 separate_async: ratio subtracted after sustained calm',
                                            why=HYBRID_READ)
    switch_threshold_release_steps: int = key(2, 'v1 separate_async: idle or calm steps before the ratio moves',
                                              why=HYBRID_READ)
    switch_cost_window_size: int = key(3, 'v1 separate_async: recent switch costs averaged by the decision',
                                       why=HYBRID_READ)


@dataclass
class ColocateAsyncConfig:
    """``trainer.v1.colocate_async``."""

    num_warmup_batches: int = key(1, 'v1 colocate_async: prompt batches dispatched before the first step',
                                  why=COLOCATE_READ)


@dataclass
class SeparateAsyncConfig:
    """``trainer.v1.separate_async``: read with ``trainer.v1.trainer_mode=separate_async``, which runs the fully
    asynchronous driver (rlhf_core/config/v1_trainer.py)."""

    num_warmup_batches: int = key(1, 'v1 separate_async: prompt batches generated ahead of training (verl dispatches '
                                  'them before the first step); here async_training.staleness_threshold = this: the '
                                  'fully async rollouter runs this many batches ahead, lag <= this many versions')
    parameter_sync_step: int = key(4, 'v1 separate_async: mini-batch updates per step, one weight push at its end '
                                   '(data.train_batch_size = this × ppo_mini_batch_size); here '
                                   'async_training.require_batches = this, trigger_parameter_sync_step = 1')
    hybrid_rollout: HybridRolloutConfig = section(HybridRolloutConfig)


@dataclass
class CustomSamplerConfig:
    """``trainer.v1.sampler.custom_sampler``."""

    path: Optional[str] = key(None, 'v1: file of a custom sampler (a ReplayBuffer subclass)', why=CUSTOM_SAMPLER)
    name: Optional[str] = key(None, 'v1: class name of the custom sampler', why=CUSTOM_SAMPLER)


@dataclass
class V1SamplerConfig:
    """``trainer.v1.sampler``."""

    max_off_policy_threshold: int = key(8, 'v1 separate_async: a prompt group whose span (training version - '
                                        'version of its first token + 1) exceeds this is handled by the strategy '
                                        '(verl: async modes only; read with trainer_mode=separate_async)')
    max_off_policy_strategy: str = key('drop', 'v1 separate_async: drop = evict such a group and generate its '
                                       'prompt again with the current weights (verl: a fresh prompt); wait = evict '
                                       'nothing (the fully async trainer already takes groups oldest first)',
                                       choices=('drop', 'wait'))
    sync_refill_failed_groups: bool = key(False, 'v1 sync: replace prompt groups whose rollout failed with fresh '
                                          'prompts', why=REFILL)
    custom_sampler: CustomSamplerConfig = section(CustomSamplerConfig)
    sampler_kwargs: Dict[str, Any] = free_form('v1: extra constructor arguments of a custom sampler',
                                               why=SAMPLER_KWARGS)


@dataclass
class TrainerV1Config:
    """``trainer.v1``: verl 0.9's experimental trainer loop settings."""

    trainer_mode: str = key('sync', 'v1 trainer mode (with trainer.use_v1): sync = the on-policy driver; '
                            'separate_async = the fully asynchronous driver (async_training.mode=fully_async, its keys '
                            'set from trainer.v1.separate_async); colocate_async is refused',
                            choices=('sync', 'colocate_async', 'separate_async'),
                            backend_values={'colocate_async': COLOCATE})
    sync: Dict[str, Any] = free_form('v1 sync mode settings (verl 0.9.1 defines none)', why=SYNC_SECTION)
    colocate_async: ColocateAsyncConfig = section(ColocateAsyncConfig)
    separate_async: SeparateAsyncConfig = section(SeparateAsyncConfig)
    sampler: V1SamplerConfig = section(V1SamplerConfig)
