"""verl 0.9's ``trainer.v1.trainer_mode=separate_async`` on this project's fully asynchronous driver. Torch-free.

verl 0.9.1 (``verl/trainer/ppo/v1/trainer_separate_async.py``, docs/advance/v1_async_trainer.md) runs
``separate_async`` as: standalone rollout replicas generate continuously, with partial rollout across weight
updates; before the first step ``num_warmup_batches`` batches of prompts are dispatched, and each step dispatches one
more, so the rollout runs at most ``num_warmup_batches`` batches ahead of training; a step trains
``parameter_sync_step`` mini-batches of ``train_batch_size / parameter_sync_step`` prompts (its assertion:
``train_batch_size == parameter_sync_step × ppo_mini_batch_size``) and pushes the weights once, at its end.

This project's fully asynchronous driver (``async_training.mode=fully_async``, ``rlhf_core/trainer/fully_async.py``,
docs/OFF_POLICY.md) has the same parts under verl's fully_async_policy keys: a step takes ``ppo_mini_batch_size ×
require_batches`` prompts (and requires ``data.train_batch_size`` to equal it: verl's v1 assertion with
``require_batches = parameter_sync_step``), pushes the weights every ``trigger_parameter_sync_step`` steps (1: at
the end of every step, as separate_async), and lets the rollouter run ``required × (1 + staleness_threshold) ×
trigger`` samples past a sync, i.e. with trigger 1 ``staleness_threshold`` whole batches ahead of training
(``staleness_threshold = num_warmup_batches``; the lag bound of docs/OFF_POLICY.md is then ``num_warmup_batches``
versions, verl's prompt span ``num_warmup_batches + 1``). :func:`resolve_v1_trainer` writes those values.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from .errors import ConfigError

_SA = "trainer.v1.separate_async."


def v1_async_settings(cfg: Any) -> dict[str, Any]:
    """The ``async_training.*`` values ``trainer.v1.trainer_mode=separate_async`` means here (dotted key -> value,
    with the v1 key it comes from), or ``{}`` when the v1 loop is off (``trainer.use_v1=False``: verl runs its
    legacy ``main_ppo_v0``, which reads no ``trainer.v1`` key) or its mode is ``sync`` (the on-policy driver).

    Raises:
        ConfigError: ``parameter_sync_step`` < 1, ``num_warmup_batches`` < 0 or ``sampler.max_off_policy_threshold``
            < 1, naming the key and value.
    """
    if not cfg.trainer.use_v1 or cfg.trainer.v1.trainer_mode != "separate_async":
        return {}
    sa, thr = cfg.trainer.v1.separate_async, cfg.trainer.v1.sampler.max_off_policy_threshold
    bad = [f"{k}={v!r} must be an integer >= {lo}" for k, v, lo in
           ((_SA + "parameter_sync_step", sa.parameter_sync_step, 1),
            (_SA + "num_warmup_batches", sa.num_warmup_batches, 0),
            ("trainer.v1.sampler.max_off_policy_threshold", thr, 1))  # verl asserts > 0
           if not isinstance(v, int) or isinstance(v, bool) or v < lo]
    if bad:
        raise ConfigError("Invalid config:\n  - " + "\n  - ".join(bad))
    return {
        "async_training.mode": ("fully_async", "trainer.v1.trainer_mode='separate_async'"),
        "async_training.require_batches": (sa.parameter_sync_step, f"{_SA}parameter_sync_step="
                                           f"{sa.parameter_sync_step}"),
        "async_training.trigger_parameter_sync_step": (1, "trainer.v1.trainer_mode='separate_async' (one weight "
                                                          "push per step)"),
        "async_training.staleness_threshold": (float(sa.num_warmup_batches), f"{_SA}num_warmup_batches="
                                               f"{sa.num_warmup_batches}"),
    }


def resolve_v1_trainer(cfg: DictConfig, user_set: set[str]) -> None:
    """With ``trainer.v1.trainer_mode=separate_async`` set ``async_training.mode=fully_async``,
    ``require_batches = parameter_sync_step``, ``trigger_parameter_sync_step = 1`` and ``staleness_threshold =
    num_warmup_batches`` (see the module docstring), in place, before interpolations are resolved (so
    ``data.train_batch_size=0`` is then derived from them as in a fully async run); and check verl's invariant
    ``data.train_batch_size = parameter_sync_step × ppo_mini_batch_size``. ``user_set``: the dotted keys the user set
    away from their defaults (:func:`rlhf_core.config.notices.changed_paths`).

    Raises:
        ConfigError: naming both keys for each ``async_training`` key the user set to another value than the v1 key
            means, and naming ``parameter_sync_step``, ``ppo_mini_batch_size`` and ``data.train_batch_size`` when a
            positive batch size breaks verl's invariant.
    """
    settings = v1_async_settings(cfg)
    if not settings:
        return
    errors = []
    for path, (value, source) in settings.items():
        section, name = path.split(".")
        current = cfg[section][name]
        if path in user_set and current != value:
            errors.append(f"{path}={current!r} and {source} disagree: with trainer.v1.trainer_mode=separate_async "
                          f"the v1 key sets {path}={value!r}; set one of them, or both to agree")
    steps, mini = cfg.trainer.v1.separate_async.parameter_sync_step, cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    tbs = cfg.data.train_batch_size
    if isinstance(tbs, int) and tbs > 0 and isinstance(mini, int) and tbs != steps * mini:
        errors.append(f"data.train_batch_size={tbs}: trainer.v1.trainer_mode=separate_async trains "
                      f"{_SA}parameter_sync_step × actor_rollout_ref.actor.ppo_mini_batch_size = {steps} × {mini} = "
                      f"{steps * mini} prompts per step (verl asserts it); set data.train_batch_size={steps * mini} "
                      f"or change parameter_sync_step")
    if errors:
        raise ConfigError("Invalid config:\n  - " + "\n  - ".join(errors))
    for path, (value, _) in settings.items():
        section, name = path.split(".")
        cfg[section][name] = value
