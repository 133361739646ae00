"""Validation of loaded configs, before any model is loaded (SEMANTICS.md "Batch sizes").

Two stages, as in verl's ``RayPPOTrainer._validate_config`` and the FSDP workers' asserts:
static rules (config only) and resource rules (need the world size = number of training workers,
by default ``trainer.nnodes * trainer.n_gpus_per_node``). Every problem is collected and raised
together as one ConfigError; each line names the key, the value and the rule, with the numbers.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from .errors import ConfigError
from .distillation import distillation_errors
from .off_policy import fully_async_config_errors, fully_async_only_errors, one_step_config_errors
from .prefix_grouper import prefix_grouper_errors
from .sequence_parallel import section_sp_size, sequence_parallel_errors
from .warmup_style import convert_warmup_style

A = "actor_rollout_ref"
# (section, deprecated global key, per-worker key, dynamic-bsz flag, when the section is used)
_PPO_MICRO = (
    (f"{A}.actor", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", f"{A}.actor.use_dynamic_bsz", "always"),
    (f"{A}.ref", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu",
     f"{A}.ref.log_prob_use_dynamic_bsz", "ref"),
    (f"{A}.rollout", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu",
     f"{A}.rollout.log_prob_use_dynamic_bsz", "always"),
    ("critic", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", "critic.use_dynamic_bsz", "critic"),
    ("critic", "forward_micro_batch_size", "forward_micro_batch_size_per_gpu", "critic.use_dynamic_bsz", "critic"),
    ("reward_model", "micro_batch_size", "micro_batch_size_per_gpu", "reward_model.use_dynamic_bsz", "rm"),
)
_SFT_MICRO = (("data", "micro_batch_size", "micro_batch_size_per_gpu", None, "always"),)


def _get(cfg: DictConfig, path: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, path, default=default)


def world_size_of(cfg: DictConfig) -> int:
    """Training workers implied by the config: ``trainer.nnodes * trainer.n_gpus_per_node``."""
    nnodes, per_node = _get(cfg, "trainer.nnodes", 1), _get(cfg, "trainer.n_gpus_per_node", 1)
    if not isinstance(nnodes, int) or not isinstance(per_node, int):
        raise ConfigError(f"trainer.nnodes={nnodes!r} and trainer.n_gpus_per_node={per_node!r} must be integers.")
    return nnodes * per_node


def use_critic(cfg: DictConfig) -> bool:
    """Whether the run has a critic (verl 0.6 ``need_critic``): ``critic.enable`` when set (true/false); when null,
    only for ``algorithm.adv_estimator: gae``."""
    enable = _get(cfg, "critic.enable")
    if enable is not None:
        return bool(enable)
    return _get(cfg, "algorithm.adv_estimator") == "gae"


def need_ref(cfg: DictConfig) -> bool:
    """A reference policy is needed for a KL loss or a KL penalty in the reward."""
    return bool(_get(cfg, f"{A}.actor.use_kl_loss")) or bool(_get(cfg, "algorithm.use_kl_in_reward"))


def _in_use(cfg: DictConfig, when: str) -> bool:
    return {"always": True, "ref": need_ref(cfg), "critic": use_critic(cfg),
            "rm": bool(_get(cfg, "reward_model.enable"))}[when]


def _is_interpolation(cfg: DictConfig, path: str) -> bool:
    parent_key, _, leaf = path.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    return isinstance(parent, DictConfig) and leaf in parent and OmegaConf.is_interpolation(parent, leaf)


def convert_deprecated(cfg: DictConfig, world_size: int | None = None, sft: bool = False) -> list[str]:
    """Convert deprecated global ``*_micro_batch_size`` keys to ``*_per_gpu`` in place, with a warning, and
    (PPO) a set ``optim.warmup_style`` onto ``optim.lr_scheduler_type``
    (:func:`~rlhf_core.config.warmup_style.lr_scheduler_type_of`).

    Mirrors verl's workers: ``per_gpu = global // world_size``; the global key is then set to null.
    Run it before resolving: a per-GPU key that is still an interpolation (e.g. the critic's, which
    follows the actor's) counts as unset, so it takes the converted value. Raises ConfigError when
    both keys of a pair are set explicitly, or when the global value is not a positive multiple of
    the world size (verl would floor it silently, possibly to 0). Returns the warning texts.
    """
    world = world_size or world_size_of(cfg)
    from .rollout_corr import convert_rollout_is  # here: `python -m rlhf_core.config.rollout_corr` runs that module

    notes, errors = ([] if sft else convert_warmup_style(cfg) + convert_rollout_is(cfg)), []
    if world <= 0:
        return notes  # the resource rules report the bad world size
    for section, old, new, _dyn, _when in (_SFT_MICRO if sft else _PPO_MICRO):
        old_v, new_v = _get(cfg, f"{section}.{old}"), _get(cfg, f"{section}.{new}")
        if not isinstance(old_v, int) or isinstance(old_v, bool) or _is_interpolation(cfg, f"{section}.{old}"):
            continue  # unset, a type error (reported by the schema check), or following another key
        if new_v is not None and not _is_interpolation(cfg, f"{section}.{new}"):
            errors.append(f"[{section}] You have set both '{section}.{old}'={old_v} (deprecated) AND "
                          f"'{section}.{new}'={new_v}. Please remove '{section}.{old}' because only "
                          f"'{section}.{new}' is supported.")
            continue
        if old_v <= 0 or old_v % world:
            errors.append(f"{section}.{old}={old_v} (deprecated, global) must be a positive multiple of the "
                          f"world size {world} to become {section}.{new}; set {section}.{new} instead.")
            continue
        per_gpu = old_v // world
        with open_dict(cfg):
            OmegaConf.update(cfg, f"{section}.{new}", per_gpu, merge=False)
            OmegaConf.update(cfg, f"{section}.{old}", None, merge=False)
        note = (f"{section}.{old}={old_v} is deprecated; converted to {section}.{new}={per_gpu} "
                f"({old_v} / world size {world}). Set {section}.{new} directly.")
        warnings.warn(note, DeprecationWarning, stacklevel=3)
        notes.append(note)
    if errors:
        raise ConfigError("Invalid config:\n  - " + "\n  - ".join(errors))
    return notes


def _micro_errors(cfg: DictConfig, table: tuple) -> list[str]:
    errors = []
    for section, old, new, dyn, when in table:
        if not _in_use(cfg, when) or (dyn and _get(cfg, dyn)):
            continue
        old_v, new_v = _get(cfg, f"{section}.{old}"), _get(cfg, f"{section}.{new}")
        if old_v is not None and new_v is not None:
            errors.append(f"[{section}] You have set both '{section}.{old}'={old_v} AND '{section}.{new}'"
                          f"={new_v}. Please remove '{section}.{old}' (deprecated).")
        elif old_v is None and new_v is None:
            errors.append(f"[{section}] Please set at least one of '{section}.{old}' or '{section}.{new}' "
                          f"(or enable dynamic batch size{f': {dyn}=True' if dyn else ''}).")
        elif new_v is not None and new_v <= 0:
            errors.append(f"{section}.{new}={new_v} must be > 0.")
    return errors


def _mini_batch_errors(cfg: DictConfig, section: str, n_key: str, world: int, fsdp_key: str) -> list[str]:
    """verl's worker normalisation: mini×n ÷ world per worker, then divisible by micro per GPU. With Ulysses
    (:func:`~.sequence_parallel.role_sp_size` of the section above 1, dividing the world) the
    divisor is the data-parallel size ``world ÷ sp``: an SP group's ranks share their rows (verl's ``dp`` division)."""
    errors = []
    try:
        sp = section_sp_size(cfg, section, fsdp_key)
    except ValueError:  # the two size keys disagree: sequence_parallel_errors names them, the split is unknown
        return []
    if sp > 1 and world % sp == 0:
        world = world // sp
    tbs, mini, n = _get(cfg, "data.train_batch_size"), _get(cfg, f"{section}.ppo_mini_batch_size"), _get(cfg, n_key)
    if mini is None or mini <= 0:
        return [f"{section}.ppo_mini_batch_size={mini} must be > 0."]
    if tbs % mini:
        errors.append(f"data.train_batch_size={tbs} is not divisible by {section}.ppo_mini_batch_size={mini} "
                      f"(each step must split into whole mini-batches).")
    seqs = mini * n
    if seqs % world:
        errors.append(f"{section}.ppo_mini_batch_size={mini} x {n_key}={n} = {seqs} sequences is not "
                      f"divisible by world size {world}.")
    elif seqs // world == 0:
        errors.append(f"{section}.ppo_mini_batch_size={mini} x {n_key}={n} = {seqs} sequences split over "
                      f"world size {world} gives 0 per worker.")
    micro = _get(cfg, f"{section}.ppo_micro_batch_size_per_gpu")
    if micro is None and _get(cfg, f"{section}.ppo_micro_batch_size") is not None:
        micro = _get(cfg, f"{section}.ppo_micro_batch_size") // world
    dynamic = _get(cfg, f"{section}.use_dynamic_bsz")
    if not dynamic and micro is not None:
        if micro <= 0:
            errors.append(f"{section}.ppo_micro_batch_size_per_gpu={micro} gives 0 sequences per micro-batch.")
        elif seqs % (world * micro):
            errors.append(f"{section}.ppo_mini_batch_size={mini} x {n_key}={n} = {seqs} sequences is not "
                          f"divisible by world size {world} x {section}.ppo_micro_batch_size_per_gpu={micro} "
                          f"= {world * micro}.")
    if dynamic and (_get(cfg, f"{section}.ppo_max_token_len_per_gpu") or 0) <= 0:
        errors.append(f"{section}.ppo_max_token_len_per_gpu="
                      f"{_get(cfg, f'{section}.ppo_max_token_len_per_gpu')} must be > 0 with use_dynamic_bsz.")
    return errors


_LR = "the optimizer's learning rate"
_TEMP = "the sampling temperature; 0 = greedy"
# Keys whose value must be a finite number: (key, lowest value or None, whether the lowest is allowed, what it is).
# A NaN or inf here makes every loss, advantage or parameter NaN at the first step (or, for a temperature, every
# log-prob); a negative learning rate ascends the loss; verl's dual-clip loss asserts clip_ratio_c > 1 at run time.
_PPO_FINITE = (
    (f"{A}.actor.optim.lr", 0, True, _LR),
    (f"{A}.actor.clip_ratio", 0, True, "the PPO clip range"),
    (f"{A}.actor.clip_ratio_low", 0, True, "the lower PPO clip range"),
    (f"{A}.actor.clip_ratio_high", 0, True, "the upper PPO clip range"),
    (f"{A}.actor.clip_ratio_c", 1, False, "the dual-clip bound"),
    (f"{A}.actor.entropy_coeff", None, True, "the entropy bonus coefficient"),
    (f"{A}.actor.kl_loss_coef", None, True, "the KL loss coefficient"),
    ("algorithm.kl_ctrl.kl_coef", None, True, "the in-reward KL coefficient"),
    ("algorithm.kl_ctrl.target_kl", None, True, "the adaptive KL controller's target"),
    ("algorithm.gamma", None, True, "the discount factor"),
    ("algorithm.lam", None, True, "the GAE lambda"),
    (f"{A}.rollout.temperature", 0, True, _TEMP),
    (f"{A}.rollout.val_kwargs.temperature", 0, True, _TEMP),
)
_CRITIC_FINITE = (("critic.optim.lr", 0, True, _LR), ("critic.cliprange_value", None, True, "the value clip range"))


def finite_errors(cfg: DictConfig, rules: tuple[tuple[str, float | None, bool, str], ...]) -> list[str]:
    """One line per numeric key of ``rules`` that is NaN, infinite or below its bound, naming the key and the value.

    ``rules``: ``(key, lowest, lowest allowed, what the value is)``; ``lowest`` None means any finite number.
    Missing, null and non-numeric values are left to the type checks. Example line:
    ``actor_rollout_ref.actor.clip_ratio=nan must be a finite number >= 0 (the PPO clip range).``"""
    errors = []
    for key, low, inclusive, what in rules:
        v = _get(cfg, key)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        in_range = low is None or (v >= low if inclusive else v > low)
        if not (math.isfinite(v) and in_range):
            bound = "" if low is None else f" {'>=' if inclusive else '>'} {low}"
            errors.append(f"{key}={v} must be a finite number{bound} ({what}).")
    return errors


def section_errors(cfg: DictConfig, name: str) -> list[str]:
    """The checks of each section of config ``name`` whose class has a ``__post_init__`` (rules that involve that
    section only; rlhf_core/config/schemas/), run on ``cfg``'s values of the section: one line per broken rule,
    naming the full keys. A section ``cfg`` lacks, or whose keys are not the class's fields, is skipped (the schema
    checks name those)."""
    from .schemas import root_class
    from .spec import SectionErrors, section_help

    errors = []
    for path, _, cls in section_help(root_class(name)):
        if "__post_init__" not in vars(cls):
            continue
        node = OmegaConf.select(cfg, path, default=None)
        if not isinstance(node, DictConfig):
            continue
        try:
            cls(**OmegaConf.to_container(node, resolve=True))
        except SectionErrors as exc:
            errors += [line.replace("{section}", path) for line in exc.errors]
        except TypeError:  # keys that are not the class's fields: reported by the schema checks
            continue
    return errors


def ppo_static_errors(cfg: DictConfig) -> list[str]:
    """Rules that need only the config (no world size): each section's own checks (:func:`section_errors`), then
    the rules across sections."""
    errors = section_errors(cfg, "ppo_trainer")
    errors += finite_errors(cfg, _PPO_FINITE + (_CRITIC_FINITE if use_critic(cfg) else ()))
    tbs, n = _get(cfg, "data.train_batch_size"), _get(cfg, f"{A}.rollout.n")
    if tbs is None or tbs <= 0:  # fully async: 0 / null became the step size (derive_fully_async_batch)
        errors.append(f"data.train_batch_size={tbs} must be > 0.")
    for key in ("data.max_prompt_length", "data.max_response_length", f"{A}.actor.ppo_epochs", "trainer.total_epochs"):
        if (_get(cfg, key) or 0) < 1:
            errors.append(f"{key}={_get(cfg, key)} must be >= 1.")
    rate = _get(cfg, f"{A}.rollout.over_sample_rate")
    counts = isinstance(tbs, int) and isinstance(n, int) and tbs > 0 and n > 0
    if rate and 0 < rate < 1 and counts and int(tbs * n * (1 - rate)) < 1:
        errors.append(f"{A}.rollout.over_sample_rate={rate} keeps int({tbs * n} × (1 − {rate})) = 0 of the {tbs * n} "
                      f"responses of a step (data.train_batch_size × {A}.rollout.n): every response would be aborted.")
    errors += fully_async_only_errors(cfg)
    adv = _get(cfg, "algorithm.adv_estimator")
    if adv in ("rloo", "rloo_vectorized", "grpo_passk") and n is not None and n < 2:
        errors.append(f"algorithm.adv_estimator={adv} needs {A}.rollout.n >= 2 (the baseline is the other samples "
                      f"of the group), got {A}.rollout.n={n}.")
    gdpo_keys, gdpo_weights = _get(cfg, "algorithm.gdpo_reward_keys"), _get(cfg, "algorithm.gdpo_reward_weights")
    if adv == "gdpo" and not gdpo_keys:
        errors.append("algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward function's dict keys "
                      "of the reward components, e.g. [format_reward,accuracy_reward].")
    if adv == "gdpo" and gdpo_keys and gdpo_weights is not None and len(gdpo_weights) != len(gdpo_keys):
        errors.append(f"algorithm.gdpo_reward_weights has {len(gdpo_weights)} weights for {len(gdpo_keys)} "
                      f"algorithm.gdpo_reward_keys; give one per key or null (all 1).")
    if adv == "gae" and not use_critic(cfg):
        errors.append("algorithm.adv_estimator=gae needs critic values, but critic.enable=False (set critic.enable="
                      "null or true, or choose an estimator without a critic such as grpo).")
    rc = "algorithm.rollout_correction"
    if _get(cfg, f"{A}.actor.use_rollout_log_probs") and not _get(cfg, f"{A}.rollout.calculate_log_probs"):
        errors.append(f"{A}.actor.use_rollout_log_probs=True needs {A}.rollout.calculate_log_probs=True (the rollout "
                      f"engine's log-probs are the old_log_probs then), got False.")
    for key in (f"{A}.actor.rollout_is", "algorithm.rollout_is", f"{rc}.bypass_mode", f"{rc}.rollout_is", f"{rc}.rollout_rs"):
        if _get(cfg, key) and not _get(cfg, f"{A}.rollout.calculate_log_probs"):
            errors.append(f"{key}={_get(cfg, key)} needs {A}.rollout.calculate_log_probs=True (the rollout engine's log-probs "
                          f"are the denominator of the importance weight), got False.")
    if use_critic(cfg) and (_get(cfg, "trainer.critic_warmup") or 0) < 0:
        errors.append(f"trainer.critic_warmup={_get(cfg, 'trainer.critic_warmup')} must be >= 0.")
    errors += _filter_groups_errors(cfg)
    errors += _agent_loop_errors(cfg)
    errors += distillation_errors(cfg)
    if _get(cfg, f"{A}.hybrid_engine") is False and _get(cfg, "async_training.mode") == "on_policy":
        errors.append(f"{A}.hybrid_engine=False (rollout in workers of its own) runs only with "
                      f"async_training.mode=one_step_off_policy or fully_async, got 'on_policy'.")
    if _get(cfg, "async_training.mode") == "one_step_off_policy" and not errors:  # sizes sane first
        errors += one_step_config_errors(cfg)
    if _get(cfg, "async_training.mode") == "fully_async" and tbs is not None:  # all at once (verl scripts hit several)
        errors += fully_async_config_errors(cfg)
    return errors


def _agent_loop_errors(cfg: DictConfig) -> list[str]:
    """Agent loops (``rollout.mode=async`` or ``multi_turn.enable``) with tools (``multi_turn.tool_config_path`` or
    ``function_tool_path``):
    ``tool_agent`` renders the tool schemas into the chat template from the prompt's messages, which the dataset
    keeps only with ``data.return_raw_chat=True`` (else every trajectory fails at its first generation)."""
    agent = _get(cfg, f"{A}.rollout.mode") == "async" or bool(_get(cfg, f"{A}.rollout.multi_turn.enable"))
    paths = [f"{A}.rollout.multi_turn.{k}={_get(cfg, f'{A}.rollout.multi_turn.{k}')}"
             for k in ("tool_config_path", "function_tool_path") if _get(cfg, f"{A}.rollout.multi_turn.{k}")]
    if agent and paths and not _get(cfg, "data.return_raw_chat"):
        return [f"data.return_raw_chat={_get(cfg, 'data.return_raw_chat')}: {' and '.join(paths)} "
                f"gives tool_agent tools, which it renders into the chat template from the prompt's messages; "
                f"the dataset keeps them only with data.return_raw_chat=True: set it."]
    return []


def _filter_groups_errors(cfg: DictConfig) -> list[str]:
    """``algorithm.filter_groups`` / ``data.gen_batch_size`` rules across sections (DAPO dynamic sampling)."""
    gen = _get(cfg, "data.gen_batch_size")
    if gen is not None and gen <= 0:
        return [f"data.gen_batch_size={gen} must be > 0 (or null = data.train_batch_size)."]
    if not _get(cfg, "algorithm.filter_groups.enable"):
        return []
    errors = []
    metric = _get(cfg, "algorithm.filter_groups.metric")
    if metric == "seq_final_reward" and _get(cfg, "algorithm.use_kl_in_reward"):
        errors.append("algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=True: the KL "
                      "penalty needs the old and reference log-probs, computed only after the groups are filtered; "
                      "use metric=seq_reward (the score before the penalty).")
    if _get(cfg, "skip.rollout.enable"):
        errors.append("algorithm.filter_groups.enable=True with skip.rollout.enable=True: the rollout dump "
                      "holds one generation per step, dynamic sampling generates several.")
    return errors


def ppo_resource_errors(cfg: DictConfig, world: int) -> list[str]:
    """Rules that depend on the world size (verl's worker-side asserts, checked up front)."""
    errors = []
    if world <= 0:
        return [f"world size {world} (trainer.nnodes x trainer.n_gpus_per_node) must be > 0."]
    tbs, n = _get(cfg, "data.train_batch_size"), _get(cfg, f"{A}.rollout.n")
    if tbs * n % world:
        errors.append(f"data.train_batch_size={tbs} x {A}.rollout.n={n} = {tbs * n} sequences is not divisible by "
                      f"world size {world} (trainer.nnodes x trainer.n_gpus_per_node).")
    gen = _get(cfg, "data.gen_batch_size")
    if _get(cfg, "algorithm.filter_groups.enable") and gen is not None and gen * n % world:
        errors.append(f"data.gen_batch_size={gen} x {A}.rollout.n={n} = {gen * n} sequences is not divisible by "
                      f"world size {world} (trainer.nnodes x trainer.n_gpus_per_node).")
    errors += _micro_errors(cfg, _PPO_MICRO)
    errors += sequence_parallel_errors(cfg, world, critic=use_critic(cfg), ref=need_ref(cfg))
    errors += _mini_batch_errors(cfg, f"{A}.actor", f"{A}.rollout.n", world, "fsdp_config")
    errors += prefix_grouper_errors(cfg, ref=need_ref(cfg))
    if use_critic(cfg):
        errors += _mini_batch_errors(cfg, "critic", "critic.rollout_n", world, "fsdp")
    return errors + vllm_tp_errors(cfg, world)


def vllm_tp_errors(cfg: DictConfig, world: int) -> list[str]:
    """vLLM's rule: ``rollout.tensor_model_parallel_size`` divides the world size (rollout.name=vllm only)."""
    tp = _get(cfg, f"{A}.rollout.tensor_model_parallel_size")
    if _get(cfg, f"{A}.rollout.name") == "vllm" and tp and world % tp:
        return [f"{A}.rollout.tensor_model_parallel_size={tp} does not divide world size {world}."]
    return []


def _raise(errors: list[str]) -> None:
    if errors:
        raise ConfigError("Invalid config:\n  - " + "\n  - ".join(errors))


def validate_ppo_config(cfg: DictConfig, world_size: int | None = None) -> None:
    """Validate a resolved PPO config; raise ConfigError listing every broken rule.

    ``world_size`` defaults to ``trainer.nnodes * trainer.n_gpus_per_node``. Deprecated global
    micro-batch keys are read as ``global // world_size`` but not rewritten (load_config does that).
    """
    world = world_size if world_size is not None else world_size_of(cfg)
    errors = ppo_static_errors(cfg)
    if not errors:  # resource rules assume the basic sizes are sane
        errors = ppo_resource_errors(cfg, world)
    if world > 0 and vllm_tp_errors(cfg, world):  # a rule of vLLM's: when vLLM is missing, say that first
        from .notices import engine_errors
        errors = engine_errors(cfg) + errors
    _raise(errors)


def validate_sft_config(cfg: DictConfig, world_size: int | None = None) -> None:
    """Validate a resolved SFT config (verl fsdp_sft_trainer's asserts); raise ConfigError.

    train_batch_size is split over ``world_size`` workers and each share over micro-batches of
    ``data.micro_batch_size_per_gpu``; ratios must lie in [0, 1].
    """
    world = world_size if world_size is not None else world_size_of(cfg)
    errors = _micro_errors(cfg, _SFT_MICRO)
    tbs = _get(cfg, "data.train_batch_size")
    micro = _get(cfg, "data.micro_batch_size_per_gpu")
    if micro is None and _get(cfg, "data.micro_batch_size") is not None:
        micro = _get(cfg, "data.micro_batch_size") // max(world, 1)
    if tbs is None or tbs <= 0 or world <= 0:
        errors.append(f"data.train_batch_size={tbs} and world size {world} must be > 0.")
    elif tbs % world:
        errors.append(f"data.train_batch_size={tbs} is not divisible by world size {world}.")
    elif micro and not _get(cfg, "data.use_dynamic_bsz") and (tbs // world) % micro:
        errors.append(f"data.train_batch_size={tbs} / world size {world} = {tbs // world} per worker is not "
                      f"divisible by data.micro_batch_size_per_gpu={micro}.")
    errors += finite_errors(cfg, (("optim.lr", 0, True, _LR),)) + section_errors(cfg, "sft_trainer")
    errors += [f"trainer.{k}={_get(cfg, 'trainer.' + k)!r}: use a number of steps or after_each_epoch."
               for k in ("save_freq", "test_freq") if isinstance(_get(cfg, "trainer." + k), str)
               and _get(cfg, "trainer." + k) != "after_each_epoch"]
    if _get(cfg, "data.use_dynamic_bsz") and (_get(cfg, "data.max_token_len_per_gpu") or 0) <= 0:
        errors.append(f"data.use_dynamic_bsz=True needs data.max_token_len_per_gpu > 0, got "
                      f"{_get(cfg, 'data.max_token_len_per_gpu')}.")
    sp = int(cfg.ulysses_sequence_parallel_size)  # engine.ulysses_sequence_parallel_size is its alias
    if sp > 1:
        if world > 0 and world % sp:
            errors.append(f"ulysses_sequence_parallel_size={sp} does not divide world size {world}.")
        if not _get(cfg, "use_remove_padding") and _get(cfg, "data.pad_mode") != "no_padding":
            errors.append(f"ulysses_sequence_parallel_size={sp} needs use_remove_padding=True (or "
                          "data.pad_mode=no_padding): Ulysses splits the packed sequence.")
    if (_get(cfg, "data.max_length") or 0) <= 0:
        errors.append(f"data.max_length={_get(cfg, 'data.max_length')} must be > 0.")
    _raise(errors)


def validate_generation_config(cfg: DictConfig) -> None:
    """verl ``main_generation``'s rules, at load: ``data.n_samples >= 1``; ``rollout.temperature == 0`` only with
    ``data.n_samples == 1`` (greedy decoding gives one response; ``rollout.do_sample=False`` is the way to ask for
    greedy copies); ``data.batch_size``, ``rollout.prompt_length`` and ``rollout.response_length`` positive.

    Raises:
        ConfigError: one line per broken rule, naming the keys and values.
    """
    data, rollout = cfg.data, cfg.rollout
    errors = [f"{key}={value!r} must be >= 1" for key, value in (
        ("data.n_samples", data.n_samples), ("data.batch_size", data.batch_size),
        ("rollout.prompt_length", rollout.prompt_length), ("rollout.response_length", rollout.response_length))
        if int(value) < 1]
    if float(rollout.temperature) == 0.0 and int(data.n_samples) != 1:
        errors.append(f"rollout.temperature=0 needs data.n_samples=1 (got {data.n_samples}), as in verl's "
                      "main_generation; set rollout.do_sample=False for greedy decoding")
    if errors:
        raise ConfigError("Invalid config:\n  - " + "\n  - ".join(errors))
