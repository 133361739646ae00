"""verl 0.9's ``reward`` section (verl ``RewardConfig``): the keys that are new in 0.9.

verl 0.9 moved the reward settings of 0.6 under ``reward.*``. Where a 0.9 key means what a 0.6 key means, it is that
key's alias (declared on the 0.6 key, which stays the spelling of the reference): ``reward.custom_reward_function.*``
→ ``custom_reward_function.*``, ``reward.reward_manager.name`` → ``reward_model.reward_manager``,
``reward.reward_model.{enable,enable_resource_pool,n_gpus_per_node,nnodes}`` → ``reward_model.*``,
``reward.reward_model.model_path`` → ``reward_model.model.path``, ``reward.sandbox_fusion.*`` →
``reward_model.sandbox_fusion.*``. The keys below have no 0.6 counterpart.
"""

from dataclasses import dataclass
from typing import Optional

from rlhf_core.config.schemas.sections09_engines import RewardRewardModelConfig
from rlhf_core.config.spec import check_section, key, section


# verl 0.9: reward section
@dataclass
class RewardManagerModuleConfig:
    """``reward.reward_manager.module``."""

    path: Optional[str] = key(None, 'python file (or pkg://module) holding the reward manager class, with '
                              'reward.reward_manager.source=importlib')
    name: str = key('custom_reward_manager', 'module name the file is imported as')


@dataclass
class RewardManagerConfig:
    """``reward.reward_manager`` (its ``name`` is the alias of ``reward_model.reward_manager``)."""

    source: str = key('register', 'where reward_model.reward_manager is looked up: register (the registry of '
                      'reward managers) | importlib (a class of that name in reward.reward_manager.module.path)',
                      choices=('register', 'importlib'))
    module: RewardManagerModuleConfig = section(RewardManagerModuleConfig)

    def __post_init__(self) -> None:
        module = self.module if isinstance(self.module, dict) else vars(self.module)  # a dict when checked
        bad = self.source == "importlib" and not module.get("path")
        check_section(["{section}.source=importlib needs {section}.module.path (the file holding the class)."]
                      if bad else [])


@dataclass
class RewardConfig:
    """``reward`` (verl 0.9)."""

    num_workers: int = key(8, 'worker processes of the remote reward manager (each scores samples in turn)')
    reward_manager: RewardManagerConfig = section(RewardManagerConfig)
    reward_model: RewardRewardModelConfig = section(RewardRewardModelConfig)
    # read by the rate_limited reward manager (verl reads them from reward.* though its YAML does not list them)
    max_concurrent: int = key(1, 'rate_limited: reward calls running at once')
    max_rpm: Optional[int] = key(None, 'rate_limited: reward calls started per minute; null = no limit')
    max_tpm: Optional[int] = key(None, 'rate_limited: tokens per minute (estimated_tokens_per_request per call); '
                                 'null = no limit')
    estimated_tokens_per_request: int = key(2000, 'rate_limited: tokens one reward call is counted as (max_tpm)')
    timeout: float = key(300.0, 'rate_limited: seconds one reward call may take; past it the sample scores 0')

    def __post_init__(self) -> None:
        errors = []
        if self.num_workers < 1:
            errors.append(f"{{section}}.num_workers={self.num_workers} must be >= 1.")
        if self.max_concurrent < 1:
            errors.append(f"{{section}}.max_concurrent={self.max_concurrent} must be >= 1.")
        for name in ("max_rpm", "max_tpm"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                errors.append(f"{{section}}.{name}={value} must be > 0 (or null = no limit).")
        if self.estimated_tokens_per_request <= 0 or self.timeout <= 0:
            errors.append(f"{{section}}.estimated_tokens_per_request={self.estimated_tokens_per_request} and "
                          f"{{section}}.timeout={self.timeout} must be > 0.")
        check_section(errors)
