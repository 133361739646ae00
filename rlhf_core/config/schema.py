"""The typed schema behind the YAML files in configs/.

Design decision: the shipped YAML is the single place where keys and defaults live (it mirrors
verl's YAML, one comment per key). The schema is derived from it plus the small tables below:

* type of a key = type of its (resolved) default; keys whose default is null, or that accept more
  than one type, are listed in ``TYPES``;
* ``CHOICES``: the allowed string values of enum-like keys;
* ``SUPPORT``: keys accepted only at the listed values (backends we do not have yet: Megatron,
  sglang, sequence parallelism, multimodal...). Any other value fails with "not supported yet";
* ``OPEN_PATHS``: free-form dicts whose sub-keys are not checked (HF config overrides, engine kwargs);
* ``EFFECT``: keys accepted at any value whose effect is limited — ``NO_EFFECT_ON_CPU`` (acts on CUDA
  only) or ``NO_EFFECT_YET`` (read by nothing: an optimisation we do not have, same outputs). Every other
  key is "supported", and tests/integration/test_config_reads_e2e.py checks that real runs read it by full path.

The typed structured config (dataclasses registered with OmegaConf) is built from the YAML plus these tables
by structured.py; a loaded config is that typed tree.

This catches a typo (unknown key, wrong type, value outside an enum) with a message naming the key, before the
values are merged into the typed config, and without a second copy of every default that could drift.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable

from omegaconf import DictConfig, ListConfig, OmegaConf

from .errors import ConfigError
from .generation_keys import GEN_CHOICES, GEN_EFFECT, GEN_NULL_OK, GEN_SUPPORT, GEN_TYPES
from .status06 import (BACKEND_VALUES, CHOICES06, EFFECT06, EFFECT_IN, NO_EFFECT_ON_CPU, NO_EFFECT_YET, OPEN06,
                       SUPPORT06)

_KL = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
KL_TYPES = _KL + tuple(k + "+" for k in _KL if k != "full")
ADV_ESTIMATORS = ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                  "rloo", "rloo_vectorized", "grpo_vectorized", "remax", "opo", "grpo_passk", "gpg")
POLICY_LOSS_MODES = ("vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean")
LOGGERS = ("console", "mlflow", "tensorboard", "file", "wandb", "swanlab", "trackio")
CKPT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
DTYPES = ("fp32", "bf16", "fp16", "float32", "bfloat16", "float16")
_SCHED = ("constant", "cosine")
_A = "actor_rollout_ref."

# Sections with a per-role ``profiler`` block (rlhf_core/workers/profiler.py).
_PROFILED = (_A + "actor", _A + "ref", _A + "rollout", "critic", "reward_model")
_PROFILER_TOOLS = ((None, "torch"), "the nsys (NVIDIA Nsight Systems), npu (Ascend) and torch_memory (CUDA memory "
                                    "snapshot) profilers; tool torch writes torch.profiler traces")
# Keys whose default is null or which accept several types: path -> allowed python types.
_INT, _FLOAT, _STR = (int,), (int, float), (str,)
TYPES: dict[str, tuple] = {
    "data.train_files": (str, list), "data.val_files": (str, list),
    "data.seed": _INT, "data.val_batch_size": _INT, "data.tokenizer": _STR, "data.custom_cls.path": _STR,
    "data.custom_cls.name": _STR, "data.micro_batch_size": _INT, "data.sampler.class_path": _STR,
    "data.sampler.class_name": _STR, "data.datagen.path": _STR, "data.datagen.name": _STR,
    "data.prompt_dict_keys": (list, str), "data.response_dict_keys": (list, str),
    "data.chat_template": _STR, "trainer.logger": (list, str),
    _A + "model.external_lib": _STR, _A + "model.custom_chat_template": _STR,
    _A + "actor.ppo_micro_batch_size": _INT, _A + "actor.data_loader_seed": _INT,
    _A + "actor.rollout_is_threshold": _FLOAT, _A + "actor.rollout_is_threshold_lower": _FLOAT,
    _A + "ref.log_prob_micro_batch_size": _INT, _A + "rollout.log_prob_micro_batch_size": _INT,
    _A + "rollout.top_p": _FLOAT, _A + "rollout.temperature": _FLOAT,
    _A + "rollout.val_kwargs.temperature": _FLOAT, _A + "rollout.val_kwargs.top_p": _FLOAT,
    _A + "actor.optim.lr_decay_steps": _INT, _A + "actor.optim.lr_wsd_decay_steps": _INT,
    "critic.ppo_micro_batch_size": _INT, "critic.ppo_micro_batch_size_per_gpu": _INT,
    "critic.forward_micro_batch_size": _INT, "critic.forward_micro_batch_size_per_gpu": _INT,
    "critic.optim.min_lr_ratio": _FLOAT, _A + "actor.optim.warmup_style": _STR, "critic.optim.warmup_style": _STR, "critic.model.external_lib": _STR,
    "reward_model.micro_batch_size": _INT, "reward_model.max_length": _INT,
    "reward_model.model.input_tokenizer": _STR, "reward_model.model.external_lib": _STR,
    "custom_reward_function.path": _STR, "algorithm.rollout_is_threshold": _FLOAT,
    "algorithm.rollout_is_threshold_lower": _FLOAT, "trainer.total_training_steps": _INT,
    "trainer.validation_data_dir": _STR, "trainer.rollout_data_dir": _STR,
    "trainer.max_actor_ckpt_to_keep": _INT, "trainer.max_critic_ckpt_to_keep": _INT,
    "trainer.max_ckpt_to_keep": _INT, "trainer.stop_after_step": _INT,
    "trainer.total_training_seconds": _FLOAT,
    "trainer.default_hdfs_dir": _STR, "trainer.resume_from_path": _STR,
    "ray_init.num_cpus": _INT, "ray_init.address": _STR, "ray_init.timeline_json_file": _STR,
    "output.samples_dir": _STR,
    _A + "model.target_modules": (str, list), "critic.model.target_modules": (str, list),
    "model.target_modules": (str, list), _A + "rollout.seed": _INT,
    "critic.enable": (bool,),
    _A + "rollout.over_sample_rate": _FLOAT, "global_profiler.tool": _STR, "global_profiler.steps": (list,),
    "global_profiler.save_path": _STR,
    **{p + ".profiler." + k: t for p in _PROFILED for k, t in (("tool", _STR), ("save_path", _STR))},
    _A + "actor.fsdp_config.cpu_threads": _INT, "critic.model.fsdp_config.cpu_threads": _INT,
    "reward_model.model.fsdp_config.cpu_threads": _INT, "model.fsdp_config.cpu_threads": _INT,
}
# Keys with a non-null default that may nevertheless be set to null (verl documents null for them).
NULL_OK = {
    "data.seed", "data.val_files", "reward_model.model.input_tokenizer",
    _A + "actor.ppo_micro_batch_size_per_gpu", _A + "ref.log_prob_micro_batch_size_per_gpu",
    _A + "rollout.log_prob_micro_batch_size_per_gpu", "reward_model.micro_batch_size_per_gpu",
    "data.micro_batch_size_per_gpu", _A + "actor.clip_ratio_low", _A + "actor.clip_ratio_high",
    "critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu",
}

CHOICES: dict[str, tuple] = {
    "data.truncation": ("error", "left", "right", "middle"),
    _A + "actor.kl_loss_type": KL_TYPES, "algorithm.kl_penalty": KL_TYPES,
    "algorithm.adv_estimator": ADV_ESTIMATORS, "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    _A + "actor.loss_agg_mode": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum-norm"),
    _A + "actor.rollout_is_level": ("token", "sequence", "geometric"),
    "algorithm.rollout_is_level": ("token", "sequence", "geometric"),
    _A + "actor.rollout_is_mode": ("truncate", "mask"), "algorithm.rollout_is_mode": ("truncate", "mask"),
    _A + "actor.optim.lr_scheduler_type": _SCHED, "critic.optim.lr_scheduler_type": _SCHED,
    _A + "actor.optim.optimizer": ("adam", "adamw"), _A + "actor.policy_loss.loss_mode": POLICY_LOSS_MODES,
    _A + "model.fused_kernel_options.impl_backend": ("torch", "triton"),
    _A + "actor.fsdp_config.model_dtype": DTYPES, _A + "ref.fsdp_config.model_dtype": DTYPES,
    "critic.model.fsdp_config.model_dtype": DTYPES, "model.fsdp_config.model_dtype": DTYPES,
    **{f"{sec}.mixed_precision.{k}": DTYPES for sec in (_A + "actor.fsdp_config", _A + "ref.fsdp_config",
                                                     "critic.model.fsdp_config")
       for k in ("param_dtype", "reduce_dtype", "buffer_dtype")},
    _A + "rollout.dtype": DTYPES + ("auto",), "reward_model.reward_manager": ("naive", "prime", "dapo"),
    "trainer.resume_mode": ("auto", "disable", "resume_path"), "trainer.device": ("auto", "cpu", "cuda"),
    "optim.lr_scheduler": ("cosine", "wsd"),
    "algorithm.pf_ppo.reweight_method": ("pow", "max_min", "max_random"),
}
SFT_CHOICES = {"data.truncation": ("error", "left", "right")}
LIST_CHOICES: dict[str, tuple] = {
    "trainer.logger": LOGGERS, _A + "actor.checkpoint.save_contents": CKPT_CONTENTS,
    _A + "actor.checkpoint.load_contents": CKPT_CONTENTS, "critic.checkpoint.save_contents": CKPT_CONTENTS,
    "critic.checkpoint.load_contents": CKPT_CONTENTS, "trainer.checkpoint.save_contents": CKPT_CONTENTS,
    "trainer.checkpoint.load_contents": CKPT_CONTENTS,
}

_FSDP = ("fsdp", "fsdp2")
_MEG = "Megatron-only optimizer key"
_FSDP_ONLY = "only FSDP backends; Megatron is a backend this project does not have"
# path -> (allowed values, why other values are refused)
SUPPORT: dict[str, tuple[tuple, str]] = {
    _A + "hybrid_engine": ((True,), "only the hybrid engine is supported"),
    _A + "actor.strategy": (_FSDP, _FSDP_ONLY), _A + "ref.strategy": (_FSDP, _FSDP_ONLY),
    "critic.strategy": (_FSDP, _FSDP_ONLY), "reward_model.strategy": (_FSDP, _FSDP_ONLY),
    "model.strategy": (_FSDP, _FSDP_ONLY),
    _A + "model.override_config.moe_config.freeze_moe_router": ((False,), "Megatron only"),
    _A + "model.use_fused_kernels": ((False,), "fused kernels"),
    "reward_model.model.use_fused_kernels": ((False,), "fused kernels"),
    _A + "model.use_shm": ((False,), "shared-memory model loading"),
    "data.use_shm": ((False,), "shared-memory data loading"),
    _A + "actor.ulysses_sequence_parallel_size": ((1,), "sequence parallelism"),
    _A + "ref.ulysses_sequence_parallel_size": ((1,), "sequence parallelism"),
    "critic.ulysses_sequence_parallel_size": ((1,), "sequence parallelism"),
    "reward_model.ulysses_sequence_parallel_size": ((1,), "sequence parallelism"),
    "ulysses_sequence_parallel_size": ((1,), "sequence parallelism"),
    "data.image_key": (("images",), "multimodal data"),
    _A + "rollout.name": (("hf", "vllm"), "rollout engines other than hf and vllm (e.g. sglang)"),
    _A + "rollout.mode": (("sync", "async"), "a rollout mode other than sync or async (agent loop)"),
    _A + "rollout.engine_kwargs.sglang": (({},), "sglang"),
    _A + "rollout.agent.custom_async_server.path": ((None,), "custom async servers"),
    _A + "rollout.agent.custom_async_server.name": ((None,), "custom async servers"),
    _A + "actor.optim.clip_grad": ((1.0,), _MEG + "; set actor_rollout_ref.actor.grad_clip"),
    _A + "actor.optim.lr_warmup_init": ((0.0,), _MEG + "; FSDP warmup is linear from 0"),
    _A + "actor.optim.lr_decay_steps": ((None,), _MEG),
    _A + "actor.optim.lr_decay_style": (("constant",), _MEG + "; set lr_scheduler_type"),
    _A + "actor.optim.min_lr": ((0.0,), _MEG + "; set min_lr_ratio"),
    _A + "actor.optim.weight_decay_incr_style": (("constant",), _MEG),
    _A + "actor.optim.lr_wsd_decay_style": (("exponential",), _MEG),
    _A + "actor.optim.lr_wsd_decay_steps": ((None,), _MEG),
    _A + "actor.optim.use_checkpoint_opt_param_scheduler": ((False,), _MEG),
    "global_profiler.tool": _PROFILER_TOOLS,
}
_ACT_OFF = "on CUDA the training forward runs under save_on_cpu(pin_memory=True); on CPU activations already live in host memory"
_COMPILE = ("on CUDA the log-prob/entropy functions are torch.compile-d; on CPU they run eagerly, logged once: "
            "compiling costs more than it saves on a few cores")
_OFFLOAD = "CPUOffloadPolicy on CUDA; on CPU the weights already live in host memory"
_PREFETCH = "FSDP2's default prefetching is used; performance only"
# path -> (status, what happens instead). Keys accepted at any value but with limited effect.
EFFECT: dict[str, tuple[str, str]] = {
    _A + "model.enable_activation_offload": (NO_EFFECT_ON_CPU, _ACT_OFF),
    "critic.model.enable_activation_offload": (NO_EFFECT_ON_CPU, _ACT_OFF),
    _A + "actor.use_torch_compile": (NO_EFFECT_ON_CPU, _COMPILE),
    _A + "ref.use_torch_compile": (NO_EFFECT_ON_CPU, _COMPILE),
    _A + "actor.fsdp_config.param_offload": (NO_EFFECT_ON_CPU, _OFFLOAD),
    _A + "actor.fsdp_config.optimizer_offload": (NO_EFFECT_ON_CPU, _OFFLOAD),
    _A + "actor.fsdp_config.offload_policy": (NO_EFFECT_ON_CPU, _OFFLOAD),
    _A + "ref.fsdp_config.param_offload": (NO_EFFECT_ON_CPU, _OFFLOAD),
    "critic.model.fsdp_config.param_offload": (NO_EFFECT_ON_CPU, _OFFLOAD),
    "critic.model.fsdp_config.optimizer_offload": (NO_EFFECT_ON_CPU, _OFFLOAD),
    "reward_model.model.fsdp_config.param_offload": (NO_EFFECT_ON_CPU, _OFFLOAD),
    "model.fsdp_config.cpu_offload": (NO_EFFECT_ON_CPU, _OFFLOAD),
    "model.fsdp_config.offload_params": (NO_EFFECT_ON_CPU, _OFFLOAD),
    _A + "model.fused_kernel_options.impl_backend": (NO_EFFECT_YET, "fused kernels are not supported yet"),
    _A + "model.custom_chat_template": (NO_EFFECT_YET, "the tokenizer's chat template is used"),
    _A + "actor.entropy_from_logits_with_chunking": (NO_EFFECT_YET, "entropy is always computed in 1024-row chunks"),
    _A + "actor.entropy_checkpointing": (NO_EFFECT_YET, "entropy activations are stored; same outputs"),
    _A + "actor.fsdp_config.forward_prefetch": (NO_EFFECT_YET, _PREFETCH),
    _A + "ref.fsdp_config.forward_prefetch": (NO_EFFECT_YET, _PREFETCH),
    _A + "rollout.free_cache_engine": (NO_EFFECT_YET, "the vLLM engine is not put to sleep between rollouts: "
                                                      "sleep/wake_up is untested here; CPU has nothing to free"),
    _A + "rollout.load_format": (NO_EFFECT_YET, "the rollout engine loads the model, then gets the actor's weights"),
    "reward_model.launch_reward_fn_async": (NO_EFFECT_YET, "the reward function runs synchronously; same scores"),
    "ray_init.timeline_json_file": (NO_EFFECT_YET, "no Ray timeline is written"),
    "data.multiturn.tools_key": (NO_EFFECT_YET, "tool schemas are not passed to the chat template"),
    "data.multiturn.enable_thinking_key": (NO_EFFECT_YET, "no per-row enable_thinking flag"),
    "data.balance_dp_token": (NO_EFFECT_YET, "ranks get equal sample counts"),
    "model.use_liger": (NO_EFFECT_YET, "Liger kernels are not applied; same loss"),
    # found by tests/integration/test_config_reads_e2e.py: no code reads these
    _A + "actor.optim.optimizer": (NO_EFFECT_YET, "adam and adamw both build torch.optim.AdamW"),
}
OPEN_PATHS = (_A + "model.override_config.model_config", _A + "rollout.engine_kwargs.vllm",
              "critic.model.override_config", "reward_model.reward_kwargs", "custom_reward_function.reward_kwargs",
              "data.apply_chat_template_kwargs", *OPEN06)
# verl 0.6.0's keys beyond the reference (rlhf_core/config/status06.py)
SUPPORT.update(SUPPORT06)
EFFECT.update(EFFECT06)
CHOICES.update(CHOICES06)
# configs/generation.yaml's keys (rlhf_core/config/generation_keys.py)
TYPES.update(GEN_TYPES)
NULL_OK.update(GEN_NULL_OK)
CHOICES.update(GEN_CHOICES)
SUPPORT.update(GEN_SUPPORT)
EFFECT_IN["generation"] = GEN_EFFECT


def is_open(path: str) -> bool:
    """True when ``path`` lies strictly inside a free-form dict (its sub-keys are not checked)."""
    return any(path.startswith(p + ".") for p in OPEN_PATHS)


def flatten(cfg: DictConfig, resolve: bool = True, prefix: str = "") -> dict[str, Any]:
    """Map every leaf (and empty dict) of ``cfg`` to its dotted path; lists are leaves."""
    out: dict[str, Any] = {}
    container = OmegaConf.to_container(cfg, resolve=resolve) if isinstance(cfg, DictConfig) else cfg
    for key, value in container.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in OPEN_PATHS:
            out.update(flatten(value, resolve, path + "."))
        else:
            out[path] = value
    return out


def all_paths(cfg: DictConfig) -> list[str]:
    """Every dotted path in ``cfg``: leaves and the intermediate nodes."""
    paths: set[str] = set()
    for leaf in flatten(cfg, resolve=False):
        parts = leaf.split(".")
        paths.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return sorted(paths)


def nearest_key(path: str, candidates: Iterable[str]) -> str | None:
    """The valid key closest to a mistyped ``path`` (difflib), or None when nothing is close.

    Tries the whole dotted path first, then the last component against keys with the same
    parent, then the last component against every key's last component.
    """
    cands = list(candidates)
    hit = difflib.get_close_matches(path, cands, n=1, cutoff=0.75)
    if hit:
        return hit[0]
    parent, _, leaf = path.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in cands if c.rpartition(".")[0] == parent}
    hit = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6)
    if hit:
        return siblings[hit[0]]
    leaves: dict[str, str] = {}
    for c in cands:
        leaves.setdefault(c.rpartition(".")[2], c)
    hit = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75)
    return leaves[hit[0]] if hit else None


# A path component that names a backend we do not have -> that backend (for unknown keys of verl's other configs).
FOREIGN_BACKENDS = {"megatron": "Megatron", "sglang": "sglang", "npu": "Ascend NPU",
                    "nsys": "NVIDIA Nsight Systems (nsys)"}


def nearest_keys(path: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` valid keys close to a mistyped ``path``, the closest first (see :func:`nearest_key`)."""
    cands = list(candidates)
    best = nearest_key(path, cands)
    out = [best] if best else []
    out += difflib.get_close_matches(path, cands, n=n + 1, cutoff=0.6)
    parent, _, leaf = path.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in cands if c.rpartition(".")[0] == parent}
    out += [siblings[h] for h in difflib.get_close_matches(leaf, list(siblings), n=n, cutoff=0.6)]
    return list(dict.fromkeys(out))[:n]


def foreign_backend(path: str) -> str | None:
    """The backend we do not have that a key belongs to (a component named megatron, sglang, npu, nsys), or None."""
    return next((FOREIGN_BACKENDS[p] for p in path.split(".") if p in FOREIGN_BACKENDS), None)


def unknown_key_error(path: str, candidates: Iterable[str], hint: str = "") -> ConfigError:
    """A ConfigError for an unknown key that names the nearest valid keys, and the backend when the key
    belongs to one we do not have (``actor_rollout_ref.actor.megatron.*`` names Megatron)."""
    near = nearest_keys(path, candidates)
    msg = f"Unknown config key '{path}'."
    backend = foreign_backend(path)
    if backend:
        msg += f" It is read only by verl's {backend} backend, which this project does not have."
    msg += f" Did you mean '{near[0]}'?" if near else " No similar key exists."
    if len(near) > 1:
        msg += " Other close keys: " + ", ".join(f"'{k}'" for k in near[1:]) + "."
    return ConfigError(msg + hint)


def _type_name(types: tuple) -> str:
    return " or ".join(t.__name__ for t in types)


def _check_type(path: str, value: Any, default: Any) -> tuple[str | None, Any]:
    """Return (error or None, value with numbers coerced to str for str-typed keys)."""
    if path in TYPES:
        types = TYPES[path]
    elif default is None:
        return None, value
    else:
        types = {bool: (bool,), int: _INT, float: _FLOAT, str: _STR, list: (list,),
                 dict: (dict,)}.get(type(default), (type(default),))
    if value is None:
        ok = default is None or path in NULL_OK
        return (None if ok else f"{path}=null: this key cannot be null (expected {_type_name(types)})"), value
    if isinstance(value, bool) and bool not in types:
        return f"{path}={value!r}: expected {_type_name(types)}, got a bool", value
    if isinstance(value, types):
        return None, value
    if str in types and isinstance(value, (int, float)):
        return None, str(value)  # a name like experiment_name=123 is a string, as in a structured config
    return f"{path}={value!r}: expected {_type_name(types)}, got {type(value).__name__}", value


def _check_value(path: str, value: Any, sft: bool) -> list[str]:
    errors = []
    choices = (SFT_CHOICES if sft else {}).get(path) or CHOICES.get(path)
    if choices and value not in choices and value is not None:
        near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        errors.append(f"{path}={value!r} is not one of {list(choices)}.{hint}")
    if path in LIST_CHOICES:
        items = [value] if isinstance(value, str) else (value or [])
        bad = [v for v in items if v not in LIST_CHOICES[path]]
        if bad:
            errors.append(f"{path}: {bad} not among the allowed values {list(LIST_CHOICES[path])}")
    return errors


def _same(value: Any, allowed: Any) -> bool:
    if isinstance(value, bool) or isinstance(allowed, bool):
        return type(value) is type(allowed) and value == allowed
    return value == allowed


def check_support(cfg: DictConfig) -> list[str]:
    """Error lines for keys of backends we do not have yet that are set away from their default, and for
    values (``BACKEND_VALUES``) that need such a backend; each line names the backend."""
    errors = []
    for path, needs in BACKEND_VALUES.items():
        value = OmegaConf.select(cfg, path, default=None)
        if isinstance(value, str) and value in needs:
            errors.append(f"{path}={value!r} needs {needs[value]}, a backend this project does not have; "
                          f"use one of {[v for v in CHOICES.get(path, ()) if v not in needs]} or null")
    for path, (allowed, why) in SUPPORT.items():
        node = OmegaConf.select(cfg, path, default="<absent>")
        if isinstance(node, str) and node == "<absent>":
            continue
        value = OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node
        if not any(_same(value, a) for a in allowed):
            errors.append(f"{path}={value!r} is not supported yet ({why}); accepted: {list(allowed)}")
    return errors


def check_schema(cfg: DictConfig, base: DictConfig, sft: bool = False) -> list[str]:
    """Check every known key of resolved ``cfg`` against the schema derived from ``base``.

    Types (from the default or ``TYPES``), enum choices, and backend support are checked; keys
    added with '+' (absent from ``base``) and keys inside ``OPEN_PATHS`` are not. Numbers given
    for string keys are converted to strings in ``cfg``. Returns the list of error lines.
    """
    defaults = flatten(base, resolve=True)
    values = flatten(cfg, resolve=True)
    errors: list[str] = []
    for path, value in values.items():
        if path not in defaults:
            continue
        err, fixed = _check_type(path, value, defaults[path])
        if err:
            errors.append(err)
            continue
        if fixed is not value:
            OmegaConf.update(cfg, path, fixed, merge=False)
        errors.extend(_check_value(path, value, sft))
    return errors + check_support(cfg)

