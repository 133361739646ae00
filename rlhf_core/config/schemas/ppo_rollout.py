"""``actor_rollout_ref.rollout`` of ppo_trainer.yaml: the rollout engine, sampling, multi-turn and agent loop
(verl's ``RolloutConfig``).

Generated once from the YAML; now the one source of these keys (see rlhf_core/config/spec.py). Edit here, then
run `python -m rlhf_core.config.gen_yaml` to rewrite rlhf_core/configs/*.yaml and docs/CONFIG_KEYS.md.
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from rlhf_core.config.schemas.sections09 import CheckpointEngineConfig, DisaggregationConfig, PrometheusConfig
from rlhf_core.config.spec import check_section, follower, free_form, key, number, registered, section
from rlhf_core.config.schemas.ppo_common import FollowerProfilerConfig


@dataclass
class RolloutEngineKwargsConfig:
    """``actor_rollout_ref.rollout.engine_kwargs``."""

    vllm: Dict[str, Any] = free_form('extra vllm.LLM arguments')
    sglang: Dict[str, Any] = key({}, 'extra sglang arguments (sglang not supported yet; default only)', why='sglang')
    trtllm: Dict[str, Any] = key({}, 'extra TensorRT-LLM arguments (default only)',
        why='TensorRT-LLM, a rollout engine this project does not have')


@dataclass
class RolloutMultiTurnConfig:
    """``actor_rollout_ref.rollout.multi_turn``."""

    enable: bool = key(False, 'multi-turn / tool rollouts (not supported yet; default only)')
    max_assistant_turns: Any = key(None, 'max assistant turns per conversation; null = no limit')
    tool_config_path: Any = key(None, 'YAML file declaring the tools; null = no tools')
    max_user_turns: Any = key(None, 'max user turns per conversation; null = no limit')
    max_parallel_calls: int = key(1, 'tool calls run in parallel per turn')
    max_tool_response_length: int = key(256, 'tool responses are cut to this many characters')
    tool_response_truncate_side: str = key('middle', 'where an over-long tool response is cut: left | middle | right',
        choices=('left', 'middle', 'right'))
    interaction_config_path: Any = key(None,
        "YAML file declaring the interactions (simulated users answering between turns, verl's format); null = none")
    use_inference_chat_template: bool = key(False,
        "True: the engine continues the conversation re-rendered with the chat template; False: the trajectory's ids")
    tokenization_sanity_check_mode: str = key('strict',
        'check that incremental tokenization matches a full re-tokenization: strict | ignore_strippable | disable',
        choices=('strict', 'ignore_strippable', 'disable'))
    format: str = key('hermes', 'tool-call format of the chat template', choices=registered("tool_parser"))
    function_tool_path: Optional[str] = key(None, 'python file whose @function_tool functions become tools (next to '
        "tool_config_path's; schema from type hints and docstring); null = none")
    num_repeat_rollouts: Any = key(None,
        'interaction continuations rolled out after the trained turn, for the reward (collabllm_agent loop only)')


@dataclass
class RolloutValKwargsConfig:
    """``actor_rollout_ref.rollout.val_kwargs``."""

    top_k: int = key(-1, 'validation top-k; -1 (vllm) or 0 (hf) = disabled')
    top_p: float = key(1.0, 'validation top-p')
    temperature: float = key(0, 'validation temperature (0 = greedy)')
    n: int = key(1, 'responses per validation prompt')
    do_sample: bool = key(False, 'sample during validation (needs temperature > 0)')

    def __post_init__(self) -> None:
        errors = []
        if self.do_sample is True and not self.temperature:
            errors.append(f"{{section}}.do_sample=True with {{section}}.temperature={self.temperature}: sampling needs "
                          "temperature > 0 (or set do_sample=False for greedy validation).")
        if number(self.top_p) and not 0 < self.top_p <= 1:
            errors.append(f"{{section}}.top_p={self.top_p} must be in (0, 1].")
        if number(self.n) and self.n < 1 or self.n is None:
            errors.append(f"{{section}}.n={self.n} must be >= 1.")
        check_section(errors)


CUSTOM_ASYNC_SERVER = ("verl 0.9.1 declares these keys but no code reads them: the AsyncServer class they replaced "
                       "in verl 0.5 (verl PR #2326) went in verl 0.6.0 when the agent loop moved to vLLM/sglang's "
                       "own HTTP servers (verl PR #3456), so there is no verl behaviour to match; here the agent "
                       "loops call the in-process token scheduler (rlhf_core/agent/engine.py), which has no server "
                       "class to swap")


@dataclass
class RolloutAgentCustomAsyncServerConfig:
    """``actor_rollout_ref.rollout.agent.custom_async_server``."""

    path: Any = key(None, 'file with a custom async rollout server (verl 0.5; read by no verl code since 0.6.0)',
        why=CUSTOM_ASYNC_SERVER)
    name: Any = key(None, 'class name of the custom async server (verl 0.5; read by no verl code since 0.6.0)',
        why=CUSTOM_ASYNC_SERVER)


@dataclass
class RolloutAgentConfig:
    """``actor_rollout_ref.rollout.agent``."""

    num_workers: int = key(8, "agent-loop workers, each running a contiguous chunk of the batch's trajectories")
    default_agent_loop: str = key('single_turn_agent', 'agent loop used when a row names none')
    agent_loop_config_path: Any = key(None, 'YAML file registering agent loops; null = the built-in ones')
    custom_async_server: RolloutAgentCustomAsyncServerConfig = section(RolloutAgentCustomAsyncServerConfig)


@dataclass
class RolloutTraceConfig:
    """``actor_rollout_ref.rollout.trace``."""

    backend: Any = key(None, 'rollout tracing backend: null | weave | mlflow (agent-loop trajectories as traces in '
        'the MLflow experiment trainer.project_name at MLFLOW_TRACKING_URI)', choices=('weave', 'mlflow'),
        backend_values={'weave': 'the Weights & Biases Weave tracing client'})
    token2text: bool = key(False, 'decode token ids to text in traces')
    # verl 0.9: rollout trace
    project_name: Optional[str] = key('${oc.select:trainer.project_name,null}',
        'trace project: the MLflow experiment of the traces (follows trainer)')
    experiment_name: Optional[str] = key('${oc.select:trainer.experiment_name,null}',
        'trace experiment: tag experiment_name of every trace (follows trainer)')
    max_samples_per_step_per_worker: Optional[int] = key(None, 'prompts traced (with all their responses) per '
        'rollout call of each worker, drawn at random; null = all')


@dataclass
class RolloutConfig:
    """``actor_rollout_ref.rollout``."""

    name: str = key('vllm', 'rollout engine: hf | vllm (sglang not supported yet)', only=('hf', 'vllm'),
        why='rollout engines other than hf and vllm (e.g. sglang)',
        verl_default='???', differs="the reference's default; verl 0.9.1 makes it mandatory (???)")
    mode: str = key('sync',
        'sync = generate in the trainer loop; async = agent loops (each trajectory its own request, '
        'continuous batching)',
        only=('sync', 'async'), why='a rollout mode other than sync or async (agent loop)',
        verl_default='async', differs='ours: sync generation in the trainer loop is the tested path on CPU; async (agent loops) is opt-in')
    seed: Optional[int] = key(None, 'sampling seed of the rollout engine; null = data.seed',
        verl_default=42, differs='ours: null follows data.seed (42), so one key seeds both')
    temperature: float = key(1.0, 'sampling temperature')
    top_k: int = key(-1, 'top-k sampling; -1 (vllm) or 0 (hf) = disabled')
    top_p: float = key(1, 'top-p (nucleus) sampling')
    prompt_length: int = key('${data.max_prompt_length}', 'prompt length seen by the engine')
    response_length: int = key('${data.max_response_length}', 'max generated tokens')
    dtype: str = key('bfloat16', 'dtype of the rollout weights (align with FSDP)',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16', 'auto'))
    gpu_memory_utilization: float = key(0.5, 'vllm: fraction of GPU memory for the engine',
        no_effect_on_cpu="vLLM on CUDA only: vLLM's CPU backend sizes its KV cache by VLLM_CPU_KVCACHE_SPACE",
        engine="vllm")
    ignore_eos: bool = key(False, 'keep generating after EOS')
    enforce_eager: bool = key(True, 'vllm: disable CUDA graphs', engine="vllm",
        verl_default=False, differs="the reference's default")
    cudagraph_capture_sizes: Any = key(None, "vllm: batch sizes captured as CUDA graphs; null = vLLM's choice",
        no_effect_on_cpu="CUDA graphs: passed to vLLM's compilation_config on CUDA only", engine="vllm")
    free_cache_engine: bool = key(True, 'vllm: release the KV cache after generation',
        no_effect_on_cpu="on CUDA the engine sleeps after each generate (level 1: weights to host memory, KV cache "
                         "freed) and wakes before the next sync or generate; vLLM's sleep mode is CUDA only",
        engine="vllm")
    load_format: str = key('dummy_dtensor', 'vllm: initial weight loader (weights are synced from the actor)',
        engine="vllm", verl_default='dummy', differs="the reference's default")
    tensor_model_parallel_size: int = key(2, 'vllm: tensor-parallel size of the engine', engine="vllm")
    data_parallel_size: int = key(1, 'vllm: data-parallel size of the engine (default only)',
        why='vLLM data-parallel rollout engines')
    expert_parallel_size: int = key(1, 'vllm: expert-parallel size of the engine (default only)',
        why='vLLM expert-parallel rollout engines')
    pipeline_model_parallel_size: int = key(1, 'vllm: pipeline-parallel size of the engine (default only)',
        why='vLLM pipeline-parallel rollout engines')
    max_num_batched_tokens: int = key(8192, 'vllm: max tokens per engine batch', engine="vllm")
    max_num_seqs: int = key(1024, 'vllm: max sequences per engine batch', engine="vllm",
        verl_default=256, differs="the reference's default")
    max_model_len: Any = key(None, 'vllm: max prompt + response tokens; null = prompt_length + response_length',
        engine="vllm")
    enable_chunked_prefill: bool = key(True, 'vllm: split long prompts over engine steps',
        no_effect_on_cpu='off on CPU: vLLM 0.32 CPU fails on a seeded request whose prompt is split over two steps '
                         '("CPU Generator does not use offset"); passed to vLLM on CUDA', engine="vllm")
    enable_prefix_caching: bool = key(True, 'vllm: reuse the KV cache of shared prompt prefixes', engine="vllm")
    disable_log_stats: bool = key(True, "vllm: silence the engine's periodic statistics log", engine="vllm")
    log_prob_micro_batch_size: Optional[int] = key(None,
        'deprecated global micro-batch for old log-probs; divided by world size')
    log_prob_micro_batch_size_per_gpu: Optional[int] = key(16,
        'sequences per forward on one worker when recomputing old log-probs',
        verl_default=None, differs="the reference's default")
    log_prob_use_dynamic_bsz: bool = key('${actor_rollout_ref.actor.use_dynamic_bsz}',
        'pack log-prob micro-batches by token budget')
    log_prob_max_token_len_per_gpu: int = key('${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}',
        'token budget per worker for log-probs')
    do_sample: bool = key(True, 'sample (True) or greedy decode (False) during training rollouts')
    over_sample_rate: float = key(0,
        "fraction of each step's responses aborted as the slowest (emptied, left out of advantages, loss and "
        "scores); 0 = none",
)
    multi_stage_wake_up: bool = key(False, "wake the engine's weights and KV cache in separate stages",
        no_effect_on_cpu='the engine sleeps on CUDA only (see free_cache_engine)', engine="vllm")
    engine_kwargs: RolloutEngineKwargsConfig = section(RolloutEngineKwargsConfig, 'extra engine arguments')
    n: int = key(1, 'responses sampled per prompt (GRPO/RLOO need > 1)')
    calculate_log_probs: bool = key(False, "return the engine's log-probs (needed by rollout_is)",
        verl_default=True, differs="the reference's default")
    multi_turn: RolloutMultiTurnConfig = section(RolloutMultiTurnConfig)
    val_kwargs: RolloutValKwargsConfig = section(RolloutValKwargsConfig)
    agent: RolloutAgentConfig = section(RolloutAgentConfig)
    # verl 0.9: rollout
    nnodes: int = key(0, 'nodes of a standalone rollout pool; 0 = colocated with the actor',
        only=(0,), why='a standalone rollout pool (the rollout shares the actor workers here)')
    n_gpus_per_node: int = key('${trainer.n_gpus_per_node}', 'accelerators per node of a standalone rollout pool',
        no_effect_yet='verl reads it only for a standalone rollout pool (rollout.nnodes > 0), which is refused: '
                      'the rollout runs on the actor workers')
    full_determinism: bool = key(False, 'deterministic engine: VERL_FULL_DETERMINISM=1, VLLM_BATCH_INVARIANT=1 '
        "(vLLM's batch-invariant kernels) and PYTHONHASHSEED=rollout.seed in every Ray worker")
    logprobs_mode: str = key('processed_logprobs', "what rollout_log_probs hold: processed_* = of the logits the "
        'token was drawn from (/ temperature, cut to top_k/top_p), raw_* = of the model logits; *_logprobs = '
        'log-softmax, *_logits = the logit', choices=('processed_logprobs', 'raw_logprobs', 'processed_logits',
                                                     'raw_logits'))
    scheduling_policy: str = key('fcfs', 'vllm: engine request scheduling: fcfs | priority', choices=('fcfs',
        'priority'), engine="vllm")
    router_config_path: Optional[str] = key(None, 'config of a request router in front of the servers',
        only=(None,), why='a request router in front of the rollout servers')
    checkpoint_engine: CheckpointEngineConfig = section(CheckpointEngineConfig)
    enable_rollout_routing_replay: bool = key(False, 'record MoE routing in the rollout and replay it in training',
        why='MoE router replay, which this project does not have')
    moe_load_balance_metrics_interval: int = key(0, 'log MoE load-balance metrics every N steps; 0 = never',
        only=(0,), why="MoE load-balance metrics (verl 0.9's v1 trainer reads the expert loads of the rollout "
                       "engine's MoE layers), which this project does not collect")
    prometheus: PrometheusConfig = section(PrometheusConfig)
    quantization: Optional[str] = key(None, 'quantize the rollout weights (e.g. fp8); null = none', only=(None,),
        why='quantized rollout weights')
    quantization_config_file: Optional[str] = key(None, 'config file of that quantization', only=(None,),
        why='quantized rollout weights')
    mtp: Optional[Dict[str, Any]] = follower('${oc.select:actor_rollout_ref.model.mtp,null}',
        'copy of model.mtp for the engine (follows it)',
        no_effect_yet='follows actor_rollout_ref.model.mtp, which is accepted at its defaults only')
    qat: Optional[Dict[str, Any]] = follower('${oc.select:actor_rollout_ref.actor.fsdp_config.qat,null}',
        "copy of the actor's qat for the engine (follows it)",
        no_effect_yet='follows actor_rollout_ref.actor.fsdp_config.qat, which is accepted at its defaults only')
    disaggregation: DisaggregationConfig = section(DisaggregationConfig)
    trace: RolloutTraceConfig = section(RolloutTraceConfig)
    skip_tokenizer_init: bool = key(True, 'start the engine without a tokenizer (token ids in and out)',
        engine="vllm")
    profiler: FollowerProfilerConfig = section(FollowerProfilerConfig)
    layered_summon: bool = key(False, 'gather FSDP weights layer by layer for the engine update',
        no_effect_on_cpu='peak GPU memory of the gather only (verl summons FSDP/LoRA weights layer by layer); the '
                         'whole state dict is gathered in host memory here, the same weights reach the engine')

    def __post_init__(self) -> None:
        errors = []
        if number(self.n) and self.n < 1:
            errors.append(f"{{section}}.n={self.n} must be >= 1.")
        if number(self.top_p) and not 0 < self.top_p <= 1:
            errors.append(f"{{section}}.top_p={self.top_p} must be in (0, 1].")
        if number(self.over_sample_rate) and not 0 <= self.over_sample_rate < 1:
            errors.append(f"{{section}}.over_sample_rate={self.over_sample_rate} must be in [0, 1) (the fraction of "
                          "responses aborted).")
        check_section(errors)
