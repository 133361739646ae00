"""Key statuses are honest and consistent (the proof that "supported" keys are read is elsewhere).

docs/CONFIG_KEYS.md marks each key *supported*, *no effect on CPU*, *accepted, no effect yet* or *default only*
(each key's ``no_effect_*``/``only``+``why`` in rlhf_core/config/schemas/). That a supported key is read, by full path, in a real run is
checked by tests/integration/test_config_reads_e2e.py (it replaced the name check that lived here: a key's last
name appearing somewhere in the code proved nothing about which section was read).
"""
from __future__ import annotations

import pytest

from rlhf_core.config.keys_doc import status_of
from rlhf_core.config.loader import CONFIG_NAMES
from rlhf_core.config.schema import specs
from rlhf_core.config.spec import DEFAULT_ONLY, NO_EFFECT_ON_CPU, NO_EFFECT_YET, SUPPORTED


def test_every_status_but_supported_says_why():
    for name in CONFIG_NAMES:
        for spec in specs(name).values():
            assert spec.status in {SUPPORTED, NO_EFFECT_ON_CPU, NO_EFFECT_YET, DEFAULT_ONLY}, spec.path
            assert (spec.why is None) == (spec.status == SUPPORTED), spec.path


def test_spot_checked_statuses_and_reasons():
    # moved from the deleted status06_effects.yaml's test: one entry per status, with its reason
    ppo = specs("ppo_trainer")
    assert ppo["actor_rollout_ref.rollout.gpu_memory_utilization"].status == NO_EFFECT_ON_CPU
    assert (ppo["critic.fsdp.use_orig_params"].status,
            ppo["critic.fsdp.use_orig_params"].why) == (
        NO_EFFECT_YET, "FSDP2, the only FSDP here, always keeps the original parameters (each a DTensor shard), as "
        "FSDP1 did with True; FSDP1's flat parameters (False) cannot exist on FSDP2, so either value trains the same")
    # the same path can have another status in another config: sft's data.balance_dp_token is not read there
    assert specs("sft_trainer")["data.balance_dp_token"].status == NO_EFFECT_YET
    assert specs("sft_trainer")["data.train_max_samples"].status == ppo["data.train_max_samples"].status == SUPPORTED


@pytest.mark.parametrize("path", ["critic.fsdp.use_orig_params", "actor_rollout_ref.rollout.n_gpus_per_node"])
def test_unread_keys_are_not_called_supported(path):
    assert status_of("ppo_trainer", path).startswith(NO_EFFECT_YET)


@pytest.mark.parametrize("path", [  # given effect (tests: test_vllm_engine_args, test_model_source_keys, ...)
    "reward_model.launch_reward_fn_async", "actor_rollout_ref.rollout.load_format", "actor_rollout_ref.nccl_timeout",
    "actor_rollout_ref.rollout.max_model_len", "actor_rollout_ref.rollout.enable_prefix_caching",
    "actor_rollout_ref.model.custom_chat_template", "actor_rollout_ref.rollout.trace.backend",
    "ray_init.timeline_json_file", "actor_rollout_ref.model.lora_adapter_path", "critic.model.lora_adapter_path",
    "actor_rollout_ref.model.tiled_mlp.enabled", "critic.model.tiled_mlp.num_shards", "critic.model.hf_config_path",
    "critic.model.custom_chat_template", "critic.model.exclude_modules", "actor_rollout_ref.rollout.logprobs_mode",
    "reward_model.sandbox_fusion.url", "trainer.esi_redundant_time", "trainer.checkpoint_callback_class",
    "actor_rollout_ref.rollout.trace.project_name", "actor_rollout_ref.rollout.multi_turn.function_tool_path",
    "data.function_tool_path", "data.tool_config_path"])
def test_keys_given_effect_are_supported(path):
    assert status_of("ppo_trainer", path).startswith(SUPPORTED)


@pytest.mark.parametrize("path", ["model.lora_adapter_path", "model.exclude_modules", "model.tiled_mlp.enabled",
                                  "model.hf_config_path", "model.tokenizer_path", "model.override_config"])
def test_sft_model_keys_given_effect_are_supported(path):  # tests/rlhf_core/trainer/test_sft_model_keys.py
    assert status_of("sft_trainer", path).startswith(SUPPORTED)


@pytest.mark.parametrize("name,override", [
    ("ppo_trainer", "actor_rollout_ref.model.use_liger=True"), ("ppo_trainer", "critic.model.use_liger=True"),
    ("ppo_trainer", "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton"),
    ("ppo_trainer", "critic.model.fused_kernel_options.impl_backend=triton"),
    ("sft_trainer", "model.use_liger=True"), ("sft_trainer", "model.fused_kernel_options.impl_backend=liger")])
def test_gpu_kernel_keys_are_refused_by_name(name, override):
    """Liger and the Triton fused-kernel backends are GPU-only kernels this project does not have: a non-default
    value is refused when the config loads, naming the key (it would otherwise silently run the torch path)."""
    from rlhf_core.config import load_config
    from rlhf_core.config.errors import ConfigError

    key, _, value = override.partition("=")
    with pytest.raises(ConfigError, match=rf"{key}=\S*{value}\S* is not supported yet"):
        load_config(name, [override])


@pytest.mark.parametrize("key", ["actor_rollout_ref.actor.fsdp_config.forward_only", "critic.fsdp.forward_only",
                                 "critic.model.fsdp_config.forward_only"])
def test_forward_only_of_a_trained_role_is_refused(key):
    """verl 0.9.1's engine builds no optimizer with forward_only=True and its train_batch asserts: the actor and the
    critic are trained, so True is refused by name (the verl 0.6 spelling of the critic's key too); the reference's
    forward_only stays accepted (its False only costs verl an unused optimizer)."""
    from rlhf_core.config import load_config
    from rlhf_core.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"fsdp(_config)?.forward_only=True is not supported yet \(verl 0.9.1's FSDP "
                                          r"engine then builds no optimizer"):
        load_config("ppo_trainer", [f"{key}=True"])
    assert status_of("ppo_trainer", "actor_rollout_ref.ref.fsdp_config.forward_only").startswith(NO_EFFECT_YET)


def test_profiler_tool_torch_memory_is_refused_as_cuda_only():
    from rlhf_core.config import load_config
    from rlhf_core.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"actor_rollout_ref.actor.profiler.tool='torch_memory' needs CUDA"):
        load_config("ppo_trainer", ["actor_rollout_ref.actor.profiler.tool=torch_memory"])
    assert status_of("ppo_trainer", "global_profiler.global_tool_config.torch_memory.stack_depth").startswith(
        NO_EFFECT_ON_CPU)


@pytest.mark.parametrize("path", ["actor_rollout_ref.model.enable_activation_offload",
                                  "actor_rollout_ref.actor.use_torch_compile",
                                  "actor_rollout_ref.actor.fsdp_config.use_torch_compile",
                                  "actor_rollout_ref.ref.fsdp_config.use_torch_compile"])
def test_gpu_only_keys_say_so(path):
    assert status_of("ppo_trainer", path).startswith(NO_EFFECT_ON_CPU)
    assert status_of("sft_trainer", "model.enable_activation_offload").startswith(NO_EFFECT_ON_CPU)


def test_ray_wait_timeout_is_supported():
    assert status_of("ppo_trainer", "trainer.ray_wait_register_center_timeout") == "supported"
