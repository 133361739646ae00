"""Sections verl 0.9 added to every FSDP role and model (``actor_rollout_ref.actor.fsdp_config``, ``.ref.fsdp_config``,
``critic.fsdp``; ``actor_rollout_ref.model``, ``critic.model``): verl's ``FSDPEngineConfig`` and ``HFModelConfig``
fields that 0.6 did not have, shared here instead of copied per role.

Keys of backends we do not have (quantization-aware training, the fsdp_turbo engine, Megatron's LoRA, multi-token
prediction) are accepted at their defaults only and their error names the backend.
"""

from dataclasses import dataclass
from typing import List, Optional

from rlhf_core.config.spec import key, section

QAT = 'quantization-aware training (QAT), which this project does not have'
TURBO = "verl's fsdp_turbo engine, a backend this project does not have"
MTP = 'multi-token prediction (MTP) and speculative decoding, which this project does not have'
CRITIC_NO_ENTROPY = ("the critic computes values, no entropy, as verl 0.9.1's value-head forward "
                     "(verl/workers/engine/fsdp/transformer_impl.py, calculate_entropy never set for the critic)")
# why an actor/critic fsdp_config.forward_only=True is refused (verl 0.9.1 cannot train that role either)
FORWARD_ONLY = ("verl 0.9.1's FSDP engine then builds no optimizer (verl/workers/engine/fsdp/transformer_impl.py) and "
                "its train_batch asserts (verl/workers/engine_workers.py): the role is trained, so only False")
USE_ORIG_PARAMS = ("FSDP2, the only FSDP here, always keeps the original parameters (each a DTensor shard), as FSDP1 "
                   "did with True; FSDP1's flat parameters (False) cannot exist on FSDP2, so either value trains "
                   "the same")
PAD_TO_LENGTH = ("round every packed micro-batch up to a multiple of pad_to_length_bucket tokens (dummy sequences, "
                 "dropped before the loss; the same outputs): few distinct shapes for compiled/tuned kernels. Read "
                 "with use_remove_padding only, on the packed forward (on CPU a micro-batch whose prompts repeat "
                 "runs the shared-prefix path unpadded)")
MEGATRON_LORA = "Megatron's LoRA (this project's LoRA is set by model.lora_rank, lora_alpha, target_modules)"


@dataclass
class QATConfig:
    """``<role>.fsdp_config.qat`` and ``actor_rollout_ref.actor.qat``: quantization-aware training."""

    enable: bool = key(False, 'train with fake-quantized weights (QAT)', why=QAT)
    mode: str = key('w4a16', 'QAT: weight/activation bit widths, e.g. w4a16', why=QAT)
    group_size: int = key(16, 'QAT: weights per quantization group', why=QAT)
    ignore_patterns: List[str] = key(['lm_head', 'embed_tokens', 're:.*mlp.gate$'],
        'QAT: modules left unquantized (names, or re: patterns)', why=QAT)
    activation_observer: str = key('static_minmax', 'QAT: observer that sets activation scales', why=QAT)
    quantization_config_path: Optional[str] = key(None, 'QAT: a quantization config file; null = built from mode',
        why=QAT)


@dataclass
class TurboFSDPPlanConfig:
    """``<role>.fsdp_config.turbo_config.distributed.fsdp_plan``."""

    param_dtype: str = key('bf16', 'fsdp_turbo: parameter dtype in compute', why=TURBO)
    reduce_dtype: str = key('fp32', 'fsdp_turbo: gradient reduction dtype', why=TURBO)
    output_dtype: str = key('bf16', 'fsdp_turbo: dtype of module outputs', why=TURBO)
    fsdp_implementation: str = key('native', 'fsdp_turbo: sharding implementation', why=TURBO)
    num_to_forward_prefetch: int = key(1, 'fsdp_turbo: modules all-gathered ahead in forward', why=TURBO)
    num_to_backward_prefetch: int = key(1, 'fsdp_turbo: modules all-gathered ahead in backward', why=TURBO)


@dataclass
class TurboDistributedConfig:
    """``<role>.fsdp_config.turbo_config.distributed``."""

    fully_shard_parallel_size: int = key(16, 'fsdp_turbo: ranks one parameter is sharded over', why=TURBO)
    tensor_parallel_size: int = key(1, 'fsdp_turbo: tensor-parallel size', why=TURBO)
    expert_parallel_size: int = key(1, 'fsdp_turbo: expert-parallel size (MoE)', why=TURBO)
    expert_fully_shard_parallel_size: int = key(1, 'fsdp_turbo: shard size of expert parameters', why=TURBO)
    ulysses_parallel_size: int = key(1, 'fsdp_turbo: Ulysses sequence-parallel size', why=TURBO)
    fsdp_plan: TurboFSDPPlanConfig = section(TurboFSDPPlanConfig)


@dataclass
class TurboConfig:
    """``<role>.fsdp_config.turbo_config``: read only with strategy fsdp_turbo."""

    distributed: TurboDistributedConfig = section(TurboDistributedConfig)


@dataclass
class FSDPEngine09:
    """The keys verl 0.9's ``FSDPEngineConfig`` added, shared by the actor, reference and critic FSDP sections
    (each role's class inherits them and overrides the defaults that follow a role key)."""

    # verl 0.9: FSDP engine
    seed: int = key(42, "with full_determinism: the seed of every RNG while this role's model is built (a LoRA "
        "adapter's initialisation); read only with full_determinism, as in verl 0.9's FSDP engine")
    full_determinism: bool = key(False, "before this role's model is built: torch.use_deterministic_algorithms("
        "warn_only), cuDNN deterministic, the cuBLAS/flash-attention/NCCL deterministic environment and RNGs seeded "
        "with seed (verl 0.9's enable_full_determinism); process-wide, for debugging")
    entropy_from_logits_chunk_size: int = key(2048, 'new-engine copy of entropy_from_logits_chunk_size',
        no_effect_yet=CRITIC_NO_ENTROPY + '; the actor and reference override this copy')
    use_no_sync_for_gradient_accumulation: bool = key(False,
        "skip FSDP2's gradient reduce-scatter on all but a mini-batch's last micro-batch "
        "(set_requires_gradient_sync, as verl 0.9's engine): the same update, one reduction per step, the unsharded "
        "gradients held meanwhile")
    pad_to_length: bool = key(False, PAD_TO_LENGTH)
    pad_to_length_bucket: int = key(1024, 'pad_to_length: tokens per bucket; a packed micro-batch is rounded up to a '
        'multiple of it')
    dtype: str = key('bfloat16', "new engine: mixed-precision dtype: bfloat16 | float16 (checked, as verl does)",
        choices=('bfloat16', 'float16'),
        no_effect_yet="verl 0.9.1 checks it (FSDPEngineConfig, verl/workers/config/engine.py) and reads it nowhere: "
                      "mixed_precision.param_dtype decides the compute dtype and model_dtype the stored parameters, "
                      "here as there")
    qat: QATConfig = section(QATConfig, 'quantization-aware training (not supported)')
    turbo_config: TurboConfig = section(TurboConfig, 'fsdp_turbo engine options (not supported)')


@dataclass
class TiledMLPConfig:
    """``<model>.tiled_mlp``: run the MLP over sequence tiles to cut activation memory."""

    enabled: bool = key(False, 'compute the MLP in sequence tiles (lower peak memory, same result)')
    num_shards: int = key(4, 'tiled MLP: number of sequence tiles (read with tiled_mlp.enabled)')


@dataclass
class MTPConfig:
    """``<model>.mtp``: multi-token prediction heads, trained and used for speculative decoding."""

    enable: bool = key(False, 'load the multi-token-prediction layers of the model', why=MTP)
    enable_train: bool = key(False, 'MTP: train the MTP layers with the policy', why=MTP)
    enable_rollout: bool = key(False, 'MTP: use the MTP layers for speculative decoding in the rollout', why=MTP)
    detach_encoder: bool = key(False, 'MTP: stop gradients from the MTP loss into the trunk', why=MTP)
    mtp_loss_scaling_factor: float = key(0.1, 'MTP: weight of the MTP loss', why=MTP)
    speculative_algorithm: str = key('EAGLE', 'MTP (sglang): speculative decoding algorithm', why=MTP)
    speculative_num_steps: int = key(3, 'MTP (sglang): draft steps per verification', why=MTP)
    speculative_eagle_topk: int = key(1, 'MTP (sglang): EAGLE draft top-k', why=MTP)
    speculative_num_draft_tokens: int = key(4, 'MTP (sglang): draft tokens per verification', why=MTP)
    method: str = key('mtp', 'MTP (vllm): speculative method', why=MTP)
    num_speculative_tokens: int = key(1, 'MTP (vllm): tokens proposed per step', why=MTP)


@dataclass
class LoRA09Config:
    """``<model>.lora``: verl 0.9's LoRA section, read by its Megatron engine (PEFT LoRA here is model.lora_rank)."""

    type: str = key('lora', "Megatron LoRA: adapter type", why=MEGATRON_LORA)
    merge: bool = key(False, 'Megatron LoRA: merge adapters into the weights before the rollout', why=MEGATRON_LORA)
    rank: int = key(0, 'Megatron LoRA: rank; 0 = off', why=MEGATRON_LORA)
    alpha: int = key(32, 'Megatron LoRA: scaling alpha', why=MEGATRON_LORA)
    dropout: float = key(0.0, 'Megatron LoRA: dropout on the adapter input', why=MEGATRON_LORA)
    target_modules: List[str] = key(['linear_qkv', 'linear_proj', 'linear_fc1', 'linear_fc2'],
        'Megatron LoRA: Megatron module names that get adapters', why=MEGATRON_LORA)
    exclude_modules: List[str] = key([], 'Megatron LoRA: module names that never get adapters', why=MEGATRON_LORA)
    dropout_position: str = key('pre', 'Megatron LoRA: dropout before (pre) or after (post) the adapter',
        why=MEGATRON_LORA)
    lora_A_init_method: str = key('xavier', 'Megatron LoRA: init of the A matrix', why=MEGATRON_LORA)
    lora_B_init_method: str = key('zero', 'Megatron LoRA: init of the B matrix', why=MEGATRON_LORA)
    a2a_experimental: bool = key(False, 'Megatron LoRA: experimental all-to-all for expert adapters',
        why=MEGATRON_LORA)
    dtype: Optional[str] = key(None, "Megatron LoRA: adapter dtype; null = the model's", why=MEGATRON_LORA)
    adapter_path: Optional[str] = key(None, 'Megatron LoRA: adapter to load', why=MEGATRON_LORA)
    freeze_vision_model: bool = key(True, 'Megatron LoRA: freeze the vision tower', why=MEGATRON_LORA)
    freeze_vision_projection: bool = key(True, 'Megatron LoRA: freeze the vision projection', why=MEGATRON_LORA)
    freeze_language_model: bool = key(True, 'Megatron LoRA: freeze the language model besides its adapters',
        why=MEGATRON_LORA)


@dataclass
class Model09:
    """The keys verl 0.9's ``HFModelConfig`` added, shared by ``actor_rollout_ref.model`` and ``critic.model``."""

    # verl 0.9: model
    lora_adapter_path: Optional[str] = key(None, 'a saved PEFT LoRA adapter to start from (its rank, alpha and '
        'modules must match lora_rank, lora_alpha and target_modules); null = fresh adapters')
    tiled_mlp: TiledMLPConfig = section(TiledMLPConfig)
    mtp: MTPConfig = section(MTPConfig, 'multi-token prediction (not supported)')
    lora: LoRA09Config = section(LoRA09Config, "verl 0.9's LoRA section for Megatron (not supported)")


