"""Loading a user's reward function from a file (verl ``custom_reward_function.{path,name}``).

The loaded function is wrapped in :class:`FileRewardFunction`, which pickles as ``(path, name, kwargs)`` and
re-loads the file on first use, so it can be sent to the ``prime`` manager's worker processes (a function from
a module loaded by path cannot be pickled by reference). An ``async def`` function (verl 0.9 detects and awaits one)
is run to completion on each call, so every reward manager can call it.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import sys
from typing import Any, Callable

from rlhf_core.reward.scorers import default_compute_score
from rlhf_core.reward.scorers.sandbox_fusion import sandbox_from_config
from rlhf_core.user_code import exec_user_file, resolve_user_file

KEY = "custom_reward_function.path"


def _load_function(path: str, name: str) -> Callable[..., Any]:
    path = resolve_user_file(path, KEY)  # absolute; a file path only, never a module-name lookup
    module_name = "rlhf_custom_reward_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is None:
        # logs the absolute path and sha256; errors in the user's file propagate with their own traceback
        module = exec_user_file(path, KEY, module_name)
    fn = getattr(module, name, None)
    if fn is None:
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(
            f"custom_reward_function.name: {path!r} has no function {name!r}; callables found there: {public}"
        )
    if not callable(fn):
        raise TypeError(f"custom_reward_function.name: {name!r} in {path!r} is not callable")
    return fn


class FileRewardFunction:
    """A reward function loaded from ``path``; called as ``fn(*args, **kwargs, **reward_kwargs)``; an ``async def``
    function's coroutine is run to completion (``asyncio.run``; in a thread of its own when the calling thread already
    runs an event loop).

    Picklable: only ``(path, name, reward_kwargs)`` travel; the file is re-imported in the receiving process.
    """

    def __init__(self, path: str, name: str = "compute_score", reward_kwargs: dict | None = None) -> None:
        self.path = resolve_user_file(path, KEY)  # relative → against this process's cwd, once
        self.name = name
        self.reward_kwargs = dict(reward_kwargs or {})
        self._fn: Callable[..., Any] | None = _load_function(self.path, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._fn is None:
            self._fn = _load_function(self.path, self.name)
        result = self._fn(*args, **kwargs, **self.reward_kwargs)
        return _run(result) if inspect.iscoroutine(result) else result

    def __getstate__(self) -> dict:
        return {"path": self.path, "name": self.name, "reward_kwargs": self.reward_kwargs, "_fn": None}

    def __repr__(self) -> str:
        return f"FileRewardFunction({self.path!r}, {self.name!r})"


def _run(coro: Any) -> Any:
    """The result of ``coro``, run on a new event loop (in a new thread when this thread runs a loop already)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def load_custom_reward_function(
    path: str, name: str = "compute_score", reward_kwargs: dict | None = None
) -> FileRewardFunction:
    """Load ``name`` from the Python file ``path`` (verl ``get_custom_reward_fn``).

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        AttributeError: when the file defines no ``name`` (the message lists the callables it does define).
        TypeError: when ``name`` is not callable.
    """
    return FileRewardFunction(path, name or "compute_score", reward_kwargs)


def reward_function_from_config(config: Any, extra_kwargs: dict | None = None) -> Callable[..., Any]:
    """``custom_reward_function`` of a ppo_trainer config → a scorer; the default scorer when no path.

    Reads ``custom_reward_function.path``, ``.name`` (default ``compute_score``) and ``.reward_kwargs`` (extra
    keyword arguments passed on every call, as newer verl does; ``extra_kwargs`` join them: a generative reward
    model's ``reward_router_address`` and ``reward_model_tokenizer``, :mod:`rlhf_core.reward.genrm`); without a path,
    the Sandbox Fusion service of code data sources (:func:`sandbox_from_config`) when one is configured (verl 0.9: for
    the default scorer only).

    Raises: as :func:`load_custom_reward_function`; ValueError: as :func:`sandbox_from_config`.
    """
    section = config.custom_reward_function
    kwargs = {**dict(section.reward_kwargs), **(extra_kwargs or {})}
    return _scorer(section, kwargs, None if section.path else sandbox_from_config(config))


def eval_reward_function(config: Any) -> Callable[..., Any]:
    """``custom_reward_function`` of an evaluation config → a scorer (``path``, ``name``); the default scorer when
    no path. evaluation.yaml has neither ``reward_kwargs`` nor a sandbox (verl's ``main_eval`` passes none).

    Raises: as :func:`load_custom_reward_function`.
    """
    return _scorer(config.custom_reward_function, {}, None)


def _scorer(section: Any, kwargs: dict, sandbox: Any) -> Callable[..., Any]:
    if not section.path:
        if sandbox is not None:
            kwargs["sandbox_fusion"] = sandbox
        return functools.partial(default_compute_score, **kwargs) if kwargs else default_compute_score
    return load_custom_reward_function(str(section.path), section.name, kwargs)
