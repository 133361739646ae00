"""verl 0.9.1 sections of trainers and engines this project does not run: ``reward.reward_model.rollout`` (the engine
of a generative reward model) and ``trainer.v1`` (verl's experimental v1 trainer loop). The engine's keys, and the v1
keys without a counterpart here, are accepted at verl's default and refused, naming why, at any other value;
``trainer.v1.trainer_mode`` and ``trainer.v1.separate_async`` choose and set the fully async driver
(rlhf_core/config/v1_trainer.py)."""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from rlhf_core.config.schemas.sections09 import DisaggregationConfig
from rlhf_core.config.spec import free_form, key, section

GEN_RM = "a generative reward model served by its own rollout engine, which this project does not have"
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


@dataclass
class RewardModelEngineConfig:
    """``reward.reward_model.rollout``: the engine serving a generative reward model (verl 0.9.1 ``RolloutConfig``
    defaults; the legacy ``reward_model.rollout`` leaves are null)."""

    name: Optional[str] = key(None, 'engine of the generative reward model (verl: vllm | sglang; required there)',
        why=GEN_RM, verl_default='???', differs='verl requires it when a generative reward model is enabled; none runs here')
    dtype: str = key('bfloat16', 'generative reward model engine: engine dtype', why=GEN_RM)
    gpu_memory_utilization: float = key(0.5, 'generative reward model engine: engine memory fraction', why=GEN_RM)
    enforce_eager: bool = key(True, 'generative reward model engine: no CUDA graphs', why=GEN_RM)
    cudagraph_capture_sizes: Optional[Any] = key(None, 'generative reward model engine: CUDA-graph batch sizes', why=GEN_RM)
    free_cache_engine: bool = key(True, 'generative reward model engine: free the KV cache after generation', why=GEN_RM)
    data_parallel_size: int = key(1, 'generative reward model engine: data-parallel size', why=GEN_RM)
    expert_parallel_size: int = key(1, 'generative reward model engine: expert-parallel size', why=GEN_RM)
    tensor_model_parallel_size: int = key(2, 'generative reward model engine: tensor-parallel size', why=GEN_RM)
    pipeline_model_parallel_size: int = key(1, 'generative reward model engine: pipeline-parallel size', why=GEN_RM)
    max_num_batched_tokens: int = key(8192, 'generative reward model engine: tokens per engine step', why=GEN_RM)
    max_model_len: Optional[Any] = key(None, 'generative reward model engine: max sequence length; null = prompt + response', why=GEN_RM)
    max_num_seqs: int = key(1024, 'generative reward model engine: sequences per batch', why=GEN_RM)
    load_format: str = key('auto', 'generative reward model engine: weight loading format', why=GEN_RM)
    layered_summon: bool = key(False, 'generative reward model engine: gather weights layer by layer', why=GEN_RM)
    scheduling_policy: str = key('fcfs', 'generative reward model engine: request scheduling policy', why=GEN_RM)
    full_determinism: bool = key(False, 'generative reward model engine: deterministic kernels', why=GEN_RM)
    seed: int = key(42, 'generative reward model engine: sampling seed', why=GEN_RM)
    multi_stage_wake_up: bool = key(False, 'generative reward model engine: wake weights and KV cache in stages', why=GEN_RM)
    engine_kwargs: Dict[str, Any] = free_form('generative reward model engine: extra engine arguments', why=GEN_RM)
    limit_images: Optional[Any] = key(None, 'generative reward model engine: images per prompt', why=GEN_RM)
    enable_chunked_prefill: bool = key(True, 'generative reward model engine: chunked prefill', why=GEN_RM)
    enable_prefix_caching: bool = key(True, 'generative reward model engine: prefix caching', why=GEN_RM)
    disable_log_stats: bool = key(True, 'generative reward model engine: no statistics logging', why=GEN_RM)
    skip_tokenizer_init: bool = key(False, 'generative reward model engine: no tokenizer in the engine', why=GEN_RM)
    ignore_eos: bool = key(False, 'generative reward model engine: generate past EOS', why=GEN_RM)
    temperature: float = key(1.0, 'generative reward model engine: sampling temperature', why=GEN_RM)
    top_k: int = key(-1, 'generative reward model engine: top-k; -1 = off', why=GEN_RM)
    top_p: int = key(1, 'generative reward model engine: top-p', why=GEN_RM)
    do_sample: bool = key(True, 'generative reward model engine: sample (false = greedy)', why=GEN_RM)
    n: int = key(1, 'generative reward model engine: samples per prompt', why=GEN_RM)
    prompt_length: int = key(2048, 'generative reward model engine: prompt tokens', why=GEN_RM)
    response_length: int = key(2048, 'generative reward model engine: response tokens', why=GEN_RM)
    quantization: Optional[Any] = key(None, 'generative reward model engine: weight quantization', why=GEN_RM)
    quantization_config_file: Optional[Any] = key(None, 'generative reward model engine: quantization config file', why=GEN_RM)
    mtp: Optional[Any] = key(None, 'generative reward model engine: multi-token prediction settings', why=GEN_RM)
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
