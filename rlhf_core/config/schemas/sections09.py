"""Top-level sections verl 0.9 added to ppo_trainer.yaml (``distillation``, ``skip``, ``transfer_queue``,
``sandbox_fusion``) and the rollout/reward-model sub-sections it added (``checkpoint_engine``, ``prometheus``,
``disaggregation``, ``reward_model.rollout``). Backends we do not have are accepted at their defaults only, their
error naming the backend.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from rlhf_core.config.spec import check_section, free_form, key, section

TQ = "verl's TransferQueue data plane, which this project does not have"
DISAGG = 'prefill/decode disaggregation (sglang), a backend this project does not have'
TQ_SKIP = ("the V1 trainer's rollout through TransferQueue (trainer.use_v1), a data plane this project does not have; "
           "skip.rollout dumps/replays this project's rollout")
PROM = 'Prometheus metrics of the rollout servers, which this project does not export'


@dataclass
class CheckpointEngineConfig:
    """``actor_rollout_ref.rollout.checkpoint_engine``: how trained weights reach the rollout engine."""

    backend: str = key('naive', 'weight-sync backend: naive (in-process copy)', only=('naive',),
        why='weight-sync backends other than naive (nccl, nixl, ...)')
    update_weights_bucket_megabytes: int = key(2048, 'vllm: weights are staged to the engine in buckets of this many MB',
        engine="vllm", aliases=('actor_rollout_ref.rollout.update_weights_bucket_megabytes',))
    engine_kwargs: Dict[str, Any] = free_form('extra arguments of the weight-sync backend',
        no_effect_yet="verl passes engine_kwargs.<backend> to the weight-sync backend; the naive backend, the only "
                      "one here, takes no argument from it (verl's takes is_master only)")
    custom_backend_module: Optional[str] = key(None, 'python module registering a custom weight-sync backend',
        only=(None,), why='custom weight-sync backends')


@dataclass
class PrometheusConfig:
    """``actor_rollout_ref.rollout.prometheus``."""

    enable: bool = key(False, 'serve rollout-server metrics to Prometheus', why=PROM)
    port: int = key(9090, 'Prometheus: port', why=PROM)
    file: str = key('/tmp/ray/session_latest/metrics/prometheus/prometheus.yml', 'Prometheus: its config file',
        why=PROM)
    served_model_name: Optional[str] = key('${oc.select:actor_rollout_ref.model.path,null}',
        'Prometheus: model name on the metrics (follows model.path)',
        no_effect_yet='read only with rollout.prometheus.enable, which is refused (' + PROM + ')')


@dataclass
class DisaggregationConfig:
    """``actor_rollout_ref.rollout.disaggregation``."""

    enabled: bool = key(False, 'run prefill and decode on separate engine replicas', why=DISAGG)
    prefill_replicas: int = key(1, 'disaggregation: prefill replicas', why=DISAGG)
    decode_replicas: int = key(1, 'disaggregation: decode replicas', why=DISAGG)
    decode_tensor_model_parallel_size: Optional[int] = key(None, 'disaggregation: decode TP size; null = rollout TP',
        why=DISAGG)
    transfer_backend: str = key('nixl', 'disaggregation: KV-cache transfer backend', why=DISAGG)
    bootstrap_port: Optional[int] = key(None, 'disaggregation: bootstrap port; null = chosen', why=DISAGG)
    ib_device: Optional[str] = key(None, 'disaggregation: InfiniBand device; null = auto', why=DISAGG)


@dataclass
class DistillationLossConfig:
    """``distillation.distillation_loss`` (verl 0.9.1; rlhf_core/algos/distillation.py, docs/ALGORITHMS.md)."""

    loss_mode: str = key('k3', 'distillation loss: a reverse-KL estimator of the sampled token (k1|kl, abs, k2|mse, '
        'k3|low_var_kl) or forward_kl_topk (forward KL over the teacher\'s top-k tokens)',
        choices=('forward_kl_topk', 'kl', 'k1', 'abs', 'mse', 'k2', 'low_var_kl', 'k3'))
    topk: int = key(32, "distillation: k of the teacher's top-k log-probs (forward_kl_topk)")
    use_task_rewards: bool = key(True, 'distillation: keep the PPO loss on the task reward beside the distillation '
        'loss; false: the distillation loss alone')
    distillation_loss_coef: float = key(1.0, 'distillation: weight of the distillation loss when use_task_rewards')
    loss_max_clamp: Optional[float] = key(None, 'distillation: per-token loss clamped to [-c, c]; null = none')
    log_prob_min_clamp: Optional[float] = key(None, 'distillation: floor of the top-k log-probs of student and '
        'teacher (forward_kl_topk); null = none')
    use_policy_gradient: bool = key(False, 'distillation: optimise -loss as an advantage with the policy loss '
        '(needed for k1) instead of backpropagating the loss')
    policy_loss_mode: str = key('vanilla', 'distillation: policy loss when use_policy_gradient (verl: vanilla only)',
        choices=('vanilla',))
    clip_ratio: float = key(0.2, 'distillation: PPO clip epsilon of that policy loss',
        no_effect_yet="verl 0.9.1's vanilla loss falls back to it only where clip_ratio_low / clip_ratio_high are null, "
                      "and they are never null (float keys): the pair below sets the clip")
    clip_ratio_low: float = key(0.2, 'distillation: lower clip epsilon of that policy loss')
    clip_ratio_high: float = key(0.2, 'distillation: upper clip epsilon of that policy loss')


TEACHER_ENGINE = ("an engine setting of verl's teacher server (vLLM/sglang); the teacher here is a Hugging Face "
                  "forward in the actor's workers")
TEACHER_POOL = ("verl's separate GPU pool of teacher replicas; here each actor rank holds a full copy of each teacher "
                "and scores its own rows")


@dataclass
class TeacherInferenceConfig:
    """``distillation.teacher_models.teacher_model.inference``: the teacher's inference engine. Here the teacher is
    scored by an HF forward in the actor's workers (rlhf_core/workers/teacher.py); the engine keys stay accepted."""

    name: Optional[str] = key('${oc.select:actor_rollout_ref.rollout.name}', "teacher engine (follows the rollout's)",
        no_effect_yet="the teacher is scored by a Hugging Face forward whatever the engine name")
    dtype: Optional[str] = key('${oc.select:actor_rollout_ref.rollout.dtype}',
        "teacher: dtype its weights are loaded in (follows the rollout's); log-probs in float32")
    gpu_memory_utilization: float = key(0.5, 'teacher: fraction of accelerator memory for the engine',
        no_effect_yet=TEACHER_ENGINE)
    enforce_eager: bool = key(True, 'teacher: no CUDA graphs', no_effect_yet=TEACHER_ENGINE)
    cudagraph_capture_sizes: Optional[List[int]] = key(None, 'teacher: CUDA-graph batch sizes',
        no_effect_yet=TEACHER_ENGINE)
    free_cache_engine: bool = key(True, 'teacher: free the KV cache between steps', no_effect_yet=TEACHER_ENGINE)
    data_parallel_size: int = key(1, 'teacher: data-parallel size', no_effect_yet=TEACHER_POOL)
    expert_parallel_size: int = key(1, 'teacher: expert-parallel size', no_effect_yet=TEACHER_POOL)
    tensor_model_parallel_size: int = key(2, 'teacher: tensor-parallel size', no_effect_yet=TEACHER_POOL)
    max_num_batched_tokens: int = key(8192, 'teacher: tokens per engine step', no_effect_yet=TEACHER_ENGINE)
    max_model_len: Optional[int] = key(None, 'teacher: max sequence length, checked to hold prompt_length + '
        'response_length + 1; null = no check')
    max_num_seqs: int = key(1024, 'teacher: sequences per engine batch', no_effect_yet=TEACHER_ENGINE)
    load_format: str = key('auto', 'teacher: weight loading format', no_effect_yet=TEACHER_ENGINE)
    engine_kwargs: Dict[str, Any] = free_form('teacher: extra engine arguments', no_effect_yet=TEACHER_ENGINE)
    limit_images: Optional[int] = key(None, 'teacher: images per prompt', no_effect_yet=TEACHER_ENGINE)
    enable_chunked_prefill: bool = key(True, 'teacher: chunked prefill', no_effect_yet=TEACHER_ENGINE)
    enable_prefix_caching: bool = key(True, 'teacher: prefix caching', no_effect_yet=TEACHER_ENGINE)
    disable_log_stats: bool = key(True, 'teacher: no engine statistics logging', no_effect_yet=TEACHER_ENGINE)
    skip_tokenizer_init: bool = key(True, 'teacher: the engine gets token ids, no tokenizer',
        no_effect_yet=TEACHER_ENGINE)
    prompt_length: int = key('${oc.select:actor_rollout_ref.rollout.prompt_length}',
        "teacher: prompt length (follows the rollout's), in the max_model_len check")
    response_length: int = key('${oc.select:actor_rollout_ref.rollout.response_length}',
        "teacher: response length (follows the rollout's), in the max_model_len check")
    temperature: float = key('${oc.select:actor_rollout_ref.rollout.temperature}',
        "teacher: as in verl its log-probs are taken at temperature 1 whatever this says (a warning when not 1)")


@dataclass
class TeacherModelConfig:
    """``distillation.teacher_models.teacher_model``: one teacher. Further teachers:
    ``+distillation.teacher_models.<name>.<key>`` (rlhf_core/config/distillation.py)."""

    model_path: Optional[str] = key(None, 'teacher model path (a local Hugging Face folder with the student\'s '
        'tokenizer vocabulary)')
    num_replicas: int = key(0, 'teacher engine replicas', no_effect_yet=TEACHER_POOL)
    inference: TeacherInferenceConfig = section(TeacherInferenceConfig)
    # last: the field named key shadows spec.key in the class body
    key: Optional[str] = key(None, 'value of distillation.teacher_key whose rows this teacher scores (several '
        'teachers); a single teacher scores every row')


@dataclass
class TeacherModelsConfig:
    """``distillation.teacher_models``."""

    teacher_model: TeacherModelConfig = section(TeacherModelConfig)


@dataclass
class DistillationConfig:
    """``distillation``: on-policy distillation from teacher models (verl 0.9.1; docs/ALGORITHMS.md)."""

    enabled: bool = key(False, "add a distillation loss against teacher models' log-probs of the student's responses")
    distillation_loss: DistillationLossConfig = section(DistillationLossConfig)
    n_gpus_per_node: int = key(8, 'distillation: accelerators per node of the teacher pool',
        no_effect_yet=TEACHER_POOL)
    nnodes: int = key(0, 'distillation: nodes of the teacher pool', no_effect_yet=TEACHER_POOL)
    teacher_models: TeacherModelsConfig = section(TeacherModelsConfig)
    teacher_key: str = key('data_source', 'dataset column whose value routes each row to the teacher of that key')


@dataclass
class RolloutTqSkipConfig:
    """``skip.rollout_tq``: verl 0.9's dump/replay of the V1 trainer's rollout (``trainer.use_v1``), which moves
    trajectories through TransferQueue (``RolloutTqSkip``: ``tq.kv_batch_get`` / ``kv_batch_put``)."""

    enable: bool = key(False, "dump the V1 trainer's TransferQueue rollout, or load it instead", why=TQ_SKIP)
    dump_dir: str = key('~/.verl/rollout_dump', 'folder of the dumps', why=TQ_SKIP)
    steps: List[int] = key([], 'steps dumped or replayed', why=TQ_SKIP)
    action: str = key('cache', 'cache (replay when a dump exists, else run and dump) | repeat', why=TQ_SKIP)


@dataclass
class AsyncRolloutSkipConfig:
    """``skip.async_rollout``: the fully asynchronous rollouter's dump/replay, one dump per prompt and its
    ``rollout.n`` responses, the step being the prompt's feed index (rlhf_core/trainer/fully_async_skip.py)."""

    enable: bool = key(False, "fully_async: replay each prompt's dumped responses, else generate and dump them")
    dump_dir: str = key('~/.verl/rollout_dump', 'folder of the dumps')
    steps: List[int] = key([], "feed indices (1 = the run's first prompt) dumped or replayed; [] = every prompt "
        "(verl 0.9.1: none)")
    action: str = key('cache', "cache: replay the prompt's own dump, else generate and dump it | repeat: its own, "
        "else the latest earlier one, else the earliest later one", choices=('cache', 'repeat'))

    def __post_init__(self) -> None:
        check_section(_step_list_errors(self.steps))


@dataclass
class RolloutSkipConfig:
    """``skip.rollout`` (verl 0.6: ``actor_rollout_ref.rollout.skip_rollout`` / ``skip_dump_dir``): each listed step's
    generation is read from a dump when there is one, else generated and dumped (rlhf_core/trainer/rollout_control.py)."""

    enable: bool = key(False, "reuse each step's dumped generation from dump_dir, else generate and dump it",
        aliases=('actor_rollout_ref.rollout.skip_rollout',))
    dump_dir: str = key('~/.verl/rollout_dump', 'folder of the dumped generations',
        aliases=('actor_rollout_ref.rollout.skip_dump_dir',))
    steps: List[int] = key([], 'global steps dumped or replayed, the others generate and dump nothing; [] = every '
        'step (verl 0.9.1: no step)')
    action: str = key('cache', "cache: replay the step's own dump, else generate and dump it | repeat: replay its "
        "own dump, else the latest earlier one, else the earliest later one", choices=('cache', 'repeat'))

    def __post_init__(self) -> None:
        check_section(_step_list_errors(self.steps))


def _step_list_errors(steps: Any) -> list[str]:
    """verl's ``RolloutSkipConfig`` rule: ``steps`` holds integers only (a bool is not a step)."""
    bad = [s for s in steps or () if not isinstance(s, int) or isinstance(s, bool)] \
        if isinstance(steps, (list, tuple)) else []
    return [f"{{section}}.steps={list(steps)}: steps must be integers, got {bad}."] if bad else []


@dataclass
class SkipConfig:
    """``skip``."""

    rollout: RolloutSkipConfig = section(RolloutSkipConfig, 'the synchronous rollout')
    rollout_tq: RolloutTqSkipConfig = section(RolloutTqSkipConfig, 'the TransferQueue rollout')
    async_rollout: AsyncRolloutSkipConfig = section(AsyncRolloutSkipConfig, 'the asynchronous rollout')


@dataclass
class TQMetricsConfig:
    """``transfer_queue.metrics``."""

    enabled: bool = key(False, 'TransferQueue: serve its metrics', why=TQ)
    port: int = key(0, 'TransferQueue: metrics port; 0 = chosen', why=TQ)


@dataclass
class TQSimpleStorageConfig:
    """``transfer_queue.backend.SimpleStorage``."""

    total_storage_size: int = key(100000, 'TransferQueue SimpleStorage: rows held', why=TQ)
    num_data_storage_units: int = key(8, 'TransferQueue SimpleStorage: storage actors', why=TQ)


@dataclass
class TQMooncakeStoreConfig:
    """``transfer_queue.backend.MooncakeStore``."""

    auto_init: bool = key(False, 'Mooncake: start the store', why=TQ)
    metadata_server: str = key('localhost:50123', 'Mooncake: metadata server', why=TQ)
    master_server_address: str = key('localhost:50124', 'Mooncake: master server', why=TQ)
    local_hostname: str = key('localhost', 'Mooncake: this host', why=TQ)
    protocol: str = key('tcp', 'Mooncake: transfer protocol', why=TQ)
    global_segment_size: int = key(4294967296, 'Mooncake: bytes of the global segment', why=TQ)
    local_buffer_size: int = key(1073741824, 'Mooncake: bytes of the local buffer', why=TQ)
    device_name: str = key('', 'Mooncake: RDMA device; empty = auto', why=TQ)


@dataclass
class TQBackendConfig:
    """``transfer_queue.backend``."""

    storage_backend: str = key('SimpleStorage', 'TransferQueue storage: SimpleStorage | MooncakeStore', why=TQ)
    SimpleStorage: TQSimpleStorageConfig = section(TQSimpleStorageConfig)
    MooncakeStore: TQMooncakeStoreConfig = section(TQMooncakeStoreConfig)


@dataclass
class TransferQueueConfig:
    """``transfer_queue``."""

    enable: bool = key(False, 'move batches through TransferQueue instead of the driver', why=TQ)
    metrics: TQMetricsConfig = section(TQMetricsConfig)
    backend: TQBackendConfig = section(TQBackendConfig)


@dataclass
class SandboxFusionConfig:
    """``sandbox_fusion``: the code-execution sandbox used by code reward functions."""

    url: Optional[str] = key(None, 'Sandbox Fusion URL; null = no sandbox. Any key set here replaces '
        'reward_model.sandbox_fusion (verl 0.9.1 moves this section to reward.sandbox_fusion)')
    max_concurrent: Optional[int] = key(None, 'Sandbox Fusion: requests in flight; null = 64')
    memory_limit_mb: Optional[int] = key(None, 'Sandbox Fusion: memory limit per run (MB); null = 1024')


_LEGACY = "verl 0.9.1's legacy spelling of reward.reward_model.rollout.{0}: when not null it replaces that key " \
    "(verl's migrate_legacy_reward_impl)"
_LEGACY_HF = ("the generative reward model's judge is served by the hf engine here (rlhf_core/workers/genrm_server.py: "
              "one process on CPU, one request at a time), which has no ")


def _legacy(help: str, name: str, **status: Any) -> Any:
    return key(None, f"{help}; {_LEGACY.format(name)}", **status)


@dataclass
class RewardModelRolloutConfig:
    """``reward_model.rollout``: verl 0.9.1's legacy section of the generative reward model's engine (every leaf null);
    a leaf that is not null replaces ``reward.reward_model.rollout.<leaf>`` (rlhf_core/reward/genrm.py)."""

    name: Optional[str] = _legacy('reward-model engine: hf; null = reward.reward_model.rollout.name', 'name',
        only=(None, 'hf'), why="engines other than hf for the judge: vLLM/SGLang reward-model servers are not built "
        "here (a verl script's vllm becomes hf)")
    dtype: Optional[str] = _legacy('reward-model engine dtype', 'dtype',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16'))
    gpu_memory_utilization: Optional[float] = _legacy('reward-model engine memory fraction', 'gpu_memory_utilization',
        no_effect_on_cpu=_LEGACY_HF + 'GPU memory pool')
    enforce_eager: Optional[bool] = _legacy('reward-model engine: no CUDA graphs', 'enforce_eager',
        no_effect_on_cpu=_LEGACY_HF + 'CUDA graphs')
    cudagraph_capture_sizes: Optional[List[int]] = _legacy('reward-model engine: CUDA-graph sizes',
        'cudagraph_capture_sizes', no_effect_on_cpu=_LEGACY_HF + 'CUDA graphs')
    free_cache_engine: Optional[bool] = _legacy('reward-model engine: free the KV cache', 'free_cache_engine',
        no_effect_on_cpu=_LEGACY_HF + 'sleep mode')
    data_parallel_size: Optional[int] = _legacy('reward-model engine: data-parallel size', 'data_parallel_size',
        no_effect_on_cpu=_LEGACY_HF + 'data-parallel replicas')
    expert_parallel_size: Optional[int] = _legacy('reward-model engine: expert-parallel size', 'expert_parallel_size',
        no_effect_on_cpu=_LEGACY_HF + 'expert parallelism')
    tensor_model_parallel_size: Optional[int] = _legacy('reward-model engine: tensor-parallel size',
        'tensor_model_parallel_size', no_effect_on_cpu=_LEGACY_HF + 'tensor parallelism')
    max_num_batched_tokens: Optional[int] = _legacy('reward-model engine: tokens per step', 'max_num_batched_tokens',
        no_effect_on_cpu=_LEGACY_HF + 'continuous batching')
    max_model_len: Optional[int] = _legacy('reward-model engine: max sequence length', 'max_model_len')
    max_num_seqs: Optional[int] = _legacy('reward-model engine: sequences per batch', 'max_num_seqs',
        no_effect_on_cpu=_LEGACY_HF + 'batching of requests')
    load_format: Optional[str] = _legacy('reward-model engine: weight loading format', 'load_format',
        no_effect_on_cpu=_LEGACY_HF + 'load formats')
    engine_kwargs: Optional[Dict[str, Any]] = _legacy('reward-model engine: extra arguments', 'engine_kwargs',
        no_effect_on_cpu=_LEGACY_HF + 'vLLM/SGLang engine arguments')
    limit_images: Optional[int] = _legacy('reward-model engine: images per prompt', 'limit_images',
        why=_LEGACY_HF + 'image inputs: it takes text messages')
    enable_chunked_prefill: Optional[bool] = _legacy('reward-model engine: chunked prefill', 'enable_chunked_prefill',
        no_effect_on_cpu=_LEGACY_HF + 'chunked prefill')
    enable_prefix_caching: Optional[bool] = _legacy('reward-model engine: prefix caching', 'enable_prefix_caching',
        no_effect_on_cpu=_LEGACY_HF + 'prefix cache')
    disable_log_stats: Optional[bool] = _legacy('reward-model engine: no statistics logging', 'disable_log_stats',
        no_effect_on_cpu=_LEGACY_HF + 'statistics log')
    skip_tokenizer_init: Optional[bool] = _legacy('reward-model engine: no tokenizer', 'skip_tokenizer_init',
        only=(None, False), why='a judge server without its tokenizer (verl asserts it is False for a reward model)')
    prompt_length: Optional[int] = _legacy('reward-model engine: prompt length', 'prompt_length',
        no_effect_yet="verl 0.9.1's reward-model server reads it nowhere either: max_model_len bounds a request")
    response_length: Optional[int] = _legacy('reward-model engine: max_tokens of requests that set none',
        'response_length')
