"""Hugging Face hub ids as model paths: refused in one line, in seconds, when they cannot be loaded here.

A model key (``actor_rollout_ref.model.path``, ``model.partial_pretrain``, ...) may name a hub id
(``Qwen/Qwen2.5-0.5B``). Without a network, ``from_pretrained`` retries each file for about 23 s
(``huggingface_hub``'s back-off: 1 + 2 + 4 + 8 + 8 s), twice, then prints two tracebacks. :func:`check_hub_model`
decides before anything loads:

* ``HF_HUB_OFFLINE`` set (``1``/``true``...): the id must be in the local cache (``config.json`` of its ``main``
  revision, looked up with :func:`huggingface_hub.try_to_load_from_cache`, no network);
* otherwise the hub endpoint (``HF_ENDPOINT``, default ``https://huggingface.co``) must answer a TCP connection
  within :data:`PROBE_TIMEOUT_S`; when it does not, the message says whether a cached copy exists (then
  ``HF_HUB_OFFLINE=1`` uses it) or not (then a local folder, or a download elsewhere, is the way).

With a proxy variable set (``HTTPS_PROXY``...) the endpoint is not probed: the loaders go through the proxy.
Import-light (no torch, no transformers): ``rlhf ppo`` runs this before the trainer is imported.
"""
from __future__ import annotations

import functools
import os
import socket
import threading
from urllib.parse import urlsplit

from rlhf_core.config.errors import ConfigError

PROBE_TIMEOUT_S = 3.0
"""Seconds the hub endpoint has to accept a TCP connection (name lookup included)."""

_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def is_hub_id(path: str) -> bool:
    """True when ``path`` is not a URL, not filesystem-looking (``/``, ``~``, ``./``, ``../``), not an existing
    local file or folder, and is a valid hub repo id (``name`` or ``org/name``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    path = str(path)
    if "://" in path or path.startswith(("/", "~", "./", "../")) or os.path.exists(path):
        return False
    try:
        validate_repo_id(path)
    except HFValidationError:
        return False
    return True


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``) set to a true value, read now (not at the
    import of ``huggingface_hub``)."""
    return any(os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"}
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_cache_dir() -> str:
    """The hub cache folder, read now: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``huggingface_hub``'s default
    (``~/.cache/huggingface/hub``)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    return os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else constants.HF_HUB_CACHE


def cached_copy(repo_id: str) -> str | None:
    """The cached ``config.json`` of ``repo_id``'s ``main`` revision in :func:`hub_cache_dir`, or None; reads the
    cache folder only."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=hub_cache_dir())
    return found if isinstance(found, str) else None


def hub_endpoint() -> str:
    """``HF_ENDPOINT`` (read now), default ``https://huggingface.co``."""
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


@functools.lru_cache(maxsize=8)
def endpoint_unreachable(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``endpoint`` (a URL) cannot be reached — the socket error, or ``no answer within N s`` — or None when
    it accepts a TCP connection. The name lookup and connect run in a daemon thread joined for ``timeout_s``
    (``getaddrinfo`` has no timeout of its own). Remembered per endpoint for the life of the process."""
    parts = urlsplit(endpoint)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    result: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            result.append(None)
        except OSError as exc:
            result.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=probe, daemon=True, name="hf-hub-probe")
    thread.start()
    thread.join(timeout_s)
    return result[0] if result else f"no answer within {timeout_s:g} s"


def check_hub_model(key: str, path: str) -> None:
    """Refuse ``key=path`` when ``path`` is a hub id (:func:`is_hub_id`) that cannot be loaded here (module
    docstring); anything else passes.

    Raises:
        ConfigError: one line naming the key, the id, why (offline and not cached; the endpoint and its error)
            and what to do (a local folder, ``HF_HUB_OFFLINE=1`` with a cached copy).
    """
    if not is_hub_id(path):
        return
    local = "give a local model folder instead"
    fetch = (f"or download it where there is network (`hf download {path}`, huggingface_hub's CLI) and run with "
             "HF_HUB_OFFLINE=1")
    if hub_offline():
        if cached_copy(path) is None:
            raise ConfigError(f"{key}={path!r} is a Hugging Face hub id, HF_HUB_OFFLINE is set and it is not in the "
                              f"local cache ({hub_cache_dir()}): {local}, {fetch}")
        return
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return
    endpoint = hub_endpoint()
    why = endpoint_unreachable(endpoint)
    if why is None:
        return
    if cached_copy(path) is not None:
        raise ConfigError(f"{key}={path!r} is a Hugging Face hub id and {endpoint} cannot be reached ({why}); a "
                          "copy is in the local cache: run with HF_HUB_OFFLINE=1 to use it, or " + local)
    raise ConfigError(f"{key}={path!r} is a Hugging Face hub id, {endpoint} cannot be reached ({why}) and it is not "
                      f"in the local cache ({hub_cache_dir()}): {local}, {fetch}")


def ppo_model_keys(config) -> list[str]:
    """The model and tokenizer keys a PPO config loads: ``actor_rollout_ref.model.path``; ``critic.model.path``
    and ``critic.model.tokenizer_path`` when the critic is in use (``critic.enable``; null = for GAE);
    ``reward_model.model.path`` when ``reward_model.enable``; ``actor_rollout_ref.model.tokenizer_path`` /
    ``hf_config_path`` when set."""
    from rlhf_core.config.validate import use_critic

    keys = ["actor_rollout_ref.model.path"]
    keys += [f"actor_rollout_ref.model.{k}" for k in ("tokenizer_path", "hf_config_path")
             if config.actor_rollout_ref.model[k] is not None]
    if use_critic(config):
        keys += ["critic.model.path", "critic.model.tokenizer_path"]
    if config.reward_model.enable:
        keys.append("reward_model.model.path")
    return keys


def check_hub_models(config, keys: list[str]) -> None:
    """:func:`check_hub_model` on each of ``keys`` (dotted paths of ``config``) whose value is set.

    Raises:
        ConfigError: for the first hub id that cannot be loaded here.
    """
    from omegaconf import OmegaConf

    for key in keys:
        value = OmegaConf.select(config, key)
        if value is not None:
            check_hub_model(key, str(value))
