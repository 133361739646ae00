"""A generative reward model (GenRM, an LLM judge) in a PPO run, as verl 0.9's reward loop runs one.

verl 0.9 (``verl/experimental/reward_loop/reward_loop.py``): with ``reward.reward_model.enable`` and a
``custom_reward_function``, the reward model is served by a rollout engine and the custom function is called with
two more keyword arguments, ``reward_router_address`` (``"host:port"`` of an HTTP router in front of the engine's
OpenAI-compatible servers) and ``reward_model_tokenizer`` (the judge's tokenizer); the function builds the judge
prompt, posts a chat request and parses the score. verl requires ``reward.reward_model.rollout.name`` (``???``).

Here a run is a GenRM run when ``reward_model.enable`` (= ``reward.reward_model.enable``), a
``custom_reward_function.path`` and an engine name (``reward.reward_model.rollout.name``, or the legacy
``reward_model.rollout.name``) are all set: the judge ``reward_model.model.path`` (= ``reward.reward_model.model_path``)
is served by :class:`~rlhf_core.workers.genrm_server.GenRMServer` on ``127.0.0.1`` for the run, no discriminative
reward-model workers are built, and the reward manager's function receives the two arguments (the same for every
reward manager). Without an engine name the 0.6 behaviour stays: ``reward_model.enable`` builds the discriminative
reward-model workers, whose ``rm_scores`` win over the function.

Differences from verl, each deliberate: one server answers requests one at a time (no router, no replicas; the
address is the server's own); only ``rollout.name=hf`` (the judge on CPU, in the driver process, which must be on the
same machine as whatever calls the reward function); ``do_sample`` and ``ignore_eos`` are request defaults here (verl's
server reads neither); a sync reward manager runs an ``async def`` function to completion per sample.
"""
from __future__ import annotations

import inspect
import json
import os
from typing import Any

from rlhf_core.config.errors import ConfigError

ENGINE = "reward.reward_model.rollout"
EXTRA_ARGS = ("reward_router_address", "reward_model_tokenizer")
# reward.reward_model.rollout keys the judge server reads (the legacy reward_model.rollout.* of the same name, when
# not null, replace them: verl 0.9's migrate_legacy_reward_impl)
READ = ("name", "dtype", "temperature", "top_p", "top_k", "do_sample", "ignore_eos", "response_length",
        "max_model_len", "seed")


def engine_settings(config: Any) -> dict[str, Any]:
    """The judge engine's settings: ``reward.reward_model.rollout.<k>`` for each read key, replaced by the legacy
    ``reward_model.rollout.<k>`` where that is not null (verl 0.9 ``migrate_legacy_reward_impl``; the legacy section
    has fewer keys)."""
    new, legacy = config.reward.reward_model.rollout, config.reward_model.rollout
    out = {k: getattr(new, k) for k in READ}
    for k in READ:
        value = getattr(legacy, k, None) if k in legacy else None
        if value is not None:
            out[k] = value
    return out


def genrm_enabled(config: Any) -> bool:
    """A GenRM run: ``reward_model.enable``, ``custom_reward_function.path`` and an engine name all set."""
    return bool(config.reward_model.enable) and bool(config.custom_reward_function.path) \
        and engine_settings(config)["name"] is not None


def check_reward_function(fn: Any) -> None:
    """The custom function of a GenRM run must accept ``reward_router_address`` and ``reward_model_tokenizer`` (named
    or through ``**kwargs``), as verl passes them.

    Raises:
        ConfigError: naming the function, its signature and what to add.
    """
    target = getattr(fn, "_fn", None) or fn
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return  # a builtin or C callable: nothing to check
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [a for a in EXTRA_ARGS if a not in params]
    if missing:
        raise ConfigError(
            f"custom_reward_function {fn!r}{inspect.signature(target)} is called with a generative reward model "
            f"(reward_model.enable and {ENGINE}.name are set), so it receives {list(EXTRA_ARGS)} as verl 0.9 passes "
            f"them; it lacks {missing}: add them (or **kwargs) to its parameters, or unset {ENGINE}.name to score with "
            "the function alone")


def check_judge_model(path: str) -> None:
    """The judge must be a generative model: its ``config.json`` ``architectures`` name a causal LM
    (``...ForCausalLM``, ``...LMHeadModel``, ``...ForConditionalGeneration``), not a sequence classifier.

    Raises:
        ConfigError: naming ``reward_model.model.path``, the architectures and what a discriminative model needs.
    """
    file = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(file):
        return  # a hub id or remote path: the loader says what is wrong
    with open(file) as f:
        arch = list(json.load(f).get("architectures") or [])
    if arch and not any(a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in arch):
        raise ConfigError(
            f"reward_model.model.path={path!r} is a {arch} model, not a generative one, and {ENGINE}.name is set "
            "(a generative reward model): use a causal LM as the judge, or unset the engine name to score with this "
            "model as a discriminative reward model")


def check_genrm(config: Any, reward_fn: Any) -> None:
    """The bad-input checks of a GenRM run, before any model loads: the judge is a causal LM
    (:func:`check_judge_model`) and the reward function takes the GenRM arguments (:func:`check_reward_function`).
    The judge path itself is checked with the other model paths (``check_model_paths``)."""
    check_judge_model(str(config.reward_model.model.path))
    check_reward_function(reward_fn)
