"""The root of ppo_trainer.yaml: ``algorithm``, ``trainer``, ``ray_init``/``ray_kwargs``, ``global_profiler`` and the
sections of the other ppo_* modules (verl's ``AlgoConfig``, ``TrainerConfig``).

Generated once from the YAML; now the one source of these keys (see rlhf_core/config/spec.py). Edit here, then
run `python -m rlhf_core.config.gen_yaml` to rewrite rlhf_core/configs/*.yaml and docs/CONFIG_KEYS.md.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from rlhf_core.config.schemas.sections09 import (DistillationConfig, SandboxFusionConfig, SkipConfig,
                                                 TransferQueueConfig)
from rlhf_core.config.spec import check_section, free_form, key, registered, section, trainer_errors
from rlhf_core.config.schemas.ppo_async import AsyncTrainingConfig, StandaloneRolloutConfig
from rlhf_core.config.schemas.ppo_actor import ActorConfig, HFModelConfig, RefConfig
from rlhf_core.config.schemas.ppo_critic import CriticConfig, CustomRewardConfig, RewardModelConfig
from rlhf_core.config.schemas.ppo_data import DataConfig
from rlhf_core.config.schemas.ppo_reward import RewardConfig
from rlhf_core.config.schemas.sections09_engines import TrainerV1Config
from rlhf_core.config.schemas.ppo_rollout import RolloutConfig
from rlhf_core.user_code import file_and_name_errors, is_dotted_class_path

# The comment lines at the top of the generated YAML file.
YAML_HEADER = (
    'ppo_trainer.yaml — RL trainer (FSDP backend), verl-compatible keys and defaults.',
    "Every key has a one-line comment above it; docs/CONFIG_KEYS.md lists each key's status.",
    'Override any key on the command line: `rlhf ppo a.b.c=value +a.new=value ~a.b`.',
    'Generated from rlhf_core/config/schemas/ by `python -m rlhf_core.config.gen_yaml`: edit the classes, not this file.',
)


@dataclass
class ActorRolloutRefConfig:
    """``actor_rollout_ref``."""

    hybrid_engine: bool = key(True, 'actor and rollout share weights in one worker; False (separate rollout workers) '
        'only with async_training.mode=one_step_off_policy or fully_async, which need it so')
    nccl_timeout: int = key(600, "timeout of the actor/rollout workers' collective process group (nccl, or gloo "
        "on CPU), in seconds")
    model: HFModelConfig = section(HFModelConfig)
    actor: ActorConfig = section(ActorConfig)
    ref: RefConfig = section(RefConfig)
    rollout: RolloutConfig = section(RolloutConfig)


@dataclass
class KLControlConfig:
    """``algorithm.kl_ctrl``."""

    type: str = key('fixed', 'KL controller: fixed | adaptive', choices=('fixed', 'adaptive'))
    kl_coef: float = key(0.005, '(initial) KL coefficient beta',
        verl_default=0.001, differs="the reference's default")
    horizon: int = key(10000, 'adaptive controller horizon')
    target_kl: float = key(0.1, 'adaptive controller target KL')


@dataclass
class PFPPOConfig:
    """``algorithm.pf_ppo``."""

    reweight_method: str = key('pow',
        'sampling weight of a response: pow (|score|^weight_pow) | max_min | max_random',
        choices=('pow', 'max_min', 'max_random'))
    weight_pow: float = key(2.0, 'exponent of the pow weight')


# verl 0.9: rollout correction
@dataclass
class RolloutCorrectionConfig:
    """``algorithm.rollout_correction`` (verl 0.9.1 ``RolloutCorrectionConfig``; values as its
    ``algorithm/rollout_correction.yaml``). verl's presets are python constructors, not a key: their values are in
    rlhf_core/config/rollout_corr.py ``PRESETS`` (``python -m rlhf_core.config.rollout_corr <name>`` prints them as
    overrides)."""

    rollout_is: Optional[str] = key(None,
        'IS weights π_old/π_rollout: null (none, metrics only) | token | sequence', choices=(None, 'token', 'sequence'))
    rollout_is_threshold: Any = key(2.0,
        "IS bound: a number truncates weights at it (TIS); 'lower_upper' (e.g. '0.5_5.0') zeroes weights outside "
        '(IcePop)', types=(float, int, str))
    rollout_rs: Optional[str] = key(None,
        'rejection sampling, comma list of token_k1|token_k2|token_k3|seq_sum_k1..k3|seq_mean_k1..k3|seq_max_k2|'
        'seq_max_k3: drops tokens/sequences from response_mask; null = off')
    rollout_rs_threshold: Any = key(None,
        "rejection bounds, one or one per rollout_rs option: k1 takes 'lower_upper' or U (= [1/U, U]) on the ratio, "
        'k2/k3 an upper bound', types=(float, int, str), null_ok=True)
    bypass_mode: bool = key(False,
        'use the rollout log-probs as old log-probs (skip the old-log-prob pass); the loss is loss_type')
    loss_type: str = key('ppo_clip', 'bypass_mode loss: ppo_clip (ratio to the rollout policy, clipped) | '
        'reinforce (−w·A·log π with the IS weights)', choices=('ppo_clip', 'reinforce'))
    rollout_is_batch_normalize: bool = key(False, 'divide IS weights by their batch mean (mean 1 over valid tokens)')

    def __post_init__(self) -> None:
        from rlhf_core.config.rollout_corr import parse_is_threshold, parse_rs

        errors = []
        for check, args in ((parse_is_threshold, (self.rollout_is_threshold,)),
                            (parse_rs, (self.rollout_rs, self.rollout_rs_threshold))):
            if check is parse_rs and self.rollout_rs is None:
                continue
            try:
                check(*args)
            except ValueError as exc:
                errors.append(str(exc).replace("algorithm.rollout_correction", "{section}") + ".")
        if self.loss_type == "reinforce" and not self.bypass_mode:
            errors.append("{section}.loss_type=reinforce is read only with {section}.bypass_mode=true (the "
                          "decoupled mode uses actor.policy_loss.loss_mode), got bypass_mode=false.")
        check_section(errors)


# verl 0.9: DAPO dynamic sampling
@dataclass
class FilterGroupsConfig:
    """``algorithm.filter_groups``: DAPO dynamic sampling (Yu et al. 2025, arXiv:2503.14476, Eq. 11), as verl's
    ``FilterGroupsConfig``. A prompt group whose ``metric`` is the same for all its samples is dropped; gen batches
    of ``data.gen_batch_size`` prompts are generated until ``data.train_batch_size`` groups are kept."""

    enable: bool = key(False, 'drop prompt groups whose metric has zero spread and generate more until a full batch')
    metric: Optional[str] = key('reward',
        'per-sample value whose spread decides: reward / seq_reward (summed token_level_scores), seq_final_reward '
        '(summed token_level_rewards), or a reward_extra_info field (acc, score, ...)')
    max_num_gen_batches: int = key(0, 'error after this many gen batches in one step without a full batch; 0 = no limit')
    max_inflight_gen_batches: int = key(1, "verl's V1 trainer: prompts pending or generating at once in its replay "
        'buffer, in data.train_batch_size units', only=(1,),
        why="verl 0.9.1 reads it only in the V1 trainer's ReplayBuffer (trainer.use_v1, over TransferQueue, a data "
            "plane this project does not have), which dispatches DAPO prompts one by one and drains the surplus; "
            "its classic RayPPOTrainer does not read it, and this driver's DAPO (one gen batch after another, "
            "rlhf_core/trainer/dynamic_sampling.py) has no replay buffer to bound")

    def __post_init__(self) -> None:
        errors = []
        if self.enable and not self.metric:
            errors.append("{section}.metric must be set when {section}.enable=True, got " + repr(self.metric) + ".")
        if self.max_num_gen_batches < 0:
            errors.append(f"{{section}}.max_num_gen_batches={self.max_num_gen_batches} must be >= 0 (0 = no limit).")
        check_section(errors)


@dataclass
class AlgoConfig:
    """``algorithm``."""

    gamma: float = key(1.0, 'discount factor')
    lam: float = key(1.0, 'GAE lambda')
    adv_estimator: str = key('gae',
        'advantage estimator: gae | grpo | reinforce_plus_plus | reinforce_plus_plus_baseline | rloo | '
        'rloo_vectorized | grpo_vectorized | remax | opo | grpo_passk | gpg | gdpo | optimal_token_baseline | '
        'tir_optimal_token_baseline',
        choices=registered("adv_estimator"))
    norm_adv_by_std_in_grpo: bool = key(True, 'GRPO: divide by the group std (False = Dr. GRPO)')
    use_kl_in_reward: bool = key(False, 'subtract a KL penalty from the rewards')
    kl_penalty: str = key('kl', 'KL estimator for the reward penalty: kl | abs | mse | low_var_kl | full',
        choices=('kl', 'k1', 'abs', 'mse', 'k2', 'low_var_kl', 'k3', 'full', 'kl+', 'k1+', 'abs+', 'mse+', 'k2+', 'low_var_kl+', 'k3+'))
    kl_ctrl: KLControlConfig = section(KLControlConfig)
    use_pf_ppo: bool = key(False, 'PF-PPO: resample the batch by reward before the update (with adv_estimator gae)')
    pf_ppo: PFPPOConfig = section(PFPPOConfig)
    rollout_correction: RolloutCorrectionConfig = section(RolloutCorrectionConfig,
        'rollout correction (verl 0.9): IS weights, rejection sampling, bypass mode')
    rollout_is: bool = key(False, 'verl 0.6, read as rollout_correction.rollout_is: multiply the policy loss by IS weights')
    rollout_is_threshold: Optional[float] = key(None, 'verl 0.6, read as rollout_correction.rollout_is_threshold: upper bound; null = off')
    rollout_is_threshold_lower: Optional[float] = key(None, 'verl 0.6: lower bound on IS weights (mask mode); null = 1/upper')
    rollout_is_level: str = key('token', 'verl 0.6 IS aggregation level: token | sequence | geometric',
        choices=('token', 'sequence', 'geometric'))
    rollout_is_mode: str = key('truncate', 'verl 0.6 IS bound mode: truncate | mask', choices=('truncate', 'mask'))
    rollout_is_veto_threshold: float = key(0.0001, 'verl 0.6: zero the IS weights of a sequence with a token ratio below this')
    # verl 0.9: DAPO dynamic sampling
    filter_groups: FilterGroupsConfig = section(FilterGroupsConfig,
        'DAPO dynamic sampling: keep only prompt groups with reward spread')
    # verl 0.9: advantage estimators (gdpo)
    gdpo_reward_keys: Optional[List[str]] = key(None,
        'gdpo: the reward components, keys of the reward function\'s dict result (e.g. [format_reward, '
        'accuracy_reward]); each is normalised within its group before they are summed; required by gdpo')
    gdpo_reward_weights: Optional[List[float]] = key(None,
        'gdpo: one weight per gdpo_reward_keys entry for the sum of the normalised components; null = all 1')


@dataclass
class TrainerConfig:
    """``trainer``."""

    total_epochs: int = key(30, 'passes over the training data')
    total_training_steps: Optional[int] = key(None, 'total steps; null = len(dataloader) x total_epochs')
    project_name: str = key('verl_examples', 'project name for the loggers (mlflow experiment, wandb project)')
    experiment_name: str = key('gsm8k', 'run name for the loggers')
    logger: Any = key(['console', 'wandb'],
        'metric sinks: console, mlflow, tensorboard, file, wandb, swanlab, trackio', types=(list, str,),
        item_choices=('console', 'mlflow', 'tensorboard', 'file', 'wandb', 'swanlab', 'trackio'))
    log_val_generations: int = key(0, 'validation generations to log as a table')
    validation_data_dir: Optional[str] = key(None, 'folder for validation generations (parquet); null = not written')
    rollout_data_dir: Optional[str] = key(None, 'folder for training rollouts (jsonl); null = not written')
    nnodes: int = key(1, 'nodes used for training')
    n_gpus_per_node: int = key(8, 'workers (GPUs, or CPU slots) per node')
    save_freq: int = key(-1, 'save a checkpoint every N steps and at the last step; -1 = no checkpoints')
    val_before_train: bool = key(True, 'validate before the first step')
    val_only: bool = key(False, 'only validate, then exit (no training)')
    test_freq: int = key(2, 'validate every N steps; -1 = never',
        verl_default=-1, differs="the reference's default")
    critic_warmup: int = key(0, 'steps that train only the critic before the actor starts')
    balance_batch: bool = key(True, 'reorder the batch so each worker gets a similar token count')
    default_hdfs_dir: Optional[str] = key(None, 'HDFS folder to copy checkpoints to; null = none')
    default_local_dir: str = key('checkpoints/${trainer.project_name}/${trainer.experiment_name}',
        'local checkpoint folder')
    resume_mode: str = key('auto', 'resume: auto | disable | resume_path', choices=('auto', 'disable', 'resume_path'))
    resume_from_path: Optional[str] = key(None,
        'checkpoint to resume from (…/global_step_N) when resume_mode=resume_path')
    remove_previous_ckpt_in_save: bool = key(False, 'delete the previous checkpoint after saving a new one')
    del_local_ckpt_after_load: bool = key(False, 'delete the local checkpoint after loading it')
    max_actor_ckpt_to_keep: Optional[int] = key(None, 'keep at most this many actor checkpoints; null = all')
    max_critic_ckpt_to_keep: Optional[int] = key(None, 'keep at most this many critic checkpoints; null = all')
    ray_wait_register_center_timeout: int = key(300, 'seconds to wait for the Ray register center')
    esi_redundant_time: int = key(0,
        'extra seconds of margin of the capacity-expiry save: with save_freq > 0 a checkpoint is saved once the '
        'capacity block (MLP_/SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP) ends within 60 s + the '
        'longest step + this')
    use_legacy_worker_impl: str = key('auto',
        'worker implementation: auto | enable (legacy workers) | disable (new engine)',
        choices=('auto', 'enable', 'disable'),
        no_effect_yet="verl 0.9.1 reads it nowhere (its legacy workers are gone: the key is only in its YAML); "
                      "this project has one worker implementation (its FSDP2 workers), used for every value")
    # verl 0.9: trainer
    use_v1: bool = key(True, "verl 0.9's v1 trainer loop: true = trainer.v1.trainer_mode chooses the driver "
        "(separate_async: the fully async one); false = verl's deprecated main_ppo_v0, which reads no trainer.v1 key "
        "(the driver async_training.mode names)")
    v1: TrainerV1Config = section(TrainerV1Config, "verl 0.9's v1 trainer loop: trainer_mode and separate_async choose "
                                  "and set the driver (rlhf_core/config/v1_trainer.py)")
    checkpoint_callback_class: Optional[str] = key(None,
        'path/to/file.py:ClassName, or verl\'s dotted pkg.module.ClassName (imported from sys.path), of a class built '
        'with the config whose on_save(trainer, global_step, checkpoint_dir, async_save) runs on the driver after '
        'each checkpoint save; null = none')
    device: str = key('auto', 'device: auto (cuda if available else cpu) | cuda | cpu',
        choices=('auto', 'cpu', 'cuda'), ours=True,
        verl_default='cuda', differs='ours: auto = cuda when available, else cpu')
    stop_after_step: Optional[int] = key(None,
        'stop after this global step, saving a checkpoint; null = run to the end', ours=True)
    total_training_seconds: Optional[float] = key(None,
        'wall-clock budget in seconds for the training loop: when spent, validate, checkpoint and stop; null = none',
        ours=True)
    extensions: List[str] = key([],
        'Python files run before the config is checked, in the driver and every worker: their register_adv_est, '
        'register_policy_loss and reward-manager register calls make new names valid choices', ours=True)

    def __post_init__(self) -> None:
        callback = self.checkpoint_callback_class
        check_section(trainer_errors(self) + (file_and_name_errors(callback, "{section}.checkpoint_callback_class")
                                              if isinstance(callback, str) and "${" not in callback
                                              and not is_dotted_class_path(callback) else []))


@dataclass
class RayInitConfig:
    """``ray_init``."""

    num_cpus: Optional[int] = key(None, 'CPUs for an embedded Ray instance; null = all')
    address: Optional[str] = key(None,
        'Ray address: null = embedded local instance; auto or ray://host:port = existing cluster', ours=True)
    timeline_json_file: Optional[str] = key(None,
        'write the Ray timeline (chrome trace JSON) to this file after training; null = none')


@dataclass
class RayRuntimeEnvConfig:
    """``ray_kwargs.ray_init.runtime_env`` (Ray's runtime_env; verl's uv-launched scripts set py_executable)."""

    # verl 0.9: ray
    py_executable: Optional[str] = key(None,
        "command that starts Ray's worker processes (e.g. 'uv run'); null = this Python")


@dataclass
class RayKwargsRayInitConfig:
    """``ray_kwargs.ray_init``."""

    num_cpus: Optional[int] = key(None, 'CPUs for an embedded Ray instance; null = all (alias of ray_init.num_cpus)',
        same_as='ray_init.num_cpus')
    runtime_env: RayRuntimeEnvConfig = section(RayRuntimeEnvConfig)


@dataclass
class RayKwargsConfig:
    """``ray_kwargs``."""

    ray_init: RayKwargsRayInitConfig = section(RayKwargsRayInitConfig)
    timeline_json_file: Optional[str] = key(None,
        'write a Ray timeline to this file; null = none (alias of ray_init.timeline_json_file)',
        same_as='ray_init.timeline_json_file')


@dataclass
class GlobalNsysToolConfig:
    """``global_profiler.global_tool_config.nsys``."""

    discrete: bool = key(False, 'Nsight Systems: one trace per task (NVIDIA nsys; default only)',
        why='NVIDIA Nsight Systems (nsys) profiling, a backend we do not have')
    controller_nsight_options: Dict[str, Any] = key({'trace': 'cuda,nvtx,cublas,ucx', 'cuda-memory-usage': 'true', 'cuda-graph-trace': 'graph'},
        '', why='NVIDIA Nsight Systems (nsys) profiling, a backend we do not have',
        leaf_help={'trace': 'nsys: APIs traced on the controller', 'cuda-memory-usage': 'nsys: track CUDA memory on the controller', 'cuda-graph-trace': 'nsys: CUDA graph tracing mode on the controller'})
    worker_nsight_options: Dict[str, Any] = key({'trace': 'cuda,nvtx,cublas,ucx', 'cuda-memory-usage': 'true', 'cuda-graph-trace': 'graph', 'capture-range': 'cudaProfilerApi', 'capture-range-end': None, 'kill': 'none'},
        '', why='NVIDIA Nsight Systems (nsys) profiling, a backend we do not have',
        leaf_help={'trace': 'nsys: APIs traced on the workers', 'cuda-memory-usage': 'nsys: track CUDA memory on the workers', 'cuda-graph-trace': 'nsys: CUDA graph tracing mode on the workers', 'capture-range': 'nsys: start tracing at cudaProfilerStart', 'capture-range-end': "nsys: what happens when the capture range ends; null = nsys's default", 'kill': 'nsys: signal sent to the app when tracing ends'})


@dataclass
class GlobalTorchMemoryToolConfig:
    """``global_profiler.global_tool_config.torch_memory``."""

    trace_alloc_max_entries: int = key(100000, 'torch memory snapshot: max allocation events recorded',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')
    stack_depth: int = key(32, 'torch memory snapshot: stack frames kept per event',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')
    memory_snapshot_num_steps: int = key(1, 'torch memory snapshot: steps recorded per snapshot',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')
    context: str = key('all', 'torch memory snapshot: which events to record: all | alloc | state',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')
    stacks: str = key('all', 'torch memory snapshot: which stacks to record: all | python',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')
    kw_args: Dict[str, Any] = free_form('extra keyword arguments for torch.cuda.memory._record_memory_history',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')


@dataclass
class GlobalPrecisionDebuggerConfig:
    """``global_profiler.global_tool_config.precision_debugger`` (Ascend msprobe's PrecisionDebugger)."""

    config_path: Optional[str] = key(None, 'msprobe precision debugger: its JSON config; null = off', only=(None,),
        why='the msprobe precision debugger (Ascend tooling), which this project does not have')
    steps: Any = key(None, 'msprobe precision debugger: deprecated step filter (global_profiler.steps decides)',
        only=(None,), why='the msprobe precision debugger (Ascend tooling), which this project does not have')
    stages: Any = key(None, 'msprobe precision debugger: stages dumped; null = all', only=(None,),
        why='the msprobe precision debugger (Ascend tooling), which this project does not have')
    strict: bool = key(False, 'msprobe precision debugger: fail on an unknown stage', only=(False,),
        why='the msprobe precision debugger (Ascend tooling), which this project does not have')


@dataclass
class GlobalToolConfig:
    """``global_profiler.global_tool_config``."""

    nsys: GlobalNsysToolConfig = section(GlobalNsysToolConfig)
    torch_memory: GlobalTorchMemoryToolConfig = section(GlobalTorchMemoryToolConfig)
    precision_debugger: GlobalPrecisionDebuggerConfig = section(GlobalPrecisionDebuggerConfig)


@dataclass
class GlobalProfilerConfig:
    """``global_profiler``."""

    tool: Optional[str] = key(None, 'profiler: null (off) | torch | torch_memory | nsys | npu',
        choices=('nsys', 'npu', 'torch', 'torch_memory'), only=(None, 'torch'),
        why='the nsys (NVIDIA Nsight Systems), npu (Ascend) and torch_memory (CUDA memory snapshot) profilers; '
            'tool torch writes torch.profiler traces',
        backend_values={'nsys': 'NVIDIA Nsight Systems (nsys)', 'npu': 'the Ascend NPU profiler',
                        'torch_memory': 'CUDA (a torch.cuda memory snapshot: no effect on CPU)'})
    steps: Any = key(None, 'training steps to profile, e.g. [1, 5]; null = none', types=(list,))
    profile_continuous_steps: bool = key(False, 'profile the listed steps as one continuous trace')
    save_path: str = key('outputs/profile', 'folder for profiler traces')
    global_tool_config: GlobalToolConfig = section(GlobalToolConfig)
    # verl 0.9: profiler
    relocate_results: bool = key(False,
        'move each trace out of save_path/step_<n>/ into save_path as step_<n>_<file> when its step ends')
    finish_hook_cmd: Optional[str] = key(None, 'shell command run once after the last profiled step (env VERL_PROFILE_SAVE_PATH, '
        'VERL_PROFILE_TRACES...); killed after 900 s; a failure is a warning; null = none')
    finish_hook_all_ranks: bool = key(False, 'run finish_hook_cmd on every rank (False = finish_hook_ranks)')
    finish_hook_ranks: List[Any] = key([],
        'ranks that run finish_hook_cmd; [] (and finish_hook_all_ranks False) = the profiled ranks')


@dataclass
class PPOTrainerConfig:
    """the root of ppo_trainer.yaml."""

    data: DataConfig = section(DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig)
    critic: CriticConfig = section(CriticConfig)
    reward_model: RewardModelConfig = section(RewardModelConfig)
    custom_reward_function: CustomRewardConfig = section(CustomRewardConfig)
    # verl 0.9: reward section (its keys with a 0.6 counterpart are aliases of that key)
    reward: RewardConfig = section(RewardConfig, 'verl 0.9 reward settings without a 0.6 counterpart')
    algorithm: AlgoConfig = section(AlgoConfig)
    trainer: TrainerConfig = section(TrainerConfig)
    ray_init: RayInitConfig = section(RayInitConfig)
    ray_kwargs: RayKwargsConfig = section(RayKwargsConfig,
        'verl 0.6 spelling of the ray_init section; the two are aliases (set one, or both to the same value)')
    global_profiler: GlobalProfilerConfig = section(GlobalProfilerConfig)
    # verl 0.9: off-policy trainers (one-step / fully async)
    rollout: StandaloneRolloutConfig = section(StandaloneRolloutConfig,
        'standalone rollout workers (verl one_step_off_ppo_trainer.yaml); read with async_training.mode != on_policy')
    async_training: AsyncTrainingConfig = section(AsyncTrainingConfig,
        'off-policy trainers: async_training.mode picks one (verl fully_async_ppo_trainer.yaml keys)')
    # verl 0.9: top-level sections
    model_engine: str = key('dp', "verl's worker engine family: dp (FSDP data parallel)", only=('dp',),
        why='engines other than dp (Megatron, torchtitan, veomni)')
    transfer_queue: TransferQueueConfig = section(TransferQueueConfig, 'TransferQueue data plane (not supported)')
    distillation: DistillationConfig = section(DistillationConfig, 'on-policy distillation from teacher models (verl 0.9.1)')
    sandbox_fusion: SandboxFusionConfig = section(SandboxFusionConfig, 'code-execution sandbox of code rewards')
    skip: SkipConfig = section(SkipConfig, 'dump a stage or replay its dump (not supported yet)')
