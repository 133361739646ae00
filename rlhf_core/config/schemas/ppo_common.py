"""Sections that appear under several roles of ppo_trainer.yaml: FSDP wrap policy and mixed precision, and the
per-role profiler (``ProfilerConfig`` for the actor, reference and critic; ``FollowerProfilerConfig`` for the rollout
and reward model, whose values follow the actor's through interpolations).

Generated once from the YAML; now the one source of these keys (see rlhf_core/config/spec.py). Edit here, then
run `python -m rlhf_core.config.gen_yaml` to rewrite rlhf_core/configs/*.yaml and docs/CONFIG_KEYS.md.
"""

from dataclasses import dataclass
from typing import Any, List, Optional

from rlhf_core.config.spec import check_section, key, number, section

_TOKEN = ("verl hands it to the vLLM/SGLang engine's own profiler (decode iterations to delay / to trace), which "
          "this project does not start; the HF rollout's decoding is traced whole in a profiled step")
_NO_MINI_BATCHES = ("a range of update mini-batches: the rollout and the reward model run none, and the actor/rollout "
                    "worker's trace reads the actor's block")
_CONTENTS = ('cpu', 'cuda', 'memory', 'shapes', 'stack')


@dataclass
class WrapPolicyConfig:
    """Sections ``actor_rollout_ref.actor.fsdp_config.wrap_policy``,
    ``actor_rollout_ref.ref.fsdp_config.wrap_policy``, ``critic.model.fsdp_config.wrap_policy``."""

    min_num_params: int = key(0, 'wrap modules with at least this many parameters; 0 = by decoder layer')


@dataclass
class MixedPrecisionConfig:
    """Sections ``actor_rollout_ref.actor.fsdp_config.mixed_precision``,
    ``actor_rollout_ref.ref.fsdp_config.mixed_precision``, ``critic.model.fsdp_config.mixed_precision``."""

    param_dtype: str = key('fp32',
        'dtype of the unsharded parameters in forward/backward: fp32 | bf16 | fp16 (fp32 = no cast; bf16 on '
        'GPU and AMX/AVX512-BF16 CPUs)',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16'))
    reduce_dtype: str = key('fp32', 'dtype gradients are reduced in',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16'))
    buffer_dtype: str = key('fp32', 'dtype of floating buffers (rotary inv_freq...)',
        choices=('fp32', 'bf16', 'fp16', 'float32', 'bfloat16', 'float16'))


# verl 0.9: profiler
@dataclass
class TorchScheduleConfig:
    """``<role>.profiler.tool_config.torch.schedule``: torch.profiler.schedule over the update mini-batches (each
    actor/critic update mini-batch advances it; rlhf_core/workers/torch_trace.py)."""

    skip_first: int = key(0, 'torch profiler schedule: update mini-batches skipped before the first cycle')
    wait: int = key(0, 'torch profiler schedule: idle mini-batches at the start of each cycle')
    warmup: int = key(0, 'torch profiler schedule: traced-but-dropped mini-batches per cycle')
    active: int = key(0, 'torch profiler schedule: recorded mini-batches per cycle; 0 = no schedule (record all)')
    repeat: int = key(0, 'torch profiler schedule: cycles; 0 = one per whole-step trace, all for a discrete update')

    def __post_init__(self) -> None:
        check_schedule(self)


def check_schedule(schedule) -> None:
    """Raise for a negative ``skip_first``/``wait``/``warmup``/``active``/``repeat`` (verl asserts the same)."""
    check_section([f"{{section}}.{k} must be >= 0, got {getattr(schedule, k)}." for k in
                   ("skip_first", "wait", "warmup", "active", "repeat")
                   if number(getattr(schedule, k)) and getattr(schedule, k) < 0])


@dataclass
class PrecisionDebuggerConfig:
    """``<role>.profiler.tool_config.precision_debugger`` (Ascend msprobe's PrecisionDebugger)."""

    config_path: Optional[str] = key('${oc.select:global_profiler.global_tool_config.precision_debugger.config_path,null}',
        'msprobe precision debugger: its JSON config (follows global_profiler)', only=(None,),
        why='the msprobe precision debugger (Ascend tooling), which this project does not have')
    steps: Any = key(None, 'msprobe precision debugger: deprecated step filter (global_profiler.steps decides)',
        only=(None,), why='the msprobe precision debugger (Ascend tooling), which this project does not have')
    stages: Any = key('${oc.select:global_profiler.global_tool_config.precision_debugger.stages,null}',
        'msprobe precision debugger: stages dumped; null = all (follows global_profiler)', only=(None,),
        why='the msprobe precision debugger (Ascend tooling), which this project does not have')
    strict: bool = key('${oc.select:global_profiler.global_tool_config.precision_debugger.strict,False}',
        'msprobe precision debugger: fail on an unknown stage (follows global_profiler)', only=(False,),
        why='the msprobe precision debugger (Ascend tooling), which this project does not have')


@dataclass
class NsysToolConfig:
    """Sections ``actor_rollout_ref.actor.profiler.tool_config.nsys``,
    ``actor_rollout_ref.ref.profiler.tool_config.nsys``, ``critic.profiler.tool_config.nsys``."""

    discrete: bool = key('${global_profiler.global_tool_config.nsys.discrete}',
        'Nsight Systems: one trace per task (NVIDIA nsys; default only)', only=(False,),
        why='NVIDIA Nsight Systems (nsys) profiling, a backend we do not have')


@dataclass
class NpuToolConfig:
    """Sections ``actor_rollout_ref.actor.profiler.tool_config.npu``,
    ``actor_rollout_ref.ref.profiler.tool_config.npu``, ``critic.profiler.tool_config.npu``."""

    contents: List[Any] = key([], 'Ascend NPU profiler: what to collect (NPU only; default only)',
        why='Ascend NPU profiling, a backend we do not have')
    level: str = key('level0', 'Ascend NPU profiler: collection level (NPU only; default only)',
        why='Ascend NPU profiling, a backend we do not have')
    analysis: bool = key(True, 'Ascend NPU profiler: parse the trace after collection (NPU only; default only)',
        why='Ascend NPU profiling, a backend we do not have')
    discrete: bool = key(False, 'Ascend NPU profiler: one trace per task (NPU only; default only)',
        why='Ascend NPU profiling, a backend we do not have')


@dataclass
class TorchToolConfig:
    """Sections ``actor_rollout_ref.actor.profiler.tool_config.torch``,
    ``actor_rollout_ref.ref.profiler.tool_config.torch``, ``critic.profiler.tool_config.torch``."""

    step_start: int = key(0, 'torch profiler: first update mini-batch traced in a profiled step (verl 0.6; used '
                          'when schedule.active is 0)')
    step_end: Any = key(None, 'torch profiler: update mini-batch after the last traced one; null = to the end',
                        types=(int,))
    # verl 0.9: profiler
    contents: List[str] = key([], 'torch profiler: what to record (cpu, cuda, memory, shapes, stack); [] = cpu+cuda',
        item_choices=_CONTENTS)
    discrete: bool = key(False, 'torch profiler: one trace per stage (worker call) instead of one per step')
    schedule: TorchScheduleConfig = section(TorchScheduleConfig, 'which update mini-batches are traced')

    def __post_init__(self) -> None:
        check_step_range(self.step_start, self.step_end)


def check_step_range(start, end) -> None:
    """Raise unless ``[step_start, step_end)`` is a range of mini-batches (``step_end`` null: to the end)."""
    check_section(["{section}.step_start must be >= 0, got %s." % start] if number(start) and start < 0 else
                  ["{section}.step_end must be > step_start, got step_start=%s, step_end=%s." % (start, end)]
                  if number(start) and number(end) and end <= start else [])


@dataclass
class TorchMemoryToolConfig:
    """Sections ``actor_rollout_ref.actor.profiler.tool_config.torch_memory``,
    ``actor_rollout_ref.ref.profiler.tool_config.torch_memory``, ``critic.profiler.tool_config.torch_memory``."""

    trace_alloc_max_entries: int = key('${global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries}',
        'torch memory snapshot: max allocation events recorded',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')
    stack_depth: int = key('${global_profiler.global_tool_config.torch_memory.stack_depth}',
        'torch memory snapshot: stack frames kept per event',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')
    memory_snapshot_num_steps: int = key('${global_profiler.global_tool_config.torch_memory.memory_snapshot_num_steps}',
        'torch memory snapshot: steps recorded per snapshot',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')


@dataclass
class ProfilerToolConfig:
    """Sections ``actor_rollout_ref.actor.profiler.tool_config``, ``actor_rollout_ref.ref.profiler.tool_config``,
    ``critic.profiler.tool_config``."""

    nsys: NsysToolConfig = section(NsysToolConfig)
    npu: NpuToolConfig = section(NpuToolConfig)
    torch: TorchToolConfig = section(TorchToolConfig)
    torch_memory: TorchMemoryToolConfig = section(TorchMemoryToolConfig)
    precision_debugger: PrecisionDebuggerConfig = section(PrecisionDebuggerConfig)


@dataclass
class ProfilerConfig:
    """``actor_rollout_ref.actor.profiler``, ``actor_rollout_ref.ref.profiler``, ``critic.profiler``."""

    tool: Optional[str] = key('${oc.select:global_profiler.tool,null}',
        'profiler of this role: null | torch | torch_memory | nsys | npu (follows global_profiler.tool)',
        choices=('nsys', 'npu', 'torch', 'torch_memory'),
        backend_values={'nsys': 'NVIDIA Nsight Systems (nsys)', 'npu': 'the Ascend NPU profiler',
                        'torch_memory': 'CUDA (a torch.cuda memory snapshot: no effect on CPU)'})
    enable: bool = key(False, 'profile this role in the steps listed in global_profiler.steps')
    all_ranks: bool = key(False, 'profile every rank of this role (False = only the ranks listed below)')
    ranks: List[Any] = key([], 'ranks to profile when all_ranks is False')
    save_path: str = key('${oc.select:global_profiler.save_path,null}',
        "folder for this role's traces (follows global_profiler.save_path)")
    tool_config: ProfilerToolConfig = section(ProfilerToolConfig, 'settings of each profiler tool')
    # verl 0.9: profiler
    relocate_results: bool = key('${global_profiler.relocate_results}',
        'move each trace out of save_path/step_<n>/ into save_path as step_<n>_<file> when its step ends')
    finish_hook_cmd: Optional[str] = key('${global_profiler.finish_hook_cmd}',
        'shell command run once after the last profiled step (env VERL_PROFILE_SAVE_PATH, '
        'VERL_PROFILE_TRACES...); killed after 900 s; a failure is a warning; null = none')
    finish_hook_all_ranks: bool = key('${global_profiler.finish_hook_all_ranks}',
        'run finish_hook_cmd on every rank (False = finish_hook_ranks)')
    finish_hook_ranks: List[Any] = key('${global_profiler.finish_hook_ranks}',
        'ranks that run finish_hook_cmd; [] (and finish_hook_all_ranks False) = the profiled ranks')


@dataclass
class FollowerNsysToolConfig:
    """``actor_rollout_ref.rollout.profiler.tool_config.nsys``, ``reward_model.profiler.tool_config.nsys``."""

    discrete: bool = key('${actor_rollout_ref.actor.profiler.tool_config.nsys.discrete}',
        'Nsight Systems: one trace per task (NVIDIA nsys; default only)', only=(False,),
        why='NVIDIA Nsight Systems (nsys) profiling, a backend we do not have')


@dataclass
class FollowerNpuToolConfig:
    """``actor_rollout_ref.rollout.profiler.tool_config.npu``, ``reward_model.profiler.tool_config.npu``."""

    contents: List[Any] = key('${actor_rollout_ref.actor.profiler.tool_config.npu.contents}',
        'Ascend NPU profiler: what to collect (NPU only; default only)', only=([],),
        why='Ascend NPU profiling, a backend we do not have')
    level: str = key('${actor_rollout_ref.actor.profiler.tool_config.npu.level}',
        'Ascend NPU profiler: collection level (NPU only; default only)', only=('level0',),
        why='Ascend NPU profiling, a backend we do not have')
    analysis: bool = key('${actor_rollout_ref.actor.profiler.tool_config.npu.analysis}',
        'Ascend NPU profiler: parse the trace after collection (NPU only; default only)', only=(True,),
        why='Ascend NPU profiling, a backend we do not have')
    discrete: bool = key('${actor_rollout_ref.actor.profiler.tool_config.npu.discrete}',
        'Ascend NPU profiler: one trace per task (NPU only; default only)', only=(False,),
        why='Ascend NPU profiling, a backend we do not have')
    # verl 0.9: profiler
    profile_token_start: Optional[int] = key(None, 'Ascend NPU profiler: first generated token traced (NPU only)',
        only=(None,), why='Ascend NPU profiling, a backend we do not have')
    profile_token_end: Optional[int] = key(None, 'Ascend NPU profiler: token after the last traced one (NPU only)',
        only=(None,), why='Ascend NPU profiling, a backend we do not have')


@dataclass
class FollowerTorchToolConfig:
    """``actor_rollout_ref.rollout.profiler.tool_config.torch``,
    ``reward_model.profiler.tool_config.torch``."""

    step_start: int = key('${actor_rollout_ref.actor.profiler.tool_config.torch.step_start}',
        'torch profiler: first update mini-batch traced (follows the actor\'s)', no_effect_yet=_NO_MINI_BATCHES)
    step_end: Any = key('${actor_rollout_ref.actor.profiler.tool_config.torch.step_end}',
        "torch profiler: update mini-batch after the last traced one (follows the actor's)",
        no_effect_yet=_NO_MINI_BATCHES)
    # verl 0.9: profiler
    contents: List[str] = key('${actor_rollout_ref.actor.profiler.tool_config.torch.contents}',
        "torch profiler: what to record (follows the actor's)", item_choices=_CONTENTS)
    discrete: bool = key('${actor_rollout_ref.actor.profiler.tool_config.torch.discrete}',
        "torch profiler: one trace per stage (worker call) instead of one per step (follows the actor's)")
    profile_token_start: Optional[int] = key(None, 'torch profiler: first generated token traced; null = 0',
        no_effect_yet=_TOKEN)
    profile_token_end: Optional[int] = key(None, 'torch profiler: token after the last traced one; null = all',
        no_effect_yet=_TOKEN)


@dataclass
class FollowerTorchMemoryToolConfig:
    """Sections ``actor_rollout_ref.rollout.profiler.tool_config.torch_memory``,
    ``reward_model.profiler.tool_config.torch_memory``."""

    trace_alloc_max_entries: int = key('${actor_rollout_ref.actor.profiler.tool_config.torch_memory.trace_alloc_max_entries}',
        'torch memory snapshot: max allocation events recorded',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')
    stack_depth: int = key('${actor_rollout_ref.actor.profiler.tool_config.torch_memory.stack_depth}',
        'torch memory snapshot: stack frames kept per event',
        no_effect_on_cpu='read only by the torch_memory profiler, a CUDA memory snapshot (torch.cuda.memory._record_memory_history); profiler tool torch_memory is refused here')


@dataclass
class FollowerPrecisionDebuggerConfig:
    """``actor_rollout_ref.rollout.profiler.tool_config.precision_debugger`` (follows the actor's)."""

    config_path: Optional[str] = key('${actor_rollout_ref.actor.profiler.tool_config.precision_debugger.config_path}',
        "msprobe precision debugger: its JSON config (follows the actor's)", only=(None,),
        why='the msprobe precision debugger (Ascend tooling), which this project does not have')
    steps: Any = key(None, 'msprobe precision debugger: deprecated step filter', only=(None,),
        why='the msprobe precision debugger (Ascend tooling), which this project does not have')
    stages: Any = key('${actor_rollout_ref.actor.profiler.tool_config.precision_debugger.stages}',
        "msprobe precision debugger: stages dumped (follows the actor's)",
        only=(None,), why='the msprobe precision debugger (Ascend tooling), which this project does not have')
    strict: bool = key('${actor_rollout_ref.actor.profiler.tool_config.precision_debugger.strict}',
        "msprobe precision debugger: fail on an unknown stage (follows the actor's)", only=(False,),
        why='the msprobe precision debugger (Ascend tooling), which this project does not have')


@dataclass
class FollowerProfilerToolConfig:
    """``actor_rollout_ref.rollout.profiler.tool_config``, ``reward_model.profiler.tool_config``."""

    nsys: FollowerNsysToolConfig = section(FollowerNsysToolConfig)
    npu: FollowerNpuToolConfig = section(FollowerNpuToolConfig)
    torch: FollowerTorchToolConfig = section(FollowerTorchToolConfig)
    torch_memory: FollowerTorchMemoryToolConfig = section(FollowerTorchMemoryToolConfig)
    precision_debugger: FollowerPrecisionDebuggerConfig = section(FollowerPrecisionDebuggerConfig)


@dataclass
class FollowerProfilerConfig:
    """``actor_rollout_ref.rollout.profiler``, ``reward_model.profiler``."""

    tool: Optional[str] = key('${oc.select:global_profiler.tool,null}',
        'profiler of this role: null | torch | torch_memory | nsys | npu (follows global_profiler.tool)',
        choices=('nsys', 'npu', 'torch', 'torch_memory'),
        backend_values={'nsys': 'NVIDIA Nsight Systems (nsys)', 'npu': 'the Ascend NPU profiler',
                        'torch_memory': 'CUDA (a torch.cuda memory snapshot: no effect on CPU)'})
    enable: bool = key('${actor_rollout_ref.actor.profiler.enable}',
        'profile this role in the steps listed in global_profiler.steps')
    all_ranks: bool = key('${actor_rollout_ref.actor.profiler.all_ranks}',
        'profile every rank of this role (False = only the ranks listed below)')
    ranks: List[Any] = key('${actor_rollout_ref.actor.profiler.ranks}', 'ranks to profile when all_ranks is False')
    save_path: str = key('${oc.select:global_profiler.save_path,null}',
        "folder for this role's traces (follows global_profiler.save_path)")
    tool_config: FollowerProfilerToolConfig = section(FollowerProfilerToolConfig,
        "settings of each profiler tool (follow the actor's)")
    # verl 0.9: profiler
    relocate_results: bool = key('${actor_rollout_ref.actor.profiler.relocate_results}',
        'move each trace out of save_path/step_<n>/ into save_path as step_<n>_<file> when its step ends')
    finish_hook_cmd: Optional[str] = key('${actor_rollout_ref.actor.profiler.finish_hook_cmd}',
        'shell command run once after the last profiled step (env VERL_PROFILE_SAVE_PATH, '
        'VERL_PROFILE_TRACES...); killed after 900 s; a failure is a warning; null = none')
    finish_hook_all_ranks: bool = key('${actor_rollout_ref.actor.profiler.finish_hook_all_ranks}',
        'run finish_hook_cmd on every rank (False = finish_hook_ranks)')
    finish_hook_ranks: List[Any] = key('${actor_rollout_ref.actor.profiler.finish_hook_ranks}',
        'ranks that run finish_hook_cmd; [] (and finish_hook_all_ranks False) = the profiled ranks')
