"""What ``actor_rollout_ref.rollout`` hands to ``vllm.LLM`` (:func:`engine_kwargs`) and how the weight update is cut
into buckets (:func:`weight_buckets`). Pure functions: no vLLM needed (the engine itself is checked in
tests/rlhf_core/workers/test_vllm_rollout_cpu.py, in the vLLM venv)."""
from __future__ import annotations

import pytest
import torch

from rlhf_core.config import load_config
from rlhf_core.workers.rollout.vllm_rollout import engine_kwargs, weight_buckets

A = "actor_rollout_ref.rollout"


def rollout_kwargs(model_dir, *overrides: str, weights_from_actor: bool = True) -> dict:
    cfg = load_config("ppo_trainer", [f"actor_rollout_ref.model.path={model_dir}", "data.max_prompt_length=40",
                                      "data.max_response_length=24", f"{A}.name=vllm", *overrides])
    return engine_kwargs(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout, seed=0,
                         weights_from_actor=weights_from_actor)


def test_engine_settings_reach_vllm_args(tmp_path):
    kw = rollout_kwargs(tmp_path)  # verl 0.9 defaults
    assert kw["max_model_len"] == 40 + 24  # null = prompt_length + response_length
    assert kw["load_format"] == "dummy"  # dummy_dtensor: random start, the actor's weights arrive at the first sync
    assert kw["enable_prefix_caching"] is True and kw["disable_log_stats"] is True
    assert kw["skip_tokenizer_init"] is True
    kw = rollout_kwargs(tmp_path, f"{A}.max_model_len=100", f"{A}.enable_prefix_caching=False",
                        f"{A}.disable_log_stats=False", f"{A}.skip_tokenizer_init=False", f"{A}.load_format=safetensors",
                        f"{A}.max_num_batched_tokens=50", f"{A}.max_num_seqs=7")
    assert kw["max_model_len"] == 100 and kw["max_num_seqs"] == 7
    assert kw["max_num_batched_tokens"] == 100  # raised to max_model_len: a whole prompt fits in one step
    assert kw["enable_prefix_caching"] is False and kw["disable_log_stats"] is False
    assert kw["skip_tokenizer_init"] is False and kw["load_format"] == "safetensors"


def test_rollout_only_worker_loads_real_weights(tmp_path):
    # no actor to sync from: random dummy weights would never be replaced
    assert rollout_kwargs(tmp_path, weights_from_actor=False)["load_format"] == "auto"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU engine's settings")
def test_cpu_turns_chunked_prefill_off_and_keeps_cuda_only_settings_out(tmp_path):
    kw = rollout_kwargs(tmp_path, f"{A}.enable_chunked_prefill=True", f"{A}.cudagraph_capture_sizes=[1,2]",
                        f"{A}.free_cache_engine=True")
    assert kw["enable_chunked_prefill"] is False
    assert "compilation_config" not in kw and "enable_sleep_mode" not in kw


def test_max_model_len_below_prompt_plus_response_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"rollout.max_model_len=63 is below prompt_length \+ response_length = 64"):
        rollout_kwargs(tmp_path, f"{A}.max_model_len=63")


def test_weight_buckets_cut_at_the_megabyte_limit():
    # fp32: 2^18 elements = 1 MiB. Sizes in MiB: a 0.5, b 0.5, c 0.75, d 2 (larger than a bucket), e 0.25.
    # limit 1 MiB: [a, b] (1.0; c would overflow), [c] (0.75; d would overflow), [d] alone, [e]
    mib = 1 << 18
    state = {"a": torch.zeros(mib // 2), "b": torch.zeros(mib // 2), "c": torch.zeros(3 * mib // 4),
             "d": torch.zeros(2 * mib), "e": torch.zeros(mib // 4)}
    names = [[n for n, _ in b] for b in weight_buckets(state, 1)]
    assert names == [["a", "b"], ["c"], ["d"], ["e"]]
    # limit 3 MiB: a+b+c = 1.75, + d would be 3.75 → closed; d + e = 2.25
    assert [[n for n, _ in b] for b in weight_buckets(state, 3)] == [["a", "b", "c"], ["d", "e"]]
    assert [n for n, _ in weight_buckets(state, 512)[0]] == list(state)  # verl's default: one bucket here
    with pytest.raises(ValueError, match="update_weights_bucket_megabytes=0"):
        weight_buckets(state, 0)


def test_logprobs_mode_and_scheduling_policy_reach_vllm(tmp_path):
    kw = rollout_kwargs(tmp_path)  # verl 0.9's defaults
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["scheduling_policy"] == "fcfs"
    kw = rollout_kwargs(tmp_path, f"{A}.logprobs_mode=raw_logits", f"{A}.scheduling_policy=priority")
    assert kw["logprobs_mode"] == "raw_logits" and kw["scheduling_policy"] == "priority"


def test_full_determinism_env_reaches_every_ray_worker():
    from rlhf_core.trainer.main_ppo import ray_extra

    cfg = load_config("ppo_trainer", ["+ray_kwargs.ray_init.runtime_env.env_vars={MY_VAR: x}"])
    assert "VLLM_BATCH_INVARIANT" not in str(ray_extra(cfg))  # off by default
    cfg = load_config("ppo_trainer", [f"{A}.full_determinism=True", f"{A}.seed=17",
                                      "+ray_kwargs.ray_init.runtime_env.env_vars={MY_VAR: x}"])
    env = ray_extra(cfg)["runtime_env"]["env_vars"]
    # verl 0.9 run_ppo's three variables, PYTHONHASHSEED = rollout.seed; the user's own env_vars kept
    assert env == {"MY_VAR": "x", "VERL_FULL_DETERMINISM": "1", "VLLM_BATCH_INVARIANT": "1", "PYTHONHASHSEED": "17"}
