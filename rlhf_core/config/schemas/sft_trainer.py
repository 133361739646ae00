"""sft_trainer.yaml: supervised fine-tuning (verl's ``fsdp_sft_trainer`` config).

Generated once from the YAML; now the one source of these keys (see rlhf_core/config/spec.py). Edit here, then
run `python -m rlhf_core.config.gen_yaml` to rewrite rlhf_core/configs/*.yaml and docs/CONFIG_KEYS.md.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from rlhf_core.config.spec import check_section, free_form, free_form_or_null, key, number, section, trainer_errors

from .sft_engine import (EngineConfig, SftFusedKernelOptionsConfig, SftLoraConfig, SftMtpConfig, SftProfilerConfig,
                         SftTiledMlpConfig)

# The comment lines at the top of the generated YAML file.
YAML_HEADER = (
    'sft_trainer.yaml — supervised fine-tuning (FSDP backend), verl fsdp_sft_trainer.yaml keys and defaults.',
    "Every key has a one-line comment above it; docs/CONFIG_KEYS.md lists each key's status.",
    'Generated from rlhf_core/config/schemas/ by `python -m rlhf_core.config.gen_yaml`: edit the classes, not this file.',
)


@dataclass
class DataMultiturnConfig:
    """``data.multiturn``."""

    enable: bool = key(False, 'train on multi-turn message lists instead of prompt/response columns')
    messages_key: str = key('messages', 'column holding the message list', aliases=('data.messages_key',))
    tools_key: str = key('tools', "column holding the row's tool schemas (passed to the chat template as tools)",
        aliases=('data.tools_key',))
    enable_thinking_key: str = key('enable_thinking',
        "column holding the row's enable_thinking flag (passed to the chat template)",
        aliases=('data.enable_thinking_key',))


@dataclass
class DataCustomClsConfig:
    """``data.custom_cls``."""

    path: Optional[str] = key(None, 'file holding a custom torch Dataset subclass; null = built-in SFTDataset')
    name: Optional[str] = key(None, 'name of the class inside that file')


@dataclass
class DataConfig:
    """``data``."""

    train_batch_size: int = key(256, 'samples per optimizer step (global)')
    micro_batch_size: Optional[int] = key(None,
        'deprecated global micro-batch; divided by world size into micro_batch_size_per_gpu')
    micro_batch_size_per_gpu: Optional[int] = key(4,
        'samples per forward/backward on one worker (gradient accumulation)')
    train_files: Any = key('~/data/gsm8k/train.parquet', 'training parquet file(s)', types=(str, list,))
    val_files: Any = key('~/data/gsm8k/test.parquet', 'validation parquet file(s)', types=(str, list,), null_ok=True)
    train_max_samples: int = key(-1, 'use the first N training rows; -1 = all (verl 0.9)')
    val_max_samples: int = key(-1, 'use the first N validation rows; -1 = all (verl 0.9)')
    prompt_key: str = key('question', 'column holding the prompt')
    response_key: str = key('answer', 'column holding the response')
    prompt_dict_keys: Any = key(None, 'nested keys inside the prompt column; null = the column is the text',
        types=(list, str,))
    response_dict_keys: Any = key(None, 'nested keys inside the response column; null = the column is the text',
        types=(list, str,))
    multiturn: DataMultiturnConfig = section(DataMultiturnConfig)
    max_length: int = key(1024, 'max tokens of prompt + response')
    truncation: str = key('error', 'what to do with an over-long sample: error | left | right',
        choices=('error', 'left', 'right'))
    balance_dp_token: bool = key(False, 'balance tokens across data-parallel ranks',
        no_effect_yet="verl 0.9.1 declares it without code (sft_trainer_engine.yaml: 'to be implement'; no "
                      'python file reads it); trainer.balance_batch balances the tokens of the ranks')
    chat_template: Optional[str] = key(None, "chat template (Jinja text) to use; null = the tokenizer's",
        aliases=('model.custom_chat_template',))
    custom_cls: DataCustomClsConfig = section(DataCustomClsConfig)
    use_shm: bool = key(False, 'load data through shared memory (/dev/shm)', why='shared-memory data loading')
    apply_chat_template_kwargs: Dict[str, Any] = free_form('extra keyword arguments for tokenizer.apply_chat_template (e.g. enable_thinking)')
    # verl 0.9: engine SFT (--config-name sft_trainer_engine gives verl 0.9.1's defaults: True / no_padding)
    use_dynamic_bsz: bool = key(False,
        'micro-batches packed by token budget (max_token_len_per_gpu) instead of micro_batch_size_per_gpu rows')
    max_token_len_per_gpu: int = key(8192, 'valid tokens per micro-batch on one worker when use_dynamic_bsz')
    enable_thinking_default: Any = key('none',
        'enable_thinking for rows without the enable_thinking_key column: true | false | none (not passed; verl '
        "passes bool('none'), i.e. true)",
        types=(str, bool), null_ok=True)
    pad_mode: str = key('right', 'right: padded rows in the forward; no_padding: rows packed without padding '
        '(as use_remove_padding)', choices=('right', 'no_padding'))
    num_workers: int = key(0, 'dataloader worker processes reading the samples (0 = in the driver process)',
        verl_default=8, differs='on CPU the worker processes take cores from the training threads: a tiny-model SFT '
        'run took 132 s with 8 and 93 s with 0 (same loss)')
    ignore_input_ids_mismatch: bool = key(False,
        'multi-turn: accept a chat template that re-renders earlier turns (token ids built turn by turn)')


@dataclass
class ModelFsdpConfigWrapPolicyConfig:
    """``model.fsdp_config.wrap_policy``."""

    min_num_params: int = key(0, 'wrap modules with at least this many parameters; 0 = by decoder layer',
        aliases=('engine.wrap_policy.min_num_params',))


@dataclass
class ModelFsdpConfigConfig:
    """``model.fsdp_config``."""

    model_dtype: str = key('fp32', 'dtype of the trained parameters: bf16 | fp16 | fp32',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16'), aliases=('engine.model_dtype',))
    wrap_policy: ModelFsdpConfigWrapPolicyConfig = section(ModelFsdpConfigWrapPolicyConfig)
    cpu_offload: bool = key(False, 'enable FSDP CPU offload',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    offload_params: bool = key(False, 'offload parameters (and gradients; optimizer steps on CPU) when cpu_offload',
        no_effect_on_cpu='CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory')
    cpu_threads: Optional[int] = key(None,
        "intra-op CPU threads of each rank on Ray; null = the node's CPUs ÷ its ranks", ours=True)


@dataclass
class ModelConfig:
    """``model``."""

    partial_pretrain: str = key('~/models/gemma-1.1-7b-it', 'Hugging Face model to fine-tune (local, hdfs:// or s3://)',
        aliases=('model.path',))
    use_shm: bool = key(False, 'load the model through shared memory (/dev/shm; default only)',
        why='shared-memory model loading')
    strategy: str = key('fsdp2', 'FSDP implementation: fsdp | fsdp2', only=('fsdp', 'fsdp2'),
        why='only FSDP backends; Megatron is a backend this project does not have', aliases=('engine.strategy',))
    fsdp_config: ModelFsdpConfigConfig = section(ModelFsdpConfigConfig)
    external_lib: Optional[str] = key(None, 'python module to import first (registers custom models)')
    enable_gradient_checkpointing: bool = key(False, 'activation (gradient) checkpointing')
    trust_remote_code: bool = key(False, 'allow remote code when loading the model')
    lora_rank: int = key(0, 'LoRA rank; 0 = full fine-tuning')
    lora_alpha: int = key(16, 'LoRA scaling alpha')
    target_modules: Any = key('all-linear', 'modules that get LoRA adapters', types=(str, list,))
    use_liger: bool = key(False, 'verl: apply Liger kernels (GPU); not shipped here: only False', only=(False,),
        why='Liger kernels: GPU-only Triton kernels that this project does not ship')
    # verl 0.9: engine SFT
    hf_config_path: Optional[str] = key(None, 'folder holding the HF config.json; null = model.path')
    tokenizer_path: Optional[str] = key(None, 'tokenizer folder; null = model.path')
    override_config: Dict[str, Any] = free_form("overrides of the model's HF config (fields directly or under "
        "model_config)")
    enable_activation_offload: bool = key(False, 'offload activations to CPU',
        no_effect_on_cpu='on CUDA the training forward runs under save_on_cpu(pin_memory=True); on CPU activations '
                         'already live in host memory')
    exclude_modules: Optional[Any] = key(None, 'module names that never get LoRA adapters (a regex string or a list '
        'of names / name suffixes); null = none', types=(str, list))
    lora_adapter_path: Optional[str] = key(None, 'a saved PEFT LoRA adapter to continue training from (its rank, '
        'alpha and modules must match lora_rank, lora_alpha and target_modules); null = fresh adapters')
    use_fused_kernels: bool = key(False, 'fused log-prob kernels from hidden states', why='fused kernels')
    fused_kernel_options: SftFusedKernelOptionsConfig = section(SftFusedKernelOptionsConfig)
    tiled_mlp: SftTiledMlpConfig = section(SftTiledMlpConfig)
    mtp: SftMtpConfig = section(SftMtpConfig)
    lora: SftLoraConfig = section(SftLoraConfig)


@dataclass
class OptimConfig:
    """``optim``."""

    lr: float = key(1e-05, 'peak learning rate')
    betas: List[float] = key([0.9, 0.95], 'AdamW betas')
    eps: float = key(1e-08, "AdamW epsilon (torch's default; the actor's optim.eps)", ours=True)
    weight_decay: float = key(0.01, 'AdamW weight decay')
    warmup_steps_ratio: float = key(0.1, 'warmup steps as a fraction of total steps',
        aliases=('optim.lr_warmup_steps_ratio',))
    clip_grad: float = key(1.0, 'clip the global gradient norm to this value')
    lr_scheduler: str = key('cosine', 'scheduler after warmup: constant | cosine | wsd',
        choices=('constant', 'cosine', 'wsd'), aliases=('optim.lr_scheduler_type',))
    min_lr_ratio: float = key(0.0, 'final lr as a fraction of lr (cosine and wsd)', ours=True)
    stable_ratio: float = key(0.9,
        "wsd: fraction of the post-warmup steps held at the peak lr (verl's function default)", ours=True)
    # verl 0.9: engine SFT
    optimizer: str = key('AdamW', 'optimizer class name: AdamW, Adam, SGD, RMSprop (torch.optim; betas go to the '
        'Adam family only)', choices=('AdamW', 'Adam', 'SGD', 'RMSprop'))
    optimizer_impl: str = key('torch.optim', 'module of the optimizer class', only=('torch.optim',),
        why='other optimizer modules (torch.optim only)')
    total_training_steps: int = key(-1, 'total optimizer steps; -1 = set by the trainer',
        no_effect_yet="the LR schedule spans trainer.total_training_steps (or batches x total_epochs), as in verl "
                      "0.9.1, whose SFT trainer (verl/trainer/sft_trainer.py) overwrites this key with that number; "
                      'set trainer.total_training_steps')
    lr_warmup_steps: int = key(-1, 'warmup steps; negative = warmup_steps_ratio x total steps')
    num_cycles: float = key(0.5, 'cosine: number of cosine cycles (0.5 = one fall from lr to min_lr_ratio x lr)')
    zero_indexed_step: bool = key(True, 'the cosine schedule counts updates from 0; False: from 1 (its multiplier '
        'at update s is the one of s + 1; constant and wsd ignore it, as verl)')
    warmup_style: Optional[str] = key(None, 'deprecated spelling of lr_scheduler; null = lr_scheduler',
        choices=('constant', 'cosine', 'wsd'))
    override_optimizer_config: Optional[Dict[str, Any]] = free_form_or_null('extra optimizer keyword arguments, '
        'applied last (e.g. {amsgrad: true}); a keyword the optimizer does not take fails the build')

    def __post_init__(self) -> None:
        check_section([f"{{section}}.{key}={getattr(self, key)} must lie in [0, 1]."
                       for key in ("warmup_steps_ratio", "min_lr_ratio", "stable_ratio")
                       if number(getattr(self, key)) and not 0.0 <= getattr(self, key) <= 1.0])


@dataclass
class TrainerCheckpointConfig:
    """``trainer.checkpoint``."""

    save_contents: List[str] = key(['model', 'optimizer', 'extra'], 'what to save: model, optimizer, extra, hf_model',
        item_choices=('model', 'optimizer', 'extra', 'hf_model'), aliases=('checkpoint.save_contents',))
    load_contents: List[str] = key('${trainer.checkpoint.save_contents}', 'what to load when resuming',
        item_choices=('model', 'optimizer', 'extra', 'hf_model'), aliases=('checkpoint.load_contents',))


@dataclass
class TrainerConfig:
    """``trainer``."""

    default_local_dir: str = key('checkpoints/${trainer.project_name}/${trainer.experiment_name}',
        'local checkpoint folder')
    default_hdfs_dir: Optional[str] = key(None, 'HDFS folder to copy checkpoints to; null = none')
    project_name: str = key('gsm8k-sft', 'project name for the loggers')
    experiment_name: str = key('test', 'run name for the loggers')
    total_epochs: int = key(4, 'passes over the training data')
    total_training_steps: Optional[int] = key(None, 'total steps; null = len(dataloader) x total_epochs')
    logger: Any = key(['console', 'wandb'],
        'metric sinks: console, mlflow, tensorboard, file, wandb, swanlab, trackio', types=(list, str,),
        item_choices=('console', 'mlflow', 'tensorboard', 'file', 'wandb', 'swanlab', 'trackio'))
    seed: int = key(1, 'random seed')
    save_freq: Any = key(-1, 'save a checkpoint every N steps; -1 = only at the end; after_each_epoch',
        types=(int, str))
    test_freq: Any = key(-1, 'validate every N steps; -1 = only at the end; after_each_epoch', types=(int, str))
    nnodes: int = key(1, 'nodes used for training')
    n_gpus_per_node: int = key(8, 'workers (GPUs, or CPU slots) per node')
    max_ckpt_to_keep: Optional[int] = key(None, 'keep at most this many checkpoints; null = all')
    resume_mode: str = key('auto', 'resume: auto | disable | resume_path', choices=('auto', 'disable', 'resume_path'))
    resume_from_path: Optional[str] = key(None, 'checkpoint to resume from when resume_mode=resume_path')
    checkpoint: TrainerCheckpointConfig = section(TrainerCheckpointConfig)
    device: str = key('auto', 'device: auto (cuda if available else cpu) | cuda | cpu',
        choices=('auto', 'cpu', 'cuda'), ours=True)
    # verl 0.9: engine SFT
    balance_batch: bool = key(True, "reorder each global batch's rows so ranks get similar token counts")
    profile_interval: List[int] = key([-1, -1], 'first and last step profiled (one trace, with profiler.enable); '
        '[-1, -1] = none')

    def __post_init__(self) -> None:
        errors = trainer_errors(self)
        interval = self.profile_interval
        if isinstance(interval, (list, tuple)) and (len(interval) != 2 or interval[1] < interval[0]
                                                    or (interval[0] < 0 <= interval[1])):
            errors.append(f"{{section}}.profile_interval={list(interval)} must be [first, last] steps with "
                          "first <= last, or [-1, -1] for none.")
        check_section(errors)


@dataclass
class RayInitConfig:
    """``ray_init``."""

    address: Optional[str] = key(None,
        'Ray address: null = embedded local instance; auto or ray://host:port = existing cluster', ours=True)
    num_cpus: Optional[int] = key(None, "CPUs of the embedded local Ray instance; null = all of this machine's",
        ours=True)


@dataclass
class SFTTrainerConfig:
    """the root of sft_trainer.yaml."""

    data: DataConfig = section(DataConfig)
    model: ModelConfig = section(ModelConfig)
    optim: OptimConfig = section(OptimConfig)
    ulysses_sequence_parallel_size: int = key(1,
        "Ulysses sequence-parallel size: ranks that split each packed micro-batch's tokens (1 = off; needs "
        "use_remove_padding or data.pad_mode=no_padding; docs/PARALLELISM.md)",
        aliases=('engine.ulysses_sequence_parallel_size',))
    use_remove_padding: bool = key(False, 'unpad sequences before the forward pass',
        aliases=('model.use_remove_padding',))
    # verl 0.9: engine SFT
    engine: EngineConfig = section(EngineConfig, "verl 0.9's FSDP engine settings")
    profiler: SftProfilerConfig = section(SftProfilerConfig, 'profiler of the SFT steps')
    trainer: TrainerConfig = section(TrainerConfig)
    ray_init: RayInitConfig = section(RayInitConfig)
