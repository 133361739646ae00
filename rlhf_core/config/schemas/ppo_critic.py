"""``critic``, ``reward_model`` and ``custom_reward_function`` of ppo_trainer.yaml (verl's ``CriticConfig``,
``RewardModelConfig``).

Generated once from the YAML; now the one source of these keys (see rlhf_core/config/spec.py). Edit here, then
run `python -m rlhf_core.config.gen_yaml` to rewrite rlhf_core/configs/*.yaml and docs/CONFIG_KEYS.md.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from rlhf_core.config.spec import check_section, free_form, free_form_or_null, key, registered, section
from rlhf_core.config.schemas.sections09 import RewardModelRolloutConfig
from rlhf_core.config.schemas.engine09 import CRITIC_NO_ENTROPY, FORWARD_ONLY, FSDPEngine09, Model09, USE_ORIG_PARAMS
from rlhf_core.config.schemas.ppo_common import FollowerProfilerConfig, MixedPrecisionConfig, ProfilerConfig, WrapPolicyConfig


@dataclass
class CriticOptimConfig:
    """``critic.optim``."""

    lr: float = key(1e-05, 'peak learning rate')
    betas: List[float] = key([0.9, 0.999], 'AdamW betas')
    lr_warmup_steps_ratio: float = key(0.0, 'warmup steps as a fraction of total_training_steps')
    lr_warmup_steps: int = key(-1, 'warmup steps; negative = use lr_warmup_steps_ratio')
    min_lr_ratio: float = key(0.0, 'cosine scheduler: final lr as a fraction of lr')
    lr_scheduler_type: str = key('constant', 'scheduler after warmup: constant | cosine',
        choices=('constant', 'cosine'))
    num_cycles: float = key(0.5, 'cosine scheduler: number of cosine cycles')
    total_training_steps: int = key(-1, 'total optimizer steps; -1 = injected by the trainer at run time')
    eps: float = key(1e-08, "AdamW epsilon (ours; torch's default)")
    weight_decay: float = key(0.01, 'AdamW weight decay')
    clip_grad: float = key(1.0,
        'clip the global gradient norm (new-engine spelling; the critic reads critic.grad_clip)',
        why="verl's new-engine spelling; set critic.grad_clip")
    warmup_style: Optional[str] = key(None,
        'deprecated spelling of lr_scheduler_type (constant | cosine); null = unset', choices=('constant', 'cosine'))
    # verl 0.9: optimizer
    optimizer: str = key('AdamW', 'optimizer class name: AdamW, Adam, SGD, RMSprop (torch.optim); adam and adamw are '
        'AdamW', choices=('AdamW', 'adam', 'adamw', 'Adam', 'SGD', 'RMSprop'))
    optimizer_impl: str = key('torch.optim', 'module the optimizer class is taken from', only=('torch.optim',),
        why='optimizers from other modules (e.g. torchao, bitsandbytes)')
    zero_indexed_step: bool = key(True, 'the cosine scheduler counts optimizer steps from 0; False: from 1 (its '
        'multiplier at update s is the one of s + 1; the constant schedule ignores it, as in verl)')
    override_optimizer_config: Optional[Dict[str, Any]] = free_form_or_null('extra keyword arguments for the '
        'optimizer, applied last (e.g. {amsgrad: true}); a keyword the optimizer does not take fails the build')


@dataclass
class CriticFSDPConfig(FSDPEngine09):
    """``critic.fsdp`` (verl 0.6: ``critic.model.fsdp_config``)."""

    param_offload: bool = key(False, 'offload critic parameters to CPU',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    optimizer_offload: bool = key(False, 'offload critic optimizer state to CPU',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    wrap_policy: WrapPolicyConfig = section(WrapPolicyConfig)
    fsdp_size: int = key(-1, 'FSDP shard group size; -1 = all workers')
    model_dtype: str = key('fp32', 'dtype of the critic parameters: fp32 | bf16 | fp16',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16'))
    offload_policy: bool = key(False, 'FSDP2 CPU offload policy',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    reshard_after_forward: bool = key(True, 'reshard parameters after forward (FSDP2)')
    forward_prefetch: bool = key(False, "prefetch the next layer's all-gather in forward (FSDP2 "
        "set_modules_to_forward_prefetch, depth 1, as verl's FSDP2 path; the same outputs)")
    use_orig_params: bool = key(False, 'FSDP1 flat-parameter option (FSDP2 has no flat parameters)',
        no_effect_yet=USE_ORIG_PARAMS)
    ulysses_sequence_parallel_size: int = key(1,
        "new-engine copy of the Ulysses sequence-parallel size (read when the role's own key is 1)")
    entropy_from_logits_with_chunking: bool = key(False, 'new-engine copy of entropy_from_logits_with_chunking',
        no_effect_yet=CRITIC_NO_ENTROPY)
    use_torch_compile: bool = key(True, 'new-engine copy of use_torch_compile',
        no_effect_yet="verl 0.9.1's FSDP engine (verl/workers/engine/fsdp/transformer_impl.py) compiles only "
                      "entropy_from_logits with it, which the critic's value forward never calls; the critic here "
                      "compiles nothing either")
    entropy_checkpointing: bool = key(False, 'new-engine copy of entropy_checkpointing',
        no_effect_yet=CRITIC_NO_ENTROPY)
    forward_only: bool = key(False, 'new engine: build the critic for forward passes only (False only: it is trained)',
        only=(False,), why=FORWARD_ONLY)
    strategy: str = key('fsdp', 'new-engine copy of the backend: fsdp | fsdp2', only=('fsdp', 'fsdp2'),
        why='only FSDP backends; Megatron is a backend this project does not have')
    cpu_threads: Optional[int] = key(None,
        "intra-op CPU threads of each critic rank; null = the node's CPUs ÷ its ranks", ours=True)
    mixed_precision: MixedPrecisionConfig = section(MixedPrecisionConfig)


@dataclass
class CriticFusedKernelOptions:
    """``critic.model.fused_kernel_options``."""

    impl_backend: str = key('torch', 'implementation backend of fused kernels: torch | triton',
        choices=('torch', 'triton'), only=('torch',),
        why='fused-kernel backends other than torch: Triton kernels are GPU-only and model.use_fused_kernels is default only')


@dataclass
class CriticModelConfig(Model09):
    """``critic.model``."""

    path: str = key('~/models/deepseek-llm-7b-chat', 'Hugging Face model path of the critic (a value head is added)')
    tokenizer_path: str = key('${actor_rollout_ref.model.path}', 'tokenizer of the critic',
        verl_default=None, differs="ours: the actor's model path, the tokenizer the rollout used")
    override_config: Dict[str, Any] = free_form("overrides of the critic's HF config")
    external_lib: Optional[str] = key('${actor_rollout_ref.model.external_lib}', 'python module to import first',
        verl_default=None, differs="ours: follows the actor model's setting")
    enable_gradient_checkpointing: bool = key(True, 'activation (gradient) checkpointing for the critic')
    enable_activation_offload: bool = key(False, 'offload activations to CPU',
        no_effect_on_cpu='on CUDA the training forward runs under save_on_cpu(pin_memory=True); on CPU activations already '
                         'live in host memory',
)
    use_remove_padding: bool = key(False, 'unpad sequences before the forward pass',
        verl_default=True, differs='ours: pads like the actor, whose reference default is False')
    trust_remote_code: bool = key('${actor_rollout_ref.model.trust_remote_code}',
        'allow remote code when loading the critic',
        verl_default=False, differs="ours: follows the actor model's setting")
    use_shm: bool = key(False, 'load the critic through shared memory (/dev/shm; default only)',
        why='shared-memory model loading')
    # verl 0.9: model
    hf_config_path: Optional[str] = key(None, 'folder holding the HF config.json; null = model.path')
    custom_chat_template: Optional[str] = key(None, "chat template of the critic's tokenizer (saved with its "
        "checkpoints; the critic scores the rollout's token ids); null = the tokenizer's")
    exclude_modules: Optional[str] = key(None, 'module names that never get LoRA adapters (a regex string); null = none')
    use_liger: bool = key(False, 'verl: apply Liger kernels (GPU) to the critic; not shipped here: only False',
        only=(False,),
        why='Liger kernels: GPU-only Triton kernels that this project does not ship')
    use_fused_kernels: bool = key(False, 'fused log-prob kernels (an actor option; the critic has a value head)',
        only=(False,), why='fused kernels')
    fused_kernel_options: CriticFusedKernelOptions = section(CriticFusedKernelOptions)
    lora_rank: int = key(0, 'LoRA rank; 0 = full fine-tuning')
    lora_alpha: int = key(16, 'LoRA scaling alpha')
    target_modules: Any = key('all-linear', 'modules that get LoRA adapters', types=(str, list,))


@dataclass
class CriticCheckpointConfig:
    """``critic.checkpoint``."""

    save_contents: List[str] = key(['model', 'optimizer', 'extra'], 'what to save: model, optimizer, extra',
        item_choices=('model', 'optimizer', 'extra', 'hf_model'))
    load_contents: List[str] = key('${critic.checkpoint.save_contents}', 'what to load when resuming',
        item_choices=('model', 'optimizer', 'extra', 'hf_model'))
    async_save: bool = key(False, 'save checkpoints off the training thread')


@dataclass
class CriticConfig:
    """``critic``."""

    rollout_n: int = key('${actor_rollout_ref.rollout.n}', 'responses per prompt (mirrors rollout.n)')
    strategy: str = key('fsdp', 'training backend: fsdp | fsdp2', only=('fsdp', 'fsdp2'),
        why='only FSDP backends; Megatron is a backend this project does not have')
    enable: Optional[bool] = key(None, 'use a critic: true | false; null = only for adv_estimator gae')
    optim: CriticOptimConfig = section(CriticOptimConfig)
    model: CriticModelConfig = section(CriticModelConfig)
    ppo_mini_batch_size: int = key('${actor_rollout_ref.actor.ppo_mini_batch_size}',
        'prompts per critic optimizer step (multiplied by rollout_n)')
    ppo_micro_batch_size: Optional[int] = key(None, 'deprecated global micro-batch; divided by world size')
    ppo_micro_batch_size_per_gpu: Optional[int] = key('${actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu}',
        "sequences per forward/backward on one worker (ours: defaults to the actor's; verl: null)",
        verl_default='${oc.select:.ppo_micro_batch_size,null}', differs="ours: follows the actor's; verl's null fails verl's own critic check with adv_estimator gae")
    forward_micro_batch_size: Optional[int] = key('${critic.ppo_micro_batch_size}',
        'deprecated global micro-batch for value computation')
    forward_micro_batch_size_per_gpu: Optional[int] = key('${critic.ppo_micro_batch_size_per_gpu}',
        'sequences per forward on one worker when computing values')
    use_dynamic_bsz: bool = key('${actor_rollout_ref.actor.use_dynamic_bsz}', 'pack micro-batches by token budget')
    ppo_max_token_len_per_gpu: int = key(32768, 'token budget per worker micro-batch for updates')
    forward_max_token_len_per_gpu: int = key('${critic.ppo_max_token_len_per_gpu}',
        'token budget per worker micro-batch for value computation')
    ulysses_sequence_parallel_size: int = key(1,
        "Ulysses sequence-parallel size: ranks that split each packed micro-batch's tokens (1 = off; needs "
        "use_remove_padding; docs/PARALLELISM.md)")
    ppo_epochs: int = key('${actor_rollout_ref.actor.ppo_epochs}', 'passes over the batch per PPO step')
    shuffle: bool = key('${actor_rollout_ref.actor.shuffle}', 'reshuffle mini-batches every epoch')
    grad_clip: float = key(1.0, 'clip the global gradient norm to this value')
    cliprange_value: float = key(0.5, 'value clip range around the old values')
    loss_agg_mode: str = key('${actor_rollout_ref.actor.loss_agg_mode}', 'how token losses are aggregated')
    checkpoint: CriticCheckpointConfig = section(CriticCheckpointConfig)
    profiler: ProfilerConfig = section(ProfilerConfig)
    # verl 0.9: critic
    fsdp: CriticFSDPConfig = section(CriticFSDPConfig, "the critic's FSDP engine", aliases=("critic.model.fsdp_config",))
    data_loader_seed: int = key(42, 'seed of the critic mini-batch shuffling (critic.shuffle)')
    loss_scale_factor: Optional[float] = key('${actor_rollout_ref.actor.loss_scale_factor}',
        "seq-mean-token-sum-norm: divide the value loss by this constant instead of the response length (follows "
        "the actor's); null = the response length; other loss_agg_modes ignore it")


@dataclass
class RewardModelWrapPolicyConfig:
    """``reward_model.model.fsdp_config.wrap_policy``."""

    min_num_params: int = key(0,
        'wrap modules with at least this many parameters (verl 0.6 spelling of min_num_params above; read when '
        'that one is 0)')


@dataclass
class RewardModelFSDPConfig:
    """``reward_model.model.fsdp_config``."""

    min_num_params: int = key(0, 'wrap modules with at least this many parameters')
    param_offload: bool = key(False, 'offload reward-model parameters to CPU',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    wrap_policy: RewardModelWrapPolicyConfig = section(RewardModelWrapPolicyConfig)
    reshard_after_forward: bool = key(True, 'reshard parameters after forward (FSDP2)')
    fsdp_size: int = key(-1, 'FSDP shard group size; -1 = all workers')
    forward_prefetch: bool = key(False, "prefetch the next layer's all-gather in forward (FSDP2 "
        "set_modules_to_forward_prefetch, depth 1, as verl's FSDP2 path; the same outputs)")
    cpu_threads: Optional[int] = key(None,
        "intra-op CPU threads of each reward-model rank; null = the node's CPUs ÷ its ranks", ours=True)


@dataclass
class RewardModelModelConfig:
    """``reward_model.model``."""

    input_tokenizer: Optional[str] = key('${actor_rollout_ref.model.path}',
        "tokenizer the inputs are decoded with before the RM's chat template; null = same template")
    path: str = key('~/models/Anomy-RM-v0.1', 'path of the reward model (AutoModelForSequenceClassification)',
        aliases=("reward.reward_model.model_path",), verl_default=None,  # verl 0.9: reward section
        differs="the reference's default")
    external_lib: Optional[str] = key('${actor_rollout_ref.model.external_lib}', 'python module to import first',
        verl_default=None, differs="the reference's default")
    trust_remote_code: bool = key(False, 'allow remote code when loading the reward model',
        verl_default=None, differs="the reference's default")
    use_shm: bool = key(False, 'load the reward model through shared memory (/dev/shm; default only)',
        why='shared-memory model loading')
    use_remove_padding: bool = key(False, 'unpad sequences before the forward pass')
    use_fused_kernels: bool = key(False, 'use fused kernels', why='fused kernels')
    fsdp_config: RewardModelFSDPConfig = section(RewardModelFSDPConfig)


@dataclass
class OverlongBufferConfig:
    """``reward_model.overlong_buffer``: DAPO's soft overlong punishment as the DAPO recipe spells it (verl-recipe
    ``dapo``, ``recipe.dapo.main_dapo``); read by the ``dapo`` reward manager when ``reward_model.reward_kwargs``
    holds no ``overlong_buffer_cfg`` (rlhf_core/reward/dapo.py). Defaults as that recipe's: off."""

    enable: bool = key(False, 'dapo: penalise responses that run into the last len tokens of data.max_response_length',
        ours=True)
    len: int = key(0, 'dapo: length of the overlong buffer in tokens', ours=True)
    penalty_factor: float = key(0.0, 'dapo: penalty at data.max_response_length', ours=True)
    log: bool = key(False, 'dapo: log overlong_reward and overlong per sample', ours=True)


@dataclass
class RewardModelSandboxFusionConfig:
    """``reward_model.sandbox_fusion``."""

    # verl 0.9: reward section (the 0.9 spellings reward.sandbox_fusion.* are aliases)
    url: Any = key(None, 'run_code endpoint of a Sandbox Fusion service that runs the code of code data sources '
        '(codecontests, apps, codeforces, taco); null = none', aliases=("reward.sandbox_fusion.url",))
    max_concurrent: int = key(64, 'max requests in flight to the sandbox (per reward process)',
        aliases=("reward.sandbox_fusion.max_concurrent",))
    memory_limit_mb: int = key(1024, 'memory limit of one sandbox run, in MB (sent as memory_limit_MB)',
        aliases=("reward.sandbox_fusion.memory_limit_mb",))


@dataclass
class RewardModelConfig:
    """``reward_model``."""

    # verl 0.9: reward section (the 0.9 spellings reward.reward_model.* are aliases)
    enable: bool = key(False, 'score with a reward model (False = rule/custom reward function only)',
        aliases=("reward.reward_model.enable",), verl_default=None, differs="the reference's default")
    enable_resource_pool: bool = key(False,
        'run the reward model in its own resource pool instead of next to the actor',
        why='a separate Ray resource pool for the reward model; it runs next to the actor',
        aliases=("reward.reward_model.enable_resource_pool",), verl_default=None, differs="verl 0.6's default; verl 0.9.1 nulls its legacy reward_model section so that reward.reward_model.* wins")
    n_gpus_per_node: int = key(0, 'GPUs per node of that pool (with enable_resource_pool)',
        no_effect_yet='read only with reward_model.enable_resource_pool, which is refused (the reward model runs '
                      'next to the actor)',
        aliases=("reward.reward_model.n_gpus_per_node",), verl_default=None, differs="verl 0.6's default; verl 0.9.1 nulls its legacy reward_model section so that reward.reward_model.* wins")
    nnodes: int = key(0, 'nodes of that pool (with enable_resource_pool)',
        no_effect_yet='read only with reward_model.enable_resource_pool, which is refused (the reward model runs '
                      'next to the actor)',
        aliases=("reward.reward_model.nnodes",), verl_default=None, differs="verl 0.6's default; verl 0.9.1 nulls its legacy reward_model section so that reward.reward_model.* wins")
    strategy: str = key('fsdp', 'backend of the reward model: fsdp | fsdp2', only=('fsdp', 'fsdp2'),
        why='only FSDP backends; Megatron is a backend this project does not have')
    model: RewardModelModelConfig = section(RewardModelModelConfig)
    micro_batch_size: Optional[int] = key(None, 'deprecated global micro-batch; divided by world size')
    micro_batch_size_per_gpu: Optional[int] = key(16, 'sequences per forward on one worker')
    max_length: Optional[int] = key(None, 'max tokens of an RM input; null = no limit')
    ulysses_sequence_parallel_size: int = key(1, 'Ulysses sequence-parallel size (only 1 is supported yet)',
        why='sequence parallelism')
    use_dynamic_bsz: bool = key('${critic.use_dynamic_bsz}', 'pack micro-batches by token budget')
    forward_max_token_len_per_gpu: int = key('${critic.forward_max_token_len_per_gpu}',
        'token budget per worker micro-batch')
    reward_manager: str = key('naive',
        'reward manager: naive (one sample at a time) | batch (one call per batch) | prime (process pool, timeout) | '
        'dapo (naive + overlong penalty) | remote (reward.num_workers processes) | rate_limited (reward.max_*); '
        'with reward.reward_manager.source=importlib, a class name in reward.reward_manager.module.path',
        choices=registered("reward_manager", unless=(("reward.reward_manager.source", "importlib"),
                                                     ("reward_model.reward_loop_source", "importlib"))),
        aliases=("reward.reward_manager.name",), verl_default=None, differs="the reference's default")
    launch_reward_fn_async: bool = key(False, 'run the reward function in the background while the old log-probs, '
        'reference log-probs and values are computed (joined before the advantages; same scores)')
    reward_kwargs: Dict[str, Any] = free_form('extra keyword arguments for the reward manager',
                                              aliases=("reward.reward_kwargs",))  # verl 0.9 recipes' spelling
    overlong_buffer: OverlongBufferConfig = section(OverlongBufferConfig,
        "verl's DAPO recipe spelling of the dapo manager's overlong_buffer_cfg (with max_resp_len = "
        "data.max_response_length)")
    sandbox_fusion: RewardModelSandboxFusionConfig = section(RewardModelSandboxFusionConfig)
    profiler: FollowerProfilerConfig = section(FollowerProfilerConfig)
    # verl 0.9: reward model
    num_workers: Optional[int] = key(None, 'reward workers (the remote manager\'s processes); set, it replaces '
        'reward.num_workers (verl 0.9.1); null = reward.num_workers')
    # verl 0.9.1's legacy spelling of reward.reward_manager.{source,module.path} (its migrate_legacy_reward_impl)
    reward_loop_source: Optional[str] = key(None, "set: replaces reward.reward_manager.source: register (the "
        "registered reward_model.reward_manager) | importlib (a class in reward_loop_module_path); null = "
        "reward.reward_manager.source", choices=('register', 'importlib'))
    reward_loop_module_path: Optional[str] = key(None, 'with reward_loop_source=importlib: the python file holding '
        'the reward manager class (replaces reward.reward_manager.module.path)')
    reward_loop_class_name: Optional[str] = key(None, 'with reward_loop_source=importlib: the class in that file; '
        'null = reward_model.reward_manager (verl 0.9.1 writes it to reward.reward_manager.module.name instead)')
    rollout: RewardModelRolloutConfig = section(RewardModelRolloutConfig,
        'engine of a generative reward model (not supported)')

    def __post_init__(self) -> None:
        check_section(["{section}.reward_loop_source=importlib needs {section}.reward_loop_module_path (the python "
                       "file holding the reward manager class)."]
                      if self.reward_loop_source == "importlib" and not self.reward_loop_module_path else [])


@dataclass
class CustomRewardConfig:
    """``custom_reward_function``."""

    # verl 0.9 moved this section under reward.*: its spelling is accepted as an alias
    path: Optional[str] = key(None, 'file holding a custom reward function; null = built-in scorers',
                              aliases=("reward.custom_reward_function.path",))
    name: str = key('compute_score', 'name of the function in that file',
                    aliases=("reward.custom_reward_function.name",),
        verl_default=None, differs="the reference's default")
    reward_kwargs: Dict[str, Any] = free_form('extra keyword arguments passed to the custom reward function',
                                              aliases=("reward.custom_reward_function.reward_kwargs",))

    def __post_init__(self) -> None:
        check_section([f"{{section}}.path={self.path!r} needs {{section}}.name, got null."]
                      if self.path and not self.name else [])
