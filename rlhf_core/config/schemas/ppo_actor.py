"""``actor_rollout_ref.model``, ``.actor`` and ``.ref`` of ppo_trainer.yaml: the policy model, its PPO update and
the reference policy (verl's ``HFModelConfig``, ``ActorConfig``, ``FSDPEngineConfig``).

Generated once from the YAML; now the one source of these keys (see rlhf_core/config/spec.py). Edit here, then
run `python -m rlhf_core.config.gen_yaml` to rewrite rlhf_core/configs/*.yaml and docs/CONFIG_KEYS.md.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from rlhf_core.config.spec import check_section, free_form, free_form_or_null, key, number, registered, section
from rlhf_core.config.schemas.engine09 import FORWARD_ONLY, PAD_TO_LENGTH, USE_ORIG_PARAMS, FSDPEngine09, Model09, QATConfig
from rlhf_core.config.schemas.ppo_common import MixedPrecisionConfig, ProfilerConfig, WrapPolicyConfig

REF_NO_ENTROPY = ("the reference's log-prob pass computes no entropy, as in verl 0.9.1 (_compute_ref_log_prob sets "
                  "calculate_entropy=False, verl/trainer/ppo/ray_trainer.py); the reference's actor object reads "
                  "fsdp_config's copy of this key")
ENGINE_COMPILE = ("on CUDA False turns torch.compile of the log-prob/entropy functions off (verl 0.9.1's FSDP engine, "
                  "verl/workers/engine/fsdp/transformer_impl.py, reads this copy; verl 0.6's legacy worker read the "
                  "role's use_torch_compile: either False runs them eagerly); on CPU they run eagerly anyway")


@dataclass
class MoEConfig:
    """``actor_rollout_ref.model.override_config.moe_config``."""

    freeze_moe_router: bool = key(False, 'freeze the MoE router (Megatron only; default only)', why='Megatron only')


@dataclass
class OverrideConfig:
    """``actor_rollout_ref.model.override_config``."""

    model_config: Dict[str, Any] = free_form('HF config fields to override (e.g. dropout)')
    moe_config: MoEConfig = section(MoEConfig, 'MoE options (Megatron only)')


@dataclass
class FusedKernelOptionsConfig:
    """``actor_rollout_ref.model.fused_kernel_options``."""

    impl_backend: str = key('torch', 'implementation backend of fused kernels: torch | triton',
        choices=('torch', 'triton'), only=('torch',),
        why='fused-kernel backends other than torch: Triton kernels are GPU-only and model.use_fused_kernels is default only')


@dataclass
class HFModelConfig(Model09):
    """``actor_rollout_ref.model``."""

    path: str = key('~/models/deepseek-llm-7b-chat', 'Hugging Face model path (local, hdfs:// or s3://)')
    hf_config_path: Any = key(None, 'folder holding the HF config.json; null = model.path')
    tokenizer_path: Any = key(None, 'tokenizer folder; null = model.path')
    external_lib: Optional[str] = key(None, 'python module to import first (registers custom models/tokenizers)')
    override_config: OverrideConfig = section(OverrideConfig, "overrides of the model's HF config")
    enable_gradient_checkpointing: bool = key(False, 'activation (gradient) checkpointing for the actor',
        verl_default=True, differs="the reference's default")
    enable_activation_offload: bool = key(False, 'offload activations to CPU',
        no_effect_on_cpu='on CUDA the training forward runs under save_on_cpu(pin_memory=True); on CPU activations already '
                         'live in host memory',
)
    trust_remote_code: bool = key(False, 'allow remote code when loading the model')
    use_remove_padding: bool = key(False, 'unpad sequences before the forward pass (varlen attention)',
        verl_default=True, differs="the reference's default")
    use_fused_kernels: bool = key(False, 'use fused kernels for log-prob/entropy from hidden states',
        why='fused kernels')
    fused_kernel_options: FusedKernelOptionsConfig = section(FusedKernelOptionsConfig, 'options for fused kernels')
    lora_rank: int = key(0, 'LoRA rank; 0 = full fine-tuning')
    lora_alpha: int = key(16, 'LoRA scaling alpha')
    target_modules: Any = key('all-linear', 'modules that get LoRA adapters', types=(str, list,))
    use_shm: bool = key(False, 'load the model through shared memory (/dev/shm)', why='shared-memory model loading')
    exclude_modules: Any = key(None, 'module names that never get LoRA adapters (a regex string or a list of '
        'names / name suffixes); null = none', types=(str, list))
    use_liger: bool = key(False, 'verl: apply Liger kernels (GPU) to the model; not shipped here: only False',
        only=(False,),
        why='Liger kernels: GPU-only Triton kernels that this project does not ship')
    custom_chat_template: Optional[str] = key(None,
        "chat template to use instead of the tokenizer's; null = the tokenizer's")


@dataclass
class ActorPolicyLossConfig:
    """``actor_rollout_ref.actor.policy_loss``."""

    loss_mode: str = key('vanilla',
        'policy loss function: vanilla (PPO clip) | gspo | gpg | clip_cov | kl_cov | geo_mean | cispo | sapo | dro '
        '| dppo_tv | dppo_kl',
        choices=registered("policy_loss"))
    clip_cov_ratio: float = key(0.0002, 'clip_cov: fraction of valid tokens whose gradient is cut')
    clip_cov_lb: float = key(1.0, 'clip_cov: lower bound of the covariance interval of candidate tokens')
    clip_cov_ub: float = key(5.0, 'clip_cov: upper bound of the covariance interval of candidate tokens')
    kl_cov_ratio: float = key(0.0002, 'kl_cov: fraction of valid tokens (largest covariance) given the KL penalty')
    ppo_kl_coef: float = key(0.1, 'kl_cov: coefficient of the |log-ratio| penalty')
    # verl 0.9: policy losses
    dro_beta: Optional[float] = key(None,
        'dro: coefficient β of the ½·β·(log-ratio)² penalty; required (> 0) with loss_mode=dro')

    def __post_init__(self) -> None:
        errors = []
        for mode, key in (("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio"), ("dro", "dro_beta")):
            value = getattr(self, key)
            if self.loss_mode == mode and (value is None or number(value) and value <= 0):
                errors.append(f"{{section}}.{key}={value} must be > 0 with loss_mode={mode}.")
        check_section(errors)


@dataclass
class ActorOptimConfig:
    """``actor_rollout_ref.actor.optim``."""

    optimizer: str = key('adam', 'optimizer: adam and adamw build torch.optim.AdamW; AdamW, Adam, SGD, RMSprop the '
        'torch.optim class of that name (betas and eps go to the Adam family only)',
        choices=('adam', 'adamw', 'AdamW', 'Adam', 'SGD', 'RMSprop'),
        verl_default='AdamW', differs="the reference's default (adam = torch.optim.AdamW)")
    lr: float = key(1e-06, 'peak learning rate')
    betas: List[float] = key([0.9, 0.999], 'AdamW betas')
    eps: float = key(1e-08, "AdamW epsilon (ours; torch's default)")
    weight_decay: float = key(0.01, 'AdamW weight decay')
    lr_warmup_steps: int = key(-1, 'warmup steps; negative = use lr_warmup_steps_ratio')
    lr_warmup_steps_ratio: float = key(0.0, 'warmup steps as a fraction of total_training_steps')
    min_lr_ratio: float = key(0.0, 'cosine scheduler: final lr as a fraction of lr')
    num_cycles: float = key(0.5, 'cosine scheduler: number of cosine cycles')
    lr_scheduler_type: str = key('constant', 'scheduler after warmup: constant | cosine',
        choices=('constant', 'cosine'))
    total_training_steps: int = key(-1, 'total optimizer steps; -1 = injected by the trainer at run time')
    warmup_style: Optional[str] = key(None,
        'deprecated spelling of lr_scheduler_type (constant | cosine); null = unset', choices=('constant', 'cosine'))
    # verl 0.9: optimizer
    optimizer_impl: str = key('torch.optim', 'module the optimizer class is taken from', only=('torch.optim',),
        why='optimizers from other modules (e.g. torchao, bitsandbytes)')
    zero_indexed_step: bool = key(True, 'the cosine scheduler counts optimizer steps from 0; False: from 1 (its '
        'multiplier at update s is the one of s + 1; the constant schedule ignores it, as in verl)')
    override_optimizer_config: Optional[Dict[str, Any]] = free_form_or_null('extra keyword arguments for the '
        'optimizer, applied last (e.g. {amsgrad: true}); a keyword the optimizer does not take fails the build')
    clip_grad: float = key(1.0, 'Megatron: gradient clip (FSDP uses actor.grad_clip; default only)',
        why='Megatron-only optimizer key; set actor_rollout_ref.actor.grad_clip')
    lr_warmup_init: float = key(0.0, 'Megatron: initial lr of warmup (default only)',
        why='Megatron-only optimizer key; FSDP warmup is linear from 0')
    lr_decay_steps: Optional[int] = key(None, 'Megatron: steps of lr decay (default only)',
        why='Megatron-only optimizer key')
    lr_decay_style: str = key('constant',
        'Megatron: decay style after warmup (FSDP uses lr_scheduler_type; default only)',
        why='Megatron-only optimizer key; set lr_scheduler_type')
    min_lr: float = key(0.0, 'Megatron: minimum lr (FSDP uses min_lr_ratio; default only)',
        why='Megatron-only optimizer key; set min_lr_ratio')
    weight_decay_incr_style: str = key('constant', 'Megatron: weight-decay increment style (default only)',
        why='Megatron-only optimizer key')
    lr_wsd_decay_style: str = key('exponential', 'Megatron: WSD decay style (default only)',
        why='Megatron-only optimizer key')
    lr_wsd_decay_steps: Optional[int] = key(None, 'Megatron: WSD decay steps (default only)',
        why='Megatron-only optimizer key')
    use_checkpoint_opt_param_scheduler: bool = key(False,
        'Megatron: restore the optimizer-parameter scheduler from checkpoint (default only)',
        why='Megatron-only optimizer key')


@dataclass
class ActorFSDPConfig(FSDPEngine09):
    """``actor_rollout_ref.actor.fsdp_config``."""

    wrap_policy: WrapPolicyConfig = section(WrapPolicyConfig)
    param_offload: bool = key(False, 'offload parameters to CPU',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    optimizer_offload: bool = key(False, 'offload optimizer state to CPU',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    offload_policy: bool = key(False, 'FSDP2 CPU offload policy',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    reshard_after_forward: bool = key(True, 'reshard parameters after forward (FSDP2)')
    fsdp_size: int = key(-1, 'FSDP shard group size; -1 = all workers')
    forward_prefetch: bool = key(False, "prefetch the next layer's all-gather in forward (FSDP2 "
        "set_modules_to_forward_prefetch, depth 1, as verl's FSDP2 path; the same outputs)")
    model_dtype: str = key('fp32', 'dtype of the trained parameters: fp32 | bf16 | fp16',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16'))
    use_orig_params: bool = key(False, 'FSDP1 flat-parameter option (FSDP2 has no flat parameters)',
        no_effect_yet=USE_ORIG_PARAMS)
    ulysses_sequence_parallel_size: int = key(1,
        "new-engine copy of the Ulysses sequence-parallel size (read when the role's own key is 1)")
    entropy_from_logits_with_chunking: bool = key('${actor_rollout_ref.actor.entropy_from_logits_with_chunking}',
        "new-engine copy of entropy_from_logits_with_chunking (the actor reads this copy, which follows the role's "
        "key)")
    use_torch_compile: bool = key(True, 'new-engine copy of use_torch_compile (False: no torch.compile)',
        no_effect_on_cpu=ENGINE_COMPILE)
    entropy_checkpointing: bool = key('${actor_rollout_ref.actor.entropy_checkpointing}',
        "new-engine copy of entropy_checkpointing (the actor reads this copy, which follows the role's key)")
    forward_only: bool = key(False, 'new engine: build the actor for forward passes only (False only: it is trained)',
        only=(False,), why=FORWARD_ONLY)
    strategy: str = key('fsdp', 'new-engine copy of the backend: fsdp | fsdp2', only=('fsdp', 'fsdp2'),
        why='only FSDP backends; Megatron is a backend this project does not have')
    cpu_threads: Optional[int] = key(None,
        "intra-op CPU threads of each actor/rollout/ref rank; null = the node's CPUs ÷ its ranks", ours=True)
    mixed_precision: MixedPrecisionConfig = section(MixedPrecisionConfig)
    entropy_from_logits_chunk_size: int = key('${actor_rollout_ref.actor.entropy_from_logits_chunk_size}',
        "new-engine copy of entropy_from_logits_chunk_size (the actor reads this copy, which follows the role's key)")
    pad_to_length: bool = key('${actor_rollout_ref.actor.pad_to_length}',
        "new-engine copy of the actor's pad_to_length (the actor reads this copy, which follows the role's key)")


@dataclass
class ActorCheckpointConfig:
    """``actor_rollout_ref.actor.checkpoint``."""

    save_contents: List[str] = key(['model', 'optimizer', 'extra'],
        'what to save: model, optimizer, extra (lr scheduler + RNG), hf_model',
        item_choices=('model', 'optimizer', 'extra', 'hf_model'))
    load_contents: List[str] = key('${actor_rollout_ref.actor.checkpoint.save_contents}',
        'what to load when resuming', item_choices=('model', 'optimizer', 'extra', 'hf_model'))
    async_save: bool = key(False, 'save checkpoints off the training thread')
    # verl 0.9: checkpoint
    strict: bool = key(True, "strict validation of the HF weights a checkpoint exports (verl 0.9 reads it only in "
        "its Megatron checkpoint manager, for Megatron-Bridge's save_hf_weights)",
        no_effect_yet="verl 0.9.1 reads it only in verl/utils/checkpoint/megatron_checkpoint_manager.py (Megatron, "
                      "which we do not have); its FSDP checkpoint manager ignores it too; here every load is strict "
                      "(DCP fails on a model key the checkpoint lacks) and hf_model writes every key of the model's "
                      "state dict")


@dataclass
class ActorConfig:
    """``actor_rollout_ref.actor``."""

    strategy: str = key('fsdp', 'training backend: fsdp | fsdp2 (megatron not supported yet)', only=('fsdp', 'fsdp2'),
        why='only FSDP backends; Megatron is a backend this project does not have')
    ppo_mini_batch_size: int = key(256, 'prompts per optimizer step (global, multiplied by rollout.n)')
    ppo_micro_batch_size: Optional[int] = key(None,
        'deprecated global micro-batch; divided by world size into ppo_micro_batch_size_per_gpu')
    ppo_micro_batch_size_per_gpu: Optional[int] = key(8,
        'sequences per forward/backward on one worker (gradient accumulation)',
        verl_default=None, differs="the reference's default")
    use_dynamic_bsz: bool = key(False, 'pack micro-batches by token budget instead of count')
    ppo_max_token_len_per_gpu: int = key(16384, 'token budget per worker micro-batch when use_dynamic_bsz')
    grad_clip: float = key(1.0, 'clip the global gradient norm to this value')
    clip_ratio: float = key(0.2, 'PPO clip epsilon')
    clip_ratio_low: Optional[float] = key(0.2, 'lower clip epsilon (defaults to clip_ratio)')
    clip_ratio_high: Optional[float] = key(0.2, 'upper clip epsilon (defaults to clip_ratio)')
    clip_ratio_c: float = key(3.0, 'dual-clip constant c for negative advantages (dppo_tv/dppo_kl: the truncation '
        'bound of the detached ratio)')
    # verl 0.9: policy losses
    tau_pos: float = key(1.0, 'sapo: temperature of the soft gate for tokens with advantage > 0',
        aliases=('actor_rollout_ref.actor.policy_loss.tau_pos',))  # the spelling of verl 0.9.0's sapo example
    tau_neg: float = key(1.05, 'sapo: temperature of the soft gate for tokens with advantage <= 0',
        aliases=('actor_rollout_ref.actor.policy_loss.tau_neg',))
    loss_agg_mode: str = key('token-mean',
        'how token losses are aggregated: token-mean | seq-mean-token-sum | seq-mean-token-mean | '
        'seq-mean-token-sum-norm',
        choices=('token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean', 'seq-mean-token-sum-norm'))
    entropy_coeff: float = key(0.0, 'entropy bonus coefficient',
        verl_default=0, differs="the reference's default, written 0.0 (a float)")
    entropy_from_logits_with_chunking: bool = key(False, 'compute the entropy entropy_from_logits_chunk_size rows '
        'at a time (False: in 128-row chunks, sized for the CPU cache); the same values either way')
    entropy_checkpointing: bool = key(False, 'recompute the entropy in the backward instead of storing its '
        'intermediates (torch.utils.checkpoint; the same gradient)')
    # verl 0.9: advantage estimators (optimal token baseline)
    calculate_sum_pi_squared: bool = key(False,
        'the log-prob pass also returns sum_pi_squared (B, T) = Σ_v π(v)² per response token; '
        'adv_estimator optimal_token_baseline / tir_optimal_token_baseline turn it on themselves')
    use_kl_loss: bool = key(False, 'add a KL(actor || ref) loss term (GRPO uses True)')
    rollout_is: bool = key(False, 'multiply the policy loss by rollout importance-sampling weights')
    # verl 0.9.1: FSDPActorConfig.use_rollout_log_probs (its fully-async config sets it True)
    use_rollout_log_probs: bool = key(False,
        "old_log_probs are the rollout engine's log-probs (rollout.calculate_log_probs=True), not a recompute by the "
        "actor: pi_old = pi_rollout, as algorithm.rollout_correction.bypass_mode does for the loss's ratio")
    rollout_is_threshold: Optional[float] = key(None, 'upper bound on IS weights; null = disabled')
    rollout_is_threshold_lower: Optional[float] = key(None, 'lower bound on IS weights; null = 1/upper')
    rollout_is_level: str = key('token', 'IS aggregation level: token | sequence | geometric',
        choices=('token', 'sequence', 'geometric'))
    rollout_is_mode: str = key('truncate', 'IS bound mode: truncate | mask', choices=('truncate', 'mask'))
    rollout_is_veto_threshold: float = key(0.0001, 'veto a sequence whose token ratio falls below this')
    use_torch_compile: bool = key(True, "use torch.compile for the actor's hot functions",
        no_effect_on_cpu='on CUDA the log-prob/entropy functions are torch.compile-d (with fsdp_config.use_torch_compile also '
                         'True); on CPU they run eagerly, logged once: '
                         'compiling costs more than it saves on a few cores',
)
    kl_loss_coef: float = key(0.001, 'coefficient of the KL loss')
    kl_loss_type: str = key('low_var_kl',
        "KL estimator for the KL loss: kl|k1|abs|mse|k2|low_var_kl|k3|full, with optional '+' suffix",
        choices=('kl', 'k1', 'abs', 'mse', 'k2', 'low_var_kl', 'k3', 'full', 'kl+', 'k1+', 'abs+', 'mse+', 'k2+', 'low_var_kl+', 'k3+'))
    ppo_epochs: int = key(1, 'passes over the batch per PPO step')
    data_loader_seed: Optional[int] = key(None, 'seed of the mini-batch shuffling; null = unseeded',
        verl_default=42, differs="the reference's default (null = unseeded shuffling)")
    shuffle: bool = key(False, 'reshuffle mini-batches every epoch')
    freeze_vision_tower: bool = key(False,
        'freeze the vision encoder of a vision-language model (multimodal only; default only)',
        why='multimodal models, which we do not have yet')
    use_fused_kernels: bool = key('${actor_rollout_ref.model.use_fused_kernels}',
        'copy of model.use_fused_kernels read by the actor (default only)', only=(False,), why='fused kernels')
    use_remove_padding: bool = key('${actor_rollout_ref.model.use_remove_padding}',
        'copy of model.use_remove_padding read by the actor',
        no_effect_yet="verl 0.9.1 reads it nowhere (verl/workers/engine_workers.py gives the engine "
                      "actor_rollout_ref.model.use_remove_padding); the workers here read that key too, which this "
                      "copy follows by default",
)
    ulysses_sequence_parallel_size: int = key(1,
        "Ulysses sequence-parallel size: ranks that split each packed micro-batch's tokens (1 = off; needs "
        "use_remove_padding; docs/PARALLELISM.md)")
    # verl 0.9: actor
    rollout_n: int = key('${actor_rollout_ref.rollout.n}', 'responses per prompt (mirrors rollout.n)',
        no_effect_yet="verl 0.9.1 only asserts it is set (ActorConfig, verl/workers/config/actor.py) and takes the "
                      "responses per prompt from actor_rollout_ref.rollout.n (verl/trainer/ppo/ray_trainer.py), as "
                      "the trainer does here; this copy follows it by default")
    loss_scale_factor: Optional[float] = key(None,
        'seq-mean-token-sum-norm: divide the sequence-mean of the summed token losses (policy, entropy and KL '
        'terms) by this constant instead of the response length; null = the padded response length (the width '
        'of the loss mask); other loss_agg_modes ignore it')
    calculate_entropy: bool = key(False, 'compute the entropy in the update even when entropy_coeff is 0, for the '
        'actor/entropy_loss metric (no gradient flows through it then)')
    use_prefix_grouper: bool = key(False, "verl's prefix-grouped forward: the actor's (and reference's) log-prob and "
        'update passes run each uid group (the rollout.n responses of a prompt) as one sequence, the prompt once, '
        'with a block attention mask; the same log-probs and gradients. Needs model.use_remove_padding=False; with '
        'dynamic bsz, actor.shuffle or sizes that cut groups each piece of a group runs its prompt once (exact, '
        'less saving)')
    entropy_from_logits_chunk_size: int = key(2048, 'rows per chunk with entropy_from_logits_with_chunking')
    pad_to_length: bool = key(False, PAD_TO_LENGTH)
    qat: QATConfig = section(QATConfig, 'quantization-aware training (not supported)')
    policy_loss: ActorPolicyLossConfig = section(ActorPolicyLossConfig)
    optim: ActorOptimConfig = section(ActorOptimConfig)
    fsdp_config: ActorFSDPConfig = section(ActorFSDPConfig)
    checkpoint: ActorCheckpointConfig = section(ActorCheckpointConfig)
    profiler: ProfilerConfig = section(ProfilerConfig)

    def __post_init__(self) -> None:
        # verl 0.9: policy losses (sapo's gate divides by τ)
        errors = []
        policy_loss = self.policy_loss  # a dict while the classes' defaults are loaded, a section when checked
        mode = policy_loss.get("loss_mode") if isinstance(policy_loss, dict) else policy_loss.loss_mode
        if mode == "sapo":
            for key in ("tau_pos", "tau_neg"):
                value = getattr(self, key)
                if number(value) and value <= 0:
                    errors.append(f"{{section}}.{key}={value} must be > 0 with policy_loss.loss_mode=sapo.")
        check_section(errors)


@dataclass
class RefFSDPConfig(FSDPEngine09):
    """``actor_rollout_ref.ref.fsdp_config``."""

    param_offload: bool = key(False, 'offload reference parameters to CPU',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    reshard_after_forward: bool = key(True, 'reshard parameters after forward (FSDP2)')
    forward_prefetch: bool = key(False, "prefetch the next layer's all-gather in forward (FSDP2 "
        "set_modules_to_forward_prefetch, depth 1, as verl's FSDP2 path; the same outputs)")
    model_dtype: str = key('fp32', 'dtype of the reference parameters: fp32 | bf16 | fp16',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16'))
    mixed_precision: MixedPrecisionConfig = section(MixedPrecisionConfig)
    wrap_policy: WrapPolicyConfig = section(WrapPolicyConfig)
    optimizer_offload: bool = key(False, 'offload optimizer state to CPU (the reference has none)',
        no_effect_on_cpu='like param_offload for the reference (it has no optimizer): CPUOffloadPolicy on CUDA; on CPU the '
                         'weights already live in host memory',
)
    offload_policy: bool = key(False, 'FSDP2 CPU offload policy',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    fsdp_size: int = key(-1, 'FSDP shard group size; -1 = all workers')
    use_orig_params: bool = key(False, 'FSDP1 flat-parameter option (FSDP2 has no flat parameters)',
        no_effect_yet=USE_ORIG_PARAMS)
    ulysses_sequence_parallel_size: int = key(1,
        "new-engine copy of the Ulysses sequence-parallel size (read when the role's own key is 1)")
    entropy_from_logits_with_chunking: bool = key('${actor_rollout_ref.ref.entropy_from_logits_with_chunking}',
        'new-engine copy of entropy_from_logits_with_chunking', no_effect_yet=REF_NO_ENTROPY)
    use_torch_compile: bool = key(True, 'new-engine copy of use_torch_compile (False: no torch.compile)',
        no_effect_on_cpu=ENGINE_COMPILE)
    entropy_checkpointing: bool = key('${actor_rollout_ref.ref.entropy_checkpointing}',
        'new-engine copy of entropy_checkpointing', no_effect_yet=REF_NO_ENTROPY)
    forward_only: bool = key(True, 'new engine: build the reference for forward passes only',
        no_effect_yet="with False verl 0.9.1's FSDP engine (verl/workers/engine/fsdp/transformer_impl.py) also builds "
                      "an optimizer for the reference, never stepped (memory only); the reference here never builds "
                      "one, and its parameters' dtype is model_dtype's either way")
    strategy: str = key('fsdp', 'new-engine copy of the backend: fsdp | fsdp2', only=('fsdp', 'fsdp2'),
        why='only FSDP backends; Megatron is a backend this project does not have')

    entropy_from_logits_chunk_size: int = key('${actor_rollout_ref.ref.entropy_from_logits_chunk_size}',
        'new-engine copy of entropy_from_logits_chunk_size', no_effect_yet=REF_NO_ENTROPY)
    pad_to_length: bool = key('${actor_rollout_ref.ref.pad_to_length}',
        "new-engine copy of the reference's pad_to_length (the reference reads this copy, which follows its key)")
    use_no_sync_for_gradient_accumulation: bool = key(False,
        'skip the gradient reduce-scatter on all but the last micro-batch',
        no_effect_yet='the reference computes no gradients (it is never trained; verl 0.9.1 reads the key in its '
                      'training step only, verl/workers/engine/fsdp/transformer_impl.py)')
    pad_to_length_bucket: int = key('${actor_rollout_ref.actor.fsdp_config.pad_to_length_bucket}',
        "new engine: bucket padding of packed sequences (follows the actor's)")

@dataclass
class RefConfig:
    """``actor_rollout_ref.ref``."""

    strategy: str = key('${actor_rollout_ref.actor.strategy}', 'backend of the reference model',
        only=('fsdp', 'fsdp2'), why='only FSDP backends; Megatron is a backend this project does not have')
    fsdp_config: RefFSDPConfig = section(RefFSDPConfig)
    use_torch_compile: bool = key('${actor_rollout_ref.actor.use_torch_compile}',
        "use torch.compile for the reference's hot functions",
        no_effect_on_cpu='on CUDA the log-prob/entropy functions are torch.compile-d (with fsdp_config.use_torch_compile also '
                         'True); on CPU they run eagerly, logged once: '
                         'compiling costs more than it saves on a few cores',
)
    log_prob_micro_batch_size: Optional[int] = key(None,
        'deprecated global micro-batch for ref log-probs; divided by world size')
    log_prob_micro_batch_size_per_gpu: Optional[int] = key(16,
        'sequences per forward on one worker when computing ref log-probs',
        verl_default=None, differs="the reference's default")
    log_prob_use_dynamic_bsz: bool = key('${actor_rollout_ref.actor.use_dynamic_bsz}',
        'pack ref log-prob micro-batches by token budget')
    log_prob_max_token_len_per_gpu: int = key('${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}',
        'token budget per worker for ref log-probs')
    ulysses_sequence_parallel_size: int = key('${actor_rollout_ref.actor.ulysses_sequence_parallel_size}',
        'Ulysses sequence-parallel size of the reference (its log-prob forward; docs/PARALLELISM.md)')
    model: Any = key(None, "model config of the reference for verl's new engine; null = the actor's model",
        why="a separate reference model config (verl's new engine workers); the reference is built from "
            "actor_rollout_ref.model",
)
    entropy_from_logits_with_chunking: bool = key(False, 'compute entropy from logits in chunks to save memory',
        no_effect_yet=REF_NO_ENTROPY)
    entropy_checkpointing: bool = key(False, 'recompute entropy in backward instead of storing activations',
        no_effect_yet="the reference computes no gradients (and its log-prob pass no entropy)")
    # verl 0.9: reference
    rollout_n: int = key('${actor_rollout_ref.rollout.n}', 'responses per prompt (mirrors rollout.n)',
        no_effect_yet="verl 0.9.1 only asserts it is set (ActorConfig, verl/workers/config/actor.py) and takes the "
                      "responses per prompt from actor_rollout_ref.rollout.n (verl/trainer/ppo/ray_trainer.py), as "
                      "the trainer does here; this copy follows it by default")
    entropy_from_logits_chunk_size: int = key(2048, 'rows per chunk when entropy is computed in chunks',
        no_effect_yet=REF_NO_ENTROPY)
    pad_to_length: bool = key('${actor_rollout_ref.actor.pad_to_length}', PAD_TO_LENGTH + " (follows the actor's)")
    profiler: ProfilerConfig = section(ProfilerConfig)
