"""``data`` of ppo_trainer.yaml: the training and validation datasets (verl's data config).

Generated once from the YAML; now the one source of these keys (see rlhf_core/config/spec.py). Edit here, then
run `python -m rlhf_core.config.gen_yaml` to rewrite rlhf_core/configs/*.yaml and docs/CONFIG_KEYS.md.
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from rlhf_core.config.spec import check_section, free_form, key, section


@dataclass
class DataCustomClsConfig:
    """``data.custom_cls``."""

    path: Optional[str] = key(None, 'file holding a torch Dataset subclass; null = built-in RLHFDataset')
    name: Optional[str] = key(None, 'name of the class inside that file')

    def __post_init__(self) -> None:
        check_section([f"{{section}}.path={self.path!r} needs {{section}}.name, got null."]
                      if self.path and not self.name else [])


@dataclass
class DataSamplerConfig:
    """``data.sampler``."""

    class_path: Optional[str] = key(None,
        'file holding a custom (curriculum) sampler class; null = random or sequential sampling')
    class_name: Optional[str] = key(None, 'name of the sampler class inside that file')


@dataclass
class DataDatagenConfig:
    """``data.datagen``."""

    path: Optional[str] = key(None, 'file holding a dynamic data-generation dataset class; null = none')
    name: Optional[str] = key(None, 'name of that class inside the file')


@dataclass
class DataConfig:
    """``data``."""

    tokenizer: Optional[str] = key(None, "tokenizer path; null = use the actor model's tokenizer")
    train_files: Any = key('~/data/rlhf/gsm8k/train.parquet',
        'training parquet file(s): a path or a list; local, hdfs:// or s3://', types=(str, list,))
    val_files: Any = key('~/data/rlhf/gsm8k/test.parquet', 'validation parquet file(s): a path or a list',
        types=(str, list,), null_ok=True)
    train_max_samples: int = key(-1, 'max training rows to use; -1 = the whole dataset')
    val_max_samples: int = key(-1, 'max validation rows to use; -1 = the whole dataset')
    prompt_key: str = key('prompt', 'dataset column holding the prompt (a chat message list)')
    reward_fn_key: str = key('data_source', 'dataset column whose value selects the reward function (data_source)')
    max_prompt_length: int = key(512, 'prompts are left-padded to this many tokens')
    max_response_length: int = key(512, 'rollout generates at most this many response tokens')
    train_batch_size: int = key(1024, 'prompts sampled per training step')
    # verl 0.9: DAPO dynamic sampling
    gen_batch_size: Optional[int] = key(None,
        'prompts per generation round with algorithm.filter_groups.enable; null = data.train_batch_size')
    val_batch_size: Optional[int] = key(None,
        'prompts per validation batch (deprecated in verl); null = the whole validation set at once')
    return_raw_input_ids: bool = key(False,
        'also return un-templated prompt ids (reward model with another chat template)')
    return_raw_chat: bool = key(False, 'also return the raw chat message list',
        verl_default=True, differs="the reference's default")
    return_full_prompt: bool = key(False, 'also return the rendered prompt string (chat template applied)')
    shuffle: bool = key(True, 'shuffle the training dataloader')
    dataloader_num_workers: int = key(0, 'dataloader worker processes (0 = load in the main process)',
        verl_default=8, differs='ours: rows load in the trainer process; 8 loader processes cost more than they save on few-core machines')
    validation_shuffle: bool = key(False, 'shuffle the validation dataloader')
    seed: Optional[int] = key(42, 'seed for shuffling and sampling of max_samples subsets',
        verl_default=None, differs="the reference's default")
    filter_overlong_prompts: bool = key(False, 'drop prompts longer than max_prompt_length after chat templating')
    filter_overlong_prompts_workers: int = key(1, 'processes used to filter overlong prompts')
    truncation: str = key('error', 'what to do with an overlong prompt: error | left | right | middle',
        choices=('error', 'left', 'right', 'middle'))
    image_key: str = key('images', 'multimodal image column (multimodal not supported yet; default only)',
        why='multimodal data')
    video_key: str = key('videos', 'multimodal video column (multimodal not supported yet; default only)',
        why='multimodal models, which we do not have yet')
    use_shm: bool = key(False, 'load data through shared memory (/dev/shm; default only)',
        why='shared-memory data loading')
    return_multi_modal_inputs: bool = key(True,
        "return the processor's multimodal tensors with each row (multimodal only; default only)",
        why='multimodal models, which we do not have yet')
    trust_remote_code: bool = key(True,
        "allow remote code in the driver's tokenizer. True is the reference's default (kept, as for every "
        "reference key); the model keys (actor_rollout_ref.model / critic.model / reward_model.model) default"
        " to False",
        verl_default=False, differs="the reference's default")
    custom_cls: DataCustomClsConfig = section(DataCustomClsConfig, 'custom dataset class')
    sampler: DataSamplerConfig = section(DataSamplerConfig)
    datagen: DataDatagenConfig = section(DataDatagenConfig)
    apply_chat_template_kwargs: Dict[str, Any] = free_form('extra keyword arguments for tokenizer.apply_chat_template (e.g. enable_thinking)')
    # verl 0.9: data
    tool_config_path: Optional[str] = key('${actor_rollout_ref.rollout.multi_turn.tool_config_path}',
        "tool config whose schemas filter_overlong_prompts renders into each prompt's chat template when measuring "
        'it, as the agent loop will (follows rollout.multi_turn; verl 0.9.1 RLHFDataset)')
    function_tool_path: Optional[str] = key('${actor_rollout_ref.rollout.multi_turn.function_tool_path}',
        'python file of function tools, rendered like tool_config_path when filter_overlong_prompts measures a '
        'prompt (follows rollout.multi_turn)')
    image_patch_size: int = key(14, 'vision encoder patch size, for image token counts (multimodal only)',
        only=(14,), why='multimodal models, which we do not have yet')
    audio_key: str = key('audios', 'dataset column holding audio (multimodal only)', only=('audios',),
        why='multimodal models, which we do not have yet')
    mm_processor_kwargs: Dict[str, Any] = key({}, 'extra arguments of the multimodal processor (multimodal only)',
        why='multimodal models, which we do not have yet')
