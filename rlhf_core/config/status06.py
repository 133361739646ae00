"""Statuses of the keys verl 0.6.0's full configs add beyond the reference (see schema.py for the meaning).

Kept apart from schema.py's tables so the two merge easily; schema.py folds these into ``SUPPORT`` and
``EFFECT``. Rules: a key we have no code for is never "supported"; a key for a backend we do not have
(Megatron, sglang, Ascend NPU, NVIDIA Nsight Systems, multimodal) is "default only" and its message names
that backend; every other unread key is "accepted, no effect yet" with what happens instead.

The accepted keys without effect (``EFFECT06``) are data, one line per key, in ``status06_effects.yaml`` next to this
module: status -> what happens instead -> keys. A reason starting "no code reads it yet" marks keys that get their
effect from work merged at the same time: they are "accepted, no effect yet" until that work flips them to
supported.
"""

from __future__ import annotations

from pathlib import Path

import yaml

NO_EFFECT_ON_CPU = "no effect on CPU"
NO_EFFECT_YET = "accepted, no effect yet"

_A = "actor_rollout_ref."
_ROLES = (_A + "actor", _A + "ref", _A + "rollout", "critic", "reward_model")
_NSYS = "NVIDIA Nsight Systems (nsys) profiling, a backend we do not have"
_NPU = "Ascend NPU profiling, a backend we do not have"
_MM = "multimodal models, which we do not have yet"
_SHM = "shared-memory model loading"
_FSDP = ("fsdp", "fsdp2")
_FSDP_ONLY = "only FSDP backends; Megatron is a backend this project does not have"

# path -> (allowed values, why other values are refused)
SUPPORT06: dict[str, tuple[tuple, str]] = {
    _A + "actor.freeze_vision_tower": ((False,), _MM),
    _A + "actor.use_fused_kernels": ((False,), "fused kernels"),
    "data.video_key": (("videos",), _MM),
    "data.return_multi_modal_inputs": ((True,), _MM),
    "model.use_shm": ((False,), _SHM), "critic.model.use_shm": ((False,), _SHM),
    "reward_model.model.use_shm": ((False,), _SHM),
    _A + "ref.model": ((None,), "a separate reference model config (verl's new engine workers); the reference "
                               "is built from actor_rollout_ref.model"),
    _A + "rollout.data_parallel_size": ((1,), "vLLM data-parallel rollout engines"),
    _A + "rollout.expert_parallel_size": ((1,), "vLLM expert-parallel rollout engines"),
    _A + "rollout.pipeline_model_parallel_size": ((1,), "vLLM pipeline-parallel rollout engines"),
    "reward_model.enable_resource_pool": ((False,), "a separate Ray resource pool for the reward model; it runs "
                                                    "next to the actor"),
    "reward_model.sandbox_fusion.url": ((None,), "the Sandbox Fusion code-execution service"),
    "critic.optim.clip_grad": ((1.0,), "verl's new-engine spelling; set critic.grad_clip"),
}
for _r in (_A + "actor", _A + "ref", "critic.model"):
    SUPPORT06[f"{_r}.fsdp_config.ulysses_sequence_parallel_size"] = ((1,), "sequence parallelism")
    SUPPORT06[f"{_r}.fsdp_config.strategy"] = (_FSDP, _FSDP_ONLY)
for _r in _ROLES:
    _t = f"{_r}.profiler.tool_config"
    SUPPORT06[f"{_t}.nsys.discrete"] = ((False,), _NSYS)
    SUPPORT06[f"{_t}.npu.contents"] = (([],), _NPU)
    SUPPORT06[f"{_t}.npu.level"] = (("level1",), _NPU)
    SUPPORT06[f"{_t}.npu.analysis"] = ((True,), _NPU)
    SUPPORT06[f"{_t}.npu.discrete"] = ((False,), _NPU)
_G = "global_profiler.global_tool_config.nsys."
SUPPORT06.update({
    _G + "discrete": ((False,), _NSYS),
    _G + "controller_nsight_options.trace": (("cuda,nvtx,cublas,ucx",), _NSYS),
    _G + "controller_nsight_options.cuda-memory-usage": (("true",), _NSYS),
    _G + "controller_nsight_options.cuda-graph-trace": (("graph",), _NSYS),
    _G + "worker_nsight_options.trace": (("cuda,nvtx,cublas,ucx",), _NSYS),
    _G + "worker_nsight_options.cuda-memory-usage": (("true",), _NSYS),
    _G + "worker_nsight_options.cuda-graph-trace": (("graph",), _NSYS),
    _G + "worker_nsight_options.capture-range": (("cudaProfilerApi",), _NSYS),
    _G + "worker_nsight_options.capture-range-end": ((None,), _NSYS),
    _G + "worker_nsight_options.kill": (("none",), _NSYS),
})

# Values of otherwise accepted keys that need a backend we do not have: path -> {value: backend}.
BACKEND_VALUES: dict[str, dict[object, str]] = {
    "global_profiler.tool": {"nsys": "NVIDIA Nsight Systems (nsys)", "npu": "the Ascend NPU profiler"},
}
for _r in _ROLES:
    BACKEND_VALUES[f"{_r}.profiler.tool"] = BACKEND_VALUES["global_profiler.tool"]

EFFECTS06_FILE = Path(__file__).with_name("status06_effects.yaml")


def load_effects(path: Path = EFFECTS06_FILE) -> dict[str, tuple[str, str]]:
    """The accepted keys without effect, path -> (status, what happens instead), from the data file ``path``
    (``status -> what happens instead -> [keys]``; see the file's header).

    Raises:
        ValueError: naming the file and the entry, for a status other than ``NO_EFFECT_YET`` / ``NO_EFFECT_ON_CPU``,
            a reason without a list of keys, or a key listed twice.
    """
    table: dict[str, tuple[str, str]] = {}
    for status, reasons in yaml.safe_load(path.read_text()).items():
        if status not in (NO_EFFECT_YET, NO_EFFECT_ON_CPU):
            raise ValueError(f"{path}: status {status!r} is not {NO_EFFECT_YET!r} or {NO_EFFECT_ON_CPU!r}")
        for why, keys in reasons.items():
            if not isinstance(keys, list) or not keys:
                raise ValueError(f"{path}: {status} / {why!r} needs a list of keys, got {keys!r}")
            for key in keys:
                if key in table:
                    raise ValueError(f"{path}: {key} is listed twice ({table[key][1]!r} and {why!r})")
                table[key] = (status, why)
    return table


# path -> (status, what happens instead)
EFFECT06: dict[str, tuple[str, str]] = load_effects()

# Per config file, where a path means something else than in ppo_trainer.yaml: name -> {path: (status, why)}.
EFFECT_IN: dict[str, dict[str, tuple[str, str]]] = {
    "evaluation": {"ray_kwargs.timeline_json_file": (NO_EFFECT_YET, "no Ray timeline is written")},
    "sft_trainer": {
        "data.train_max_samples": (NO_EFFECT_YET, "the SFT dataset uses every row of data.train_files"),
        "data.val_max_samples": (NO_EFFECT_YET, "the SFT dataset uses every row of data.val_files"),
    },
}

CHOICES06: dict[str, tuple] = {
    "global_profiler.tool": ("nsys", "npu", "torch", "torch_memory"),
    **{f"{_r}.profiler.tool": ("nsys", "npu", "torch", "torch_memory") for _r in _ROLES},
    "algorithm.pf_ppo.reweight_method": ("pow", "max_min", "max_random"),
    _A + "actor.optim.warmup_style": ("constant", "cosine"), "critic.optim.warmup_style": ("constant", "cosine"),
    "trainer.use_legacy_worker_impl": ("auto", "enable", "disable"),
    _A + "rollout.multi_turn.tool_response_truncate_side": ("left", "middle", "right"),
    _A + "rollout.multi_turn.tokenization_sanity_check_mode": ("strict", "ignore_strippable", "disable"),
    _A + "rollout.trace.backend": ("weave", "mlflow"),
}
# free-form dicts (sub-keys not checked)
OPEN06 = ("data.apply_chat_template_kwargs", "global_profiler.global_tool_config.torch_memory.kw_args")
