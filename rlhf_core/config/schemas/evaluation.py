"""evaluation.yaml: score a responses parquet offline (verl's ``main_eval`` config).

Generated once from the YAML; now the one source of these keys (see rlhf_core/config/spec.py). Edit here, then
run `python -m rlhf_core.config.gen_yaml` to rewrite rlhf_core/configs/*.yaml and docs/CONFIG_KEYS.md.
"""

from dataclasses import dataclass
from typing import Optional

from rlhf_core.config.spec import key, section

# The comment lines at the top of the generated YAML file.
YAML_HEADER = (
    'evaluation.yaml — score a parquet of generated responses per data_source (verl keys + ours).',
    'Generated from rlhf_core/config/schemas/ by `python -m rlhf_core.config.gen_yaml`: edit the classes, not this file.',
)


@dataclass
class DataConfig:
    """``data``."""

    path: str = key('/tmp/math_Qwen2-7B-Instruct.parquet', 'parquet with the generated responses')
    prompt_key: str = key('prompt', 'column holding the prompt')
    response_key: str = key('responses', 'column holding the responses (a list of N strings per prompt)')
    data_source_key: str = key('data_source', 'column whose value groups the metrics (and selects the scorer)')
    reward_model_key: str = key('reward_model', 'column holding {style, ground_truth}')


@dataclass
class CustomRewardConfig:
    """``custom_reward_function``."""

    path: Optional[str] = key(None, 'file holding a custom reward function; null = built-in scorers')
    name: str = key('compute_score', 'name of the function in that file')


@dataclass
class OutputConfig:
    """``output``."""

    samples_dir: Optional[str] = key(None, 'folder for per-sample score parquet files; null = not written', ours=True)


@dataclass
class RayInitConfig:
    """``ray_init``."""

    num_cpus: Optional[int] = key(None, 'CPUs for an embedded Ray instance; null = all')
    address: Optional[str] = key(None,
        'Ray address: null = embedded local instance; auto or ray://host:port = existing cluster', ours=True)


@dataclass
class RayKwargsRayInitConfig:
    """``ray_kwargs.ray_init``."""

    num_cpus: Optional[int] = key(None, 'CPUs for an embedded Ray instance; null = all (alias of ray_init.num_cpus)',
        same_as='ray_init.num_cpus')


@dataclass
class RayKwargsConfig:
    """``ray_kwargs``."""

    ray_init: RayKwargsRayInitConfig = section(RayKwargsRayInitConfig)
    timeline_json_file: Optional[str] = key(None, "write the Ray timeline of the scoring tasks to this file (a "
        "chrome://tracing JSON) when they end; null = none", same_as='ray_init.timeline_json_file')


@dataclass
class EvaluationConfig:
    """the root of evaluation.yaml."""

    data: DataConfig = section(DataConfig)
    custom_reward_function: CustomRewardConfig = section(CustomRewardConfig)
    output: OutputConfig = section(OutputConfig)
    ray_init: RayInitConfig = section(RayInitConfig)
    ray_kwargs: RayKwargsConfig = section(RayKwargsConfig,
        'verl 0.6 spelling of the ray_init section; the two are aliases (set one, or both to the same value)')
