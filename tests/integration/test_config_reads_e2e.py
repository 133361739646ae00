"""Proof of effect, not of name: every key marked "supported" is read, by full path, in a real run.

Each entry point runs once on the tiny model with ``RLHF_CONFIG_READS`` set when its config is loaded
(rlhf_core/config/reads.py; the recorder's own unit tests: tests/rlhf_core/config/test_config_read_recording.py): PPO
with GRPO and with GAE (one Ray instance started here, so its workers record too), SFT, offline evaluation and
``rlhf generate``'s ``run_generation``.
A key whose docs/CONFIG_KEYS.md status is "supported" must be read by one of these runs, or be listed in
``EFFECT_TESTS`` with the test that shows its effect (keys only read on paths these short runs do not take:
LoRA, a reward model, the KL controller...). The test named there must exist.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pandas as pd
import pytest

from rlhf_core.config import load_config, reads
from rlhf_core.config.keys_doc import status_of, yaml_keys
from rlhf_core.config.loader import CONFIG_NAMES
from rlhf_core.config.schema import open_paths

from test_ppo_e2e import gsm8k_parquet, ppo_config  # noqa: F401 - gsm8k_parquet is a fixture
from test_sft_e2e import sft_config, sft_files  # noqa: F401 - sft_files is a fixture

pytestmark = pytest.mark.ray  # starts Ray: calls run_ppo

ROOT = Path(__file__).resolve().parents[2]
_A = "actor_rollout_ref."
_RM = "tests/rlhf_core/workers/test_workers_reward_model.py::test_other_chat_template_is_re_templated"
_RM_SAME = "tests/rlhf_core/workers/test_workers_reward_model.py::test_same_tokenizer_scores_the_policy_ids"
_VLLM = "tests/rlhf_core/workers/test_workers_fsdp.py::test_vllm_engine_kwargs_and_missing_vllm_message"
_IS = "tests/rlhf_core/trainer/test_trainer_ppo.py::test_rollout_is_balance_and_rollout_dump"
_IS_ACTOR = "tests/rlhf_core/workers/test_workers_fsdp.py::test_rollout_is_weights_scale_the_policy_loss"
_KL = "tests/rlhf_core/trainer/test_trainer_ppo.py::test_adaptive_kl_in_reward_resumes_its_coefficient"
_PROFILER = "tests/rlhf_core/trainer/test_trainer_keys_effect.py::test_torch_profiler_writes_a_chrome_trace_per_listed_step"
_PROF = "tests/rlhf_core/workers/test_workers_profiler.py::"
_PROF_KEYS = {  # profiler keys read only when a step is profiled -> the test showing the effect
    "tool_config.torch.contents": _PROF + "test_contents_shapes_records_input_shapes",
    "tool_config.torch.discrete": _PROF + "test_discrete_writes_one_trace_per_stage_and_schedules_only_the_update",
    "relocate_results": _PROF + "test_relocate_moves_the_traces_and_the_finish_hook_sees_them",
    "finish_hook_cmd": _PROF + "test_relocate_moves_the_traces_and_the_finish_hook_sees_them",
    "finish_hook_all_ranks": _PROF + "test_finish_hook_ranks_and_a_failing_hook",
    "finish_hook_ranks": _PROF + "test_finish_hook_ranks_and_a_failing_hook"}
_PROF_RANGE = {k: _PROF + "test_schedule_and_step_range_keep_only_the_chosen_mini_batches" for k in (
    "tool_config.torch.step_start", "tool_config.torch.step_end",
    *(f"tool_config.torch.schedule.{s}" for s in ("skip_first", "wait", "warmup", "active", "repeat")))}
_SFT_PROF = "tests/rlhf_core/trainer/test_sft_profiler.py::test_sft_profile_interval_writes_one_trace_with_shapes_and_runs_the_hook"
_AGENT = "tests/rlhf_core/agent/test_agent_rollout.py::test_async_equals_sync_multiturn"
_ONE_STEP = "tests/rlhf_core/trainer/test_one_step_off_policy.py::"
_FULLY_ASYNC = "tests/rlhf_core/trainer/test_fully_async.py::"
_DEPRECATED = "tests/rlhf_core/config/test_config_explicit_values.py::test_deprecated_global_micro_batch_sizes_reach_their_per_gpu_keys"
_GENRM = "tests/rlhf_core/reward/test_reward_genrm.py::"
_SFT_RAY = "tests/integration/test_sft_e2e.py::test_sft_two_ray_workers_match_one"
# Supported keys read only on paths the four short runs do not take: config -> {path: "file::test" showing it}.
_WRAP = "tests/rlhf_core/workers/test_workers_batching.py::test_wrap_policy_decoder_layers_or_min_num_params"
_PREFETCH = ("tests/rlhf_core/workers/test_workers_fsdp_keys.py::"
             "test_forward_prefetch_prefetches_the_next_layer_with_the_same_outputs")
_DL = "tests/rlhf_core/algos/test_distillation_losses.py::"
_DE2E = "tests/integration/test_distillation_e2e.py::test_pure_distillation_lowers_the_teacher_kl"
_DT = "tests/rlhf_core/workers/test_teacher.py::"
_DC = "tests/rlhf_core/config/test_config_distillation.py::"
_TM = "distillation.teacher_models.teacher_model."
# distillation (verl 0.9.1 on-policy distillation): read only with distillation.enabled
_DISTILL = {
    "distillation.distillation_loss.loss_mode": _DE2E,
    "distillation.distillation_loss.topk": _DE2E,
    "distillation.distillation_loss.use_task_rewards": _DE2E,
    "distillation.distillation_loss.log_prob_min_clamp": _DL + "test_log_prob_min_clamp_decides",
    "distillation.distillation_loss.distillation_loss_coef": _DL + "test_combination_with_the_policy_loss",
    "distillation.distillation_loss.loss_max_clamp": _DL + "test_loss_max_clamp_decides",
    **{f"distillation.distillation_loss.{k}": _DL + "test_policy_gradient_form_uses_its_own_clip_ratios"
       for k in ("use_policy_gradient", "policy_loss_mode", "clip_ratio_low", "clip_ratio_high")},
    "distillation.teacher_key": _DT + "test_rows_are_scored_by_the_teacher_of_their_key",
    _TM + "model_path": _DT + "test_rows_are_scored_by_the_teacher_of_their_key",
    _TM + "key": _DT + "test_rows_are_scored_by_the_teacher_of_their_key",
    _TM + "inference.dtype": _DT + "test_dtype_topk_and_temperature",
    _TM + "inference.temperature": _DT + "test_dtype_topk_and_temperature",
    **{_TM + f"inference.{k}": _DC + "test_bad_input_is_refused_naming_the_key"
       for k in ("max_model_len", "prompt_length", "response_length")},
}
EFFECT_TESTS: dict[str, dict[str, str]] = {
    "ppo_trainer": {
        **_DISTILL,
        # verl 0.9: off-policy trainers (read only with async_training.mode=one_step_off_policy)
        "rollout.nnodes": _ONE_STEP + "test_one_step_refuses_what_it_cannot_run_when_the_config_loads",
        "rollout.n_gpus_per_node": _ONE_STEP + "test_one_step_refuses_what_it_cannot_run_when_the_config_loads",
        "async_training.one_step_overlap": _ONE_STEP + "test_without_overlap_the_run_equals_the_on_policy_run",
        _A + "hybrid_engine": _ONE_STEP + "test_hybrid_engine_false_only_with_the_off_policy_trainers",
        # (read only with async_training.mode=fully_async)
        "async_training.staleness_threshold": _FULLY_ASYNC + "test_staleness_threshold_one_keeps_every_update_within_"
                                                             "one_version",
        "async_training.trigger_parameter_sync_step": _FULLY_ASYNC + "test_no_staleness_and_a_sync_every_step_equals_"
                                                                     "the_on_policy_run",
        "async_training.require_batches": _FULLY_ASYNC + "test_fully_async_refuses_what_it_cannot_run_when_the_config_"
                                                         "loads",
        "rollout.total_rollout_steps": _FULLY_ASYNC + "test_total_rollout_steps_caps_the_training_steps",
        "async_training.partial_rollout": _FULLY_ASYNC + "test_partial_rollout_resumes_the_chunk_a_sync_interrupted",
        "async_training.use_trainer_do_validate": "tests/rlhf_core/trainer/test_fully_async_validate.py::test_trainer_"
                                                  "side_validation_uses_the_actors_current_weights",
        "async_training.concurrent_samples_per_replica": _FULLY_ASYNC + "test_streaming_mixes_versions_in_a_step",
        # verl 0.9's v1 trainer loop: read when the config loads (rlhf_core/config/v1_trainer.py)
        **{f"trainer.{k}": "tests/rlhf_core/config/test_v1_trainer_mode.py::test_separate_async_sets_the_fully_async_"
           "keys_it_means" for k in ("v1.trainer_mode", "v1.separate_async.parameter_sync_step",
                                     "v1.separate_async.num_warmup_batches")},
        "trainer.use_v1": "tests/rlhf_core/config/test_v1_trainer_mode.py::test_sync_and_use_v1_false_leave_the_driver_"
                          "alone",
        **{f"trainer.v1.sampler.max_off_policy_{k}": "tests/rlhf_core/trainer/test_off_policy_sampler.py::"
           "test_drop_evicts_the_groups_generated_ahead_and_wait_trains_them" for k in ("threshold", "strategy")},
        # read when old_log_probs are computed (not on the on-policy path the short runs take)
        _A + "actor.use_rollout_log_probs":
            "tests/rlhf_core/config/test_use_rollout_log_probs.py::test_old_log_probs_are_the_rollouts_with_the_key_and_the_actors_without",
        # verl 0.9 keys read on paths the short runs do not take (vLLM engine, LoRA exclusions, traces, DAPO recipe
        # spelling, gdpo, the Ray timeline)
        **{_A + f"rollout.{k}": "tests/rlhf_core/workers/test_vllm_engine_args.py::test_engine_settings_reach_vllm_args" for k in (
            "load_format", "max_model_len", "enable_prefix_caching", "disable_log_stats", "skip_tokenizer_init")},
        _A + "rollout.checkpoint_engine.update_weights_bucket_megabytes":
            "tests/rlhf_core/workers/test_vllm_engine_args.py::test_weight_buckets_cut_at_the_megabyte_limit",
        _A + "rollout.trace.token2text": "tests/rlhf_core/workers/test_rollout_trace_mlflow.py::test_each_trajectory_is_one_mlflow_trace",
        **{f"reward_model.overlong_buffer.{k}": "tests/rlhf_core/reward/test_reward_dapo.py::test_dapo_recipe_spellings_reach_the_manager"
           for k in ("enable", "len", "penalty_factor", "log")},
        **{f"algorithm.gdpo_reward_{k}": "tests/rlhf_core/trainer/test_trainer_adv_09.py::test_gdpo_reads_the_reward_components_and_logs_them"
           for k in ("keys", "weights")},
        "ray_kwargs.timeline_json_file": "tests/rlhf_core/distributed/test_distributed_ray.py::test_ray_timeline_is_written",
        # read only with tiled_mlp.enabled
        **{f"{m}.tiled_mlp.num_shards": "tests/rlhf_core/models/test_tiled_mlp.py::test_actor_ref_and_critic_read_"
           "their_tiled_mlp" for m in (_A + "model", "critic.model")},
        "data.filter_overlong_prompts_workers": "tests/rlhf_core/data/test_data_rl_dataset.py::test_filter_two_workers_equals_one",
        "critic.forward_micro_batch_size": _DEPRECATED,
        # vLLM engine arguments (the e2e runs use the hf rollout)
        **{_A + f"rollout.{k}": _VLLM for k in (
            "prompt_length", "dtype", "enforce_eager", "tensor_model_parallel_size",
            "max_num_batched_tokens", "max_num_seqs", "engine_kwargs.vllm")},
        **{_A + f"actor.rollout_is_{k}": _IS_ACTOR for k in ("threshold", "threshold_lower", "level", "mode",
                                                             "veto_threshold")},
        **{f"algorithm.rollout_is{k}": _IS for k in ("", "_threshold_lower", "_level", "_mode",
                                                     "_veto_threshold")},
        # (bypass_mode is read by every run: the trainer's rollout-correction stage asks it first)
        **{f"algorithm.rollout_correction.{k}": _IS for k in ("rollout_is", "rollout_is_threshold", "rollout_rs",
                                                              "rollout_rs_threshold", "rollout_is_batch_normalize",
                                                              "loss_type")},
        # the runs give total_training_steps; without it, steps = batches per epoch x total_epochs
        "trainer.total_epochs": "tests/rlhf_core/trainer/test_trainer_ppo.py::test_grpo_steps_order_metrics_and_checkpoints",
        **{f"algorithm.{k}": _KL for k in ("kl_penalty", "kl_ctrl.type", "kl_ctrl.kl_coef", "kl_ctrl.horizon",
                                           "kl_ctrl.target_kl")},
        **{f"reward_model.{k}": _RM for k in ("model.input_tokenizer", "model.path", "model.external_lib",
                                              "model.trust_remote_code", "model.fsdp_config.min_num_params",
                                              "micro_batch_size", "micro_batch_size_per_gpu", "max_length",
                                              "use_dynamic_bsz", "forward_max_token_len_per_gpu",
                                              "model.use_remove_padding")},
        "reward_model.model.fsdp_config.cpu_threads":
            "tests/rlhf_core/trainer/test_trainer_reward_model.py::test_build_worker_groups_adds_the_rm_group",
        # the short runs take the on-policy shortcut (workers/on_policy.py): no separate old_log_prob forward
        **{_A + f"rollout.{k}": "tests/rlhf_core/workers/test_workers_fsdp.py::test_log_prob_applies_temperature"
           for k in ("log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
                     "log_prob_max_token_len_per_gpu")},
        "data.datagen.name": "tests/rlhf_core/data/test_data_keys_effect.py::test_datagen_appends_rows_at_start_and_after_each_step",
        **{f"{role}.profiler.{k}": _PROFILER for role in (_A + "actor", _A + "ref", _A + "rollout", "critic",
                                                          "reward_model")
           for k in ("tool", "enable", "all_ranks", "ranks", "save_path")},
        "global_profiler.steps": _PROFILER, "global_profiler.save_path": _PROFILER,
        **{f"{role}.profiler.{k}": ref for role in (_A + "actor", _A + "ref", _A + "rollout", "critic", "reward_model")
           for k, ref in _PROF_KEYS.items()},
        **{f"{role}.profiler.{k}": ref for role in (_A + "actor", _A + "ref", "critic") for k, ref in _PROF_RANGE.items()},
        **{f"global_profiler.{k}": _PROF_KEYS[k]
           for k in ("relocate_results", "finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks")},
        "skip.rollout.dump_dir":
            "tests/rlhf_core/trainer/test_trainer_keys_effect.py::test_skip_rollout_dumps_then_replays_each_steps_generation",
        "skip.rollout.steps": "tests/rlhf_core/trainer/test_rollout_skip.py::test_steps_dump_and_replay_only_the_listed_steps",
        "skip.rollout.action":
            "tests/rlhf_core/trainer/test_rollout_skip.py::test_repeat_replays_the_nearest_dump_at_every_listed_step",
        **{f"skip.async_rollout.{k}": "tests/rlhf_core/trainer/test_fully_async_skip.py::test_listed_feed_indices_are_"
           "dumped_then_replayed_byte_equal" for k in ("enable", "dump_dir", "steps")},
        "skip.async_rollout.action":
            "tests/rlhf_core/trainer/test_fully_async_skip.py::test_repeat_replays_the_nearest_dumped_feed_index",
        **{_A + f"rollout.{k}": _AGENT for k in (
            "multi_turn.max_assistant_turns", "multi_turn.tool_config_path", "multi_turn.max_user_turns",
            "multi_turn.max_parallel_calls", "multi_turn.max_tool_response_length",
            "multi_turn.tool_response_truncate_side", "multi_turn.format", "agent.default_agent_loop",
            "agent.agent_loop_config_path")},
        _A + "rollout.multi_turn.function_tool_path":
            "tests/rlhf_core/tools/test_function_tools.py::test_tool_agent_calls_a_function_tool",
        _A + "rollout.agent.num_workers":
            "tests/rlhf_core/agent/test_agent_keys.py::test_num_workers_cuts_contiguous_chunks_each_with_its_own_loops",
        _A + "rollout.multi_turn.use_inference_chat_template":
            "tests/rlhf_core/agent/test_agent_keys.py::test_inference_chat_template_changes_the_engine_context_not_the_layout",
        _A + "rollout.multi_turn.tokenization_sanity_check_mode":
            "tests/rlhf_core/agent/test_agent_keys.py::test_sanity_check_in_the_tool_loop_and_the_manager_warning",
        _A + "rollout.multi_turn.num_repeat_rollouts":
            "tests/rlhf_core/agent/test_agent_repeat.py::test_one_trained_turn_and_num_repeat_rollouts_continuations",
        "critic.enable": "tests/rlhf_core/trainer/test_trainer_algo_keys.py::test_critic_enable_builds_the_critic_worker_group",
        "algorithm.pf_ppo.reweight_method":
            "tests/rlhf_core/trainer/test_trainer_algo_keys.py::test_pf_ppo_max_random_keeps_low_scores_drawable",
        "algorithm.pf_ppo.weight_pow":
            "tests/rlhf_core/trainer/test_trainer_algo_keys.py::test_pf_ppo_resamples_the_update_batch_towards_high_scores",
        "ray_kwargs.ray_init.num_cpus": "tests/rlhf_core/config/test_config_verl06.py::test_ray_kwargs_and_ray_init_are_one_setting",
        # verl 0.9: DAPO filter_groups + reward section (read only with filter_groups.enable / those managers)
        "algorithm.filter_groups.metric":
            "tests/rlhf_core/trainer/test_dynamic_sampling.py::test_driver_trains_on_exactly_train_batch_size_kept_groups",
        "algorithm.filter_groups.max_num_gen_batches":
            "tests/rlhf_core/trainer/test_dynamic_sampling.py::test_collect_stops_at_max_num_gen_batches_and_when_data_runs_out",
        # a generative reward model's engine (read only with reward_model.enable + a custom function + an engine name):
        # the config -> the judge's request defaults, then what each default does in the server
        **{f"reward.reward_model.rollout.{k}": _GENRM + "test_genrm_mode_and_engine_keys_from_the_config" for k in (
            "dtype", "temperature", "top_k", "top_p", "do_sample", "ignore_eos", "seed", "max_model_len",
            "response_length")},
        **{f"reward_model.rollout.{k}": _GENRM + "test_genrm_mode_and_engine_keys_from_the_config" for k in (
            "dtype", "max_model_len", "response_length")},
        "reward.num_workers": "tests/rlhf_core/reward/test_reward_verl09.py::test_remote_scores_in_num_workers_other_processes",
        **{f"reward_model.reward_loop_{k}": "tests/rlhf_core/reward/test_reward_loop_keys.py::test_importlib_loads_the_"
           "class_named_by_reward_loop_class_name" for k in ("module_path", "class_name")},
        **{f"reward.reward_manager.module.{k}":
           "tests/rlhf_core/reward/test_reward_verl09.py::test_importlib_source_loads_the_manager_class_from_a_file"
           for k in ("path", "name")},
        **{f"reward.{k}": "tests/rlhf_core/reward/test_reward_verl09.py::test_rate_limited_spaces_calls_by_max_rpm_or_max_tpm"
           for k in ("max_rpm", "max_tpm", "estimated_tokens_per_request")},
        **{f"reward.{k}": "tests/rlhf_core/reward/test_reward_verl09.py::test_rate_limited_caps_concurrency_and_times_out"
           for k in ("max_concurrent", "timeout")},
        # issue #35: optimizer / engine keys read only when set or on paths the short runs do not take
        **{f"{r}.optim.zero_indexed_step": "tests/rlhf_core/workers/test_workers_optim_keys.py::"
           "test_zero_indexed_step_false_shifts_the_cosine_schedule_by_one" for r in (_A + "actor", "critic")},
        **{_A + f"actor.{k}": "tests/rlhf_core/workers/test_workers_entropy_keys.py::test_chunked_entropy_equals_the_default"
           for k in ("entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size",
                     "fsdp_config.entropy_from_logits_chunk_size")},
        _A + "actor.entropy_checkpointing":
            "tests/rlhf_core/workers/test_workers_entropy_keys.py::test_entropy_checkpointing_keeps_less_and_gives_the_same_gradient",
        **{k: "tests/rlhf_core/workers/test_workers_fsdp_keys.py::test_pad_to_length_rounds_the_pack_up_with_the_same_log_probs"
           for k in (_A + "actor.pad_to_length", _A + "actor.fsdp_config.pad_to_length_bucket")},
        **{k: "tests/rlhf_core/workers/test_workers_fsdp_keys.py::test_reference_and_critic_read_their_pad_to_length"
           for k in (_A + "ref.pad_to_length", _A + "ref.fsdp_config.pad_to_length_bucket",
                     "critic.fsdp.pad_to_length_bucket")},
        **{k: "tests/rlhf_core/workers/test_workers_determinism.py::test_each_worker_applies_its_section_before_building_the_model"
           for k in (_A + "actor.fsdp_config.seed", _A + "ref.fsdp_config.seed", "critic.fsdp.seed")},
        "reward_model.model.fsdp_config.forward_prefetch":
            "tests/rlhf_core/workers/test_workers_fsdp_keys.py::test_forward_prefetch_prefetches_the_next_layer_with_the_same_outputs",
        # issue #35: keys given their verl 0.9 effect, read on paths the short runs do not take (vLLM, a trace
        # backend, the default scorer with a sandbox, the remote manager, a reward model, the rollout's log-probs)
        _A + "rollout.logprobs_mode":  # read with calculate_log_probs (generation.yaml's rollout has no such key)
            "tests/rlhf_core/workers/test_hf_decode.py::test_hf_rollout_log_probs_follow_logprobs_mode",
        _A + "rollout.scheduling_policy":
            "tests/rlhf_core/workers/test_vllm_engine_args.py::test_logprobs_mode_and_scheduling_policy_reach_vllm",
        **{_A + f"rollout.trace.{k}":
           "tests/rlhf_core/workers/test_rollout_trace_mlflow.py::test_trace_names_and_max_samples_per_step_per_worker"
           for k in ("project_name", "experiment_name", "max_samples_per_step_per_worker")},
        **{f"{s}.{k}": "tests/rlhf_core/reward/test_reward_sandbox_fusion.py::test_max_concurrent_bounds_requests_and_"
           "memory_limit_is_sent" for s in ("reward_model.sandbox_fusion", "sandbox_fusion")
           for k in ("url", "max_concurrent", "memory_limit_mb")},
        "reward_model.num_workers":
            "tests/rlhf_core/reward/test_reward_verl09.py::test_reward_model_num_workers_replaces_reward_num_workers",
        **{f"reward_model.model.fsdp_config.{k}":
           "tests/rlhf_core/workers/test_workers_reward_model.py::test_fsdp_config_keys_shape_the_sharding"
           for k in ("fsdp_size", "reshard_after_forward", "wrap_policy.min_num_params")},
        # FSDP2 wrapping, read from two ranks on (one rank runs the plain module: fsdp_utils.needs_fsdp2)
        _A + "actor.fsdp_config.wrap_policy.min_num_params":
            "tests/rlhf_core/distributed/test_distributed_ray.py::test_hsdp_mesh_and_size_based_wrap_match_one_rank",
        **{k: _WRAP for k in (_A + "ref.fsdp_config.wrap_policy.min_num_params", "critic.fsdp.wrap_policy.min_num_params")},
        **{k: _PREFETCH for k in (_A + "actor.fsdp_config.forward_prefetch", _A + "ref.fsdp_config.forward_prefetch",
                                  "critic.fsdp.forward_prefetch")},
    },
    "sft_trainer": {"model.fsdp_config.wrap_policy.min_num_params": _WRAP,"data.micro_batch_size": _DEPRECATED, "ray_init.address": _SFT_RAY, "ray_init.num_cpus": _SFT_RAY,
                    "trainer.device": _SFT_RAY,
                    "model.tiled_mlp.num_shards": "tests/rlhf_core/trainer/test_sft_model_keys.py::test_tiled_mlp_step_"
                                                  "gives_the_pinned_numbers_and_offload_wraps_each_micro_batch",
                    # read only with profiler.enable and a trainer.profile_interval
                    **{f"profiler.{k}": _SFT_PROF for k in (
                        "tool", "enable", "all_ranks", "ranks", "save_path", "finish_hook_cmd", "finish_hook_ranks",
                        "finish_hook_all_ranks", "tool_config.torch.contents", "tool_config.torch.discrete")},
                    "profiler.relocate_results": _PROF + "test_relocate_moves_the_traces_and_the_finish_hook_sees_them",
                    **{f"profiler.tool_config.torch.schedule.{s}": _PROF + "test_schedule_and_step_range_keep_only_the_chosen_mini_batches"
                       for s in ("skip_first", "wait", "warmup", "active", "repeat")},
                    "engine.seed": "tests/rlhf_core/workers/test_workers_determinism.py::test_sft_worker_applies_engine_determinism_after_"
                                   "trainer_seed",
                    **{f"engine.{k}": "tests/rlhf_core/trainer/test_sft_worker.py::test_pad_to_length_rounds_the_pack_"
                       "up_with_the_same_step" for k in ("pad_to_length", "pad_to_length_bucket")},
                    "trainer.total_epochs": "tests/integration/test_sft_e2e.py::test_sft_loss_decreases_schedule_and_hf_output"},
    "evaluation": {"ray_kwargs.ray_init.num_cpus": "tests/rlhf_core/config/test_config_verl06.py::test_ray_kwargs_and_ray_init_are_one_setting",
                   "custom_reward_function.name":
                   "tests/rlhf_core/trainer/test_evaluation.py::test_custom_function_with_three_parameters_and_acc"},
    # the default run (hf engine, one rank in this process) reads every other supported key of generation.yaml
    "generation": {**{f"rollout.{k}": "tests/rlhf_core/workers/test_generation_vllm_cpu.py::"
                      "test_generate_with_vllm_passes_the_rollout_keys_and_equals_hf"
                      for k in ("enforce_eager", "load_format", "tensor_model_parallel_size", "max_num_batched_tokens",
                                "max_model_len", "max_num_seqs", "disable_log_stats")},
                   **{k: "tests/rlhf_core/trainer/test_generation_ray.py::"
                      "test_two_ranks_give_the_one_rank_output_in_order_with_a_timeline"
                      for k in ("ray_init.num_cpus", "ray_kwargs.timeline_json_file")},
                   "ray_kwargs.ray_init.num_cpus": "tests/rlhf_core/config/test_config_verl06.py::"
                                                   "test_ray_kwargs_and_ray_init_are_one_setting"},
}


def _read(path: str, reads_: set[str]) -> bool:
    """Read by full path; a free-form dict (override_config, engine_kwargs) also counts when code reads the dict."""
    return path in reads_ or (path in open_paths() and path.rpartition(".")[0] in reads_)


def _supported(name: str) -> list[str]:
    return [p for p, _, _ in yaml_keys(name) if status_of(name, p).startswith("supported")]


def _test_exists(ref: str) -> bool:
    path, _, name = ref.partition("::")
    file = ROOT / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text(encoding="utf-8"))
    return not name or any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def _eval_parquet(path: Path) -> str:
    pd.DataFrame({
        "data_source": ["openai/gsm8k"], "prompt": [[{"role": "user", "content": "q"}]],
        "responses": [["#### 72", "#### 1"]], "reward_model": [{"style": "rule", "ground_truth": "72"}],
    }).to_parquet(path)
    return str(path)


@pytest.fixture(scope="module")
def recorded(tiny_model_dir, gsm8k_parquet, sft_files, tmp_path_factory):  # noqa: F811
    """{config name: every full path read by its runs}."""
    import ray

    from rlhf_core.trainer.evaluation import run_evaluation
    from rlhf_core.trainer.main_generation import run_generation
    from rlhf_core.trainer.main_ppo import run_ppo
    from rlhf_core.trainer.sft_trainer import run_sft

    out = tmp_path_factory.mktemp("config_reads")
    files = {name: str(out / f"{name}.reads") for name in CONFIG_NAMES}
    saved = {k: os.environ.get(k) for k in (reads.ENV, "RLHF_METRICS_FILE")}
    os.environ.pop("RLHF_METRICS_FILE", None)
    if ray.is_initialized():  # an instance started without the variable would start workers that do not record
        ray.shutdown()
    try:
        os.environ[reads.ENV] = files["ppo_trainer"]  # before load_config: it returns a recording config
        for adv in ("grpo", "gae"):
            run_ppo(ppo_config(tiny_model_dir, gsm8k_parquet, out / adv, adv, "trainer.total_training_steps=1",
                               "trainer.test_freq=1", "trainer.save_freq=1"))
        ray.shutdown()
        os.environ[reads.ENV] = files["sft_trainer"]
        run_sft(sft_config(tiny_model_dir, sft_files, out / "sft", "trainer.total_training_steps=1",
                           "trainer.save_freq=1", "trainer.test_freq=1"))
        os.environ[reads.ENV] = files["evaluation"]
        run_evaluation(load_config("evaluation", [f"data.path={_eval_parquet(out / 'resp.parquet')}",
                                                  f"output.samples_dir={out / 'eval'}"]))
        os.environ[reads.ENV] = files["generation"]
        run_generation(load_config("generation", [f"data.path={gsm8k_parquet[1]}", f"model.path={tiny_model_dir}",
                                                  f"data.output_path={out / 'gen.parquet'}", "data.n_samples=2",
                                                  "rollout.response_length=8"]))
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    return {name: reads.read_paths(path) for name, path in files.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_every_supported_key_is_read_by_a_run_or_has_an_effect_test(recorded, name):
    covered = EFFECT_TESTS[name]
    unread = [p for p in _supported(name) if not _read(p, recorded[name]) and p not in covered]
    assert unread == [], (f"{name}.yaml keys marked 'supported' that no run reads and no effect test covers: {unread}. "
                          f"Make a run read them, name the test showing their effect in EFFECT_TESTS, or give them an "
                          f"honest status where the key is declared (rlhf_core/config/schemas/) and run python -m rlhf_core.config.gen_yaml")
    stale = [p for p in covered if _read(p, recorded[name])]
    assert stale == [], f"read by a run now, drop from EFFECT_TESTS: {stale}"


def test_effect_tests_name_supported_keys_and_existing_tests():
    for name, entries in EFFECT_TESTS.items():
        for path, ref in entries.items():
            assert path in _supported(name), f"{name}: {path} is not a supported key"
            assert _test_exists(ref), f"{name}: {path}: no test {ref}"

