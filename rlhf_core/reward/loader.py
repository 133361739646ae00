"""``load_reward_manager``: build the reward manager a ppo_trainer config asks for (verl ``load_reward_manager``)."""
from __future__ import annotations

from typing import Any

from rlhf_core.reward.custom import reward_function_from_config
from rlhf_core.reward.managers import REWARD_MANAGERS, get_reward_manager_cls
from rlhf_core.reward import dapo as _dapo  # noqa: F401  (registers "dapo")
from rlhf_core.reward import gdpo as _gdpo  # noqa: F401  (registers "gdpo")
from rlhf_core.reward import prime as _prime  # noqa: F401  (registers "prime")
from rlhf_core.reward import rate_limited as _rate_limited  # noqa: F401  (registers "rate_limited")
from rlhf_core.reward import remote as _remote  # noqa: F401  (registers "remote")
from rlhf_core.user_code import exec_user_file, resolve_user_file

MODULE_KEY = "reward.reward_manager.module.path"
LOOP_PATH_KEY = "reward_model.reward_loop_module_path"


def registered_reward_managers() -> list[str]:
    """The names ``reward_model.reward_manager`` accepts now: the built-in managers (naive, batch, prime, dapo,
    remote, rate_limited, gdpo: this module imports them, so their ``@register`` has run) and any registered since
    (sorted). Here, not in ``managers``: the built-in managers import ``managers``, so it cannot import them back."""
    return REWARD_MANAGERS.names()


def reward_manager_cls(config: Any) -> type:
    """The reward-manager class of ``config`` (verl 0.9 ``resolve_reward_manager_cls``): with
    ``reward.reward_manager.source=register`` the registered ``reward_model.reward_manager``; with ``importlib`` the
    class of that name in the file ``reward.reward_manager.module.path``, imported as ``module.name``.

    ``reward_model.reward_loop_source`` (verl 0.9.1's legacy spelling, moved over ``reward.reward_manager`` by its
    ``migrate_legacy_reward_impl``), when set, replaces ``source``; with ``importlib`` the file is
    ``reward_model.reward_loop_module_path`` and the class ``reward_model.reward_loop_class_name`` (null:
    ``reward_model.reward_manager``). verl 0.9.1 copies the class name into ``module.name`` (the name the file is
    imported as) and still looks the class up by ``reward_manager.name``; here it names the class, as its name says.

    Raises:
        ValueError: an unknown registered name (naming the registered ones). FileNotFoundError: no such file (naming
        the key). AttributeError: the file has no such class. TypeError: the class's instances are not callable
        (a manager is called as ``manager(batch, return_dict=True)``).
    """
    name, loop = str(config.reward_model.reward_manager), config.reward_model
    legacy = loop.reward_loop_source is not None
    source = loop.reward_loop_source if legacy else config.reward.reward_manager.source
    if source == "register":
        return get_reward_manager_cls(name)
    module_cfg = config.reward.reward_manager.module  # read only here: the register path reads no module key
    name_key = "reward.reward_manager.name (reward_model.reward_manager)"
    if legacy:
        path, path_key = loop.reward_loop_module_path, LOOP_PATH_KEY
        if loop.reward_loop_class_name is not None:
            name, name_key = str(loop.reward_loop_class_name), "reward_model.reward_loop_class_name"
    else:
        path, path_key = module_cfg.path, MODULE_KEY
    resolved = resolve_user_file(str(path), path_key)
    module = exec_user_file(resolved, path_key, str(module_cfg.name))
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise AttributeError(f"{name_key}={name!r}: {resolved!r} has no class of that name ({path_key})")
    if not any("__call__" in vars(k) for k in cls.__mro__[:-1]):
        raise TypeError(f"{name_key}={name!r}: class {name} in {resolved!r} has no __call__: a reward manager is "
                        f"called as manager(batch, return_dict=True) (subclass "
                        f"rlhf_core.reward.managers.NaiveRewardManager and override score_samples)")
    return cls


def load_reward_manager(config: Any, tokenizer: Any, num_examine: int = 0, reward_fn_kwargs: dict | None = None,
                        **kwargs: Any) -> Any:
    """The manager named by ``reward_model.reward_manager`` (default ``naive``; :func:`reward_manager_cls`), built
    with its ``config_kwargs(config)`` (``remote``: ``reward.num_workers``; ``rate_limited``: ``reward.max_*``),
    then ``reward_model.reward_kwargs``, then ``kwargs``.

    Args:
        config: the full ppo_trainer config (``DictConfig`` or nested dicts). Reads
            ``reward_model.reward_manager``, ``reward_model.reward_kwargs`` (optional; passed to the manager,
            e.g. ``timeout_s``/``num_processes`` for prime,
            ``max_resp_len``/``overlong_buffer_cfg`` for dapo), ``custom_reward_function.{path,name,reward_kwargs}``
            and ``data.reward_fn_key`` (default ``data_source``).
        tokenizer: anything with ``decode(ids, skip_special_tokens=True)``.
        num_examine: samples per data source to print on each call (verl: 0 for training, 1 for validation).
        reward_fn_kwargs: extra keyword arguments of every reward-function call (a generative reward model's
            ``reward_router_address`` and ``reward_model_tokenizer``: :func:`rlhf_core.workers.genrm_server.genrm_kwargs`).
        **kwargs: extra manager arguments (override ``reward_kwargs``).

    Raises:
        ValueError: for an unknown manager name. FileNotFoundError / AttributeError from a bad custom function.
    """
    cls = reward_manager_cls(config)
    from_config = cls.config_kwargs(config) if hasattr(cls, "config_kwargs") else {}  # e.g. reward.num_workers
    manager_kwargs = {**from_config, **dict(config.reward_model.reward_kwargs), **kwargs}
    return cls(
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=reward_function_from_config(config, reward_fn_kwargs),
        reward_fn_key=str(config.data.reward_fn_key),
        **manager_kwargs,
    )
