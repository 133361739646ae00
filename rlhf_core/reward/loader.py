"""``load_reward_manager``: build the reward manager a ppo_trainer config asks for (verl ``load_reward_manager``)."""
from __future__ import annotations

from typing import Any

from rlhf_core.reward.custom import reward_function_from_config
from rlhf_core.reward.managers import get_reward_manager_cls
from rlhf_core.reward import dapo as _dapo  # noqa: F401  (registers "dapo")
from rlhf_core.reward import prime as _prime  # noqa: F401  (registers "prime")


def load_reward_manager(config: Any, tokenizer: Any, num_examine: int = 0, **kwargs: Any) -> Any:
    """The manager named by ``reward_model.reward_manager`` (default ``naive``).

    Args:
        config: the full ppo_trainer config (``DictConfig`` or nested dicts). Reads
            ``reward_model.reward_manager``, ``reward_model.reward_kwargs`` (optional; passed to the manager,
            e.g. ``timeout_s``/``num_processes`` for prime,
            ``max_resp_len``/``overlong_buffer_cfg`` for dapo), ``custom_reward_function.{path,name,reward_kwargs}``
            and ``data.reward_fn_key`` (default ``data_source``).
        tokenizer: anything with ``decode(ids, skip_special_tokens=True)``.
        num_examine: samples per data source to print on each call (verl: 0 for training, 1 for validation).
        **kwargs: extra manager arguments (override ``reward_kwargs``).

    Raises:
        ValueError: for an unknown manager name. FileNotFoundError / AttributeError from a bad custom function.
    """
    rm = config.reward_model
    manager_kwargs = {**dict(rm.reward_kwargs), **kwargs}
    return get_reward_manager_cls(str(rm.reward_manager))(
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=reward_function_from_config(config),
        reward_fn_key=str(config.data.reward_fn_key),
        **manager_kwargs,
    )
