"""Validation rules (SEMANTICS.md "Batch sizes"), schema typing and "not supported yet" keys."""

from __future__ import annotations

import re
import warnings

import pytest

from rlhf_core.config import ConfigError, load_config, validate_ppo_config, validate_sft_config

A = "actor_rollout_ref"
# A small consistent PPO setup: world 2, 8 prompts, mini 4 prompts, micro 2 per worker.
SMALL = ["trainer.n_gpus_per_node=2", "data.train_batch_size=8", f"{A}.actor.ppo_mini_batch_size=4",
         f"{A}.actor.ppo_micro_batch_size_per_gpu=2", f"{A}.rollout.log_prob_micro_batch_size_per_gpu=2",
         f"{A}.ref.log_prob_micro_batch_size_per_gpu=2", f"{A}.rollout.tensor_model_parallel_size=1"]


def ppo(*overrides):
    return load_config("ppo_trainer", [*SMALL, *overrides])


def error_of(*overrides, name="ppo_trainer", base=SMALL):
    with pytest.raises(ConfigError) as info:
        load_config(name, [*base, *overrides])
    return str(info.value)


def test_shipped_defaults_pass_with_their_own_world_size():
    cfg = load_config("ppo_trainer")
    validate_ppo_config(cfg)  # world 1 x 8: 1024 prompts, mini 256 = 256 seqs = 8 workers x micro 8 x 4
    validate_ppo_config(cfg, world_size=4)
    validate_sft_config(load_config("sft_trainer"))  # 256 / 8 = 32 per worker, 8 micro-batches of 4
    load_config("evaluation")


def test_small_setup_passes():
    cfg = ppo()
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 2


def test_deprecated_global_micro_batch_is_converted_with_a_warning():
    with pytest.warns(DeprecationWarning, match=r"ppo_micro_batch_size=4 is deprecated; converted to "
                      r"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \(4 / world size 2\)"):
        cfg = ppo(f"{A}.actor.ppo_micro_batch_size_per_gpu=null", f"{A}.actor.ppo_micro_batch_size=4")
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 2  # 4 global / 2 workers
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size is None
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 2  # the critic's per-GPU key follows the actor's


def test_critic_deprecated_key_alone_converts_because_its_per_gpu_key_is_an_interpolation():
    with pytest.warns(DeprecationWarning, match=r"critic.ppo_micro_batch_size=4 is deprecated"):
        cfg = ppo("critic.ppo_micro_batch_size=4")
    # 4 global / world 2 = 2 per worker; the forward_* keys follow through their interpolations
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 2
    assert cfg.critic.forward_micro_batch_size_per_gpu == 2 and cfg.critic.forward_micro_batch_size is None


def test_deprecated_and_per_gpu_both_set_is_an_error():
    msg = error_of(f"{A}.actor.ppo_micro_batch_size=4")
    assert "You have set both 'actor_rollout_ref.actor.ppo_micro_batch_size'=4 (deprecated) AND " \
           "'actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu'=2" in msg


def test_deprecated_global_smaller_than_world_is_an_error_not_zero():
    # 1 global // 2 workers would be 0 sequences per micro-batch
    msg = error_of(f"{A}.actor.ppo_micro_batch_size_per_gpu=null", f"{A}.actor.ppo_micro_batch_size=1")
    assert "ppo_micro_batch_size=1 (deprecated, global) must be a positive multiple of the world size 2" in msg


def test_neither_micro_key_set_is_an_error_unless_dynamic_bsz():
    msg = error_of(f"{A}.actor.ppo_micro_batch_size_per_gpu=null", "algorithm.adv_estimator=grpo")
    assert "[actor_rollout_ref.actor] Please set at least one of 'actor_rollout_ref.actor.ppo_micro_batch_size' " \
           "or 'actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu'" in msg
    ppo(f"{A}.actor.ppo_micro_batch_size_per_gpu=null", "algorithm.adv_estimator=grpo", f"{A}.actor.use_dynamic_bsz=True")


def test_train_batch_not_divisible_by_mini_batch():
    msg = error_of("data.train_batch_size=6", "algorithm.adv_estimator=grpo")
    assert "data.train_batch_size=6 is not divisible by actor_rollout_ref.actor.ppo_mini_batch_size=4" in msg


def test_mini_times_n_not_divisible_by_world_times_micro():
    # mini 4 x n 3 = 12 sequences; world 2 x micro 4 = 8 does not divide 12
    msg = error_of(f"{A}.rollout.n=3", f"{A}.actor.ppo_micro_batch_size_per_gpu=4", "algorithm.adv_estimator=grpo")
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=4 x actor_rollout_ref.rollout.n=3 = 12 sequences is not " \
           "divisible by world size 2 x actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 = 8." in msg
    ppo(f"{A}.rollout.n=3", f"{A}.actor.ppo_micro_batch_size_per_gpu=3", "algorithm.adv_estimator=grpo")  # 12 % 6 == 0


def test_zero_micro_batch_is_an_error():
    msg = error_of(f"{A}.actor.ppo_micro_batch_size_per_gpu=0", "algorithm.adv_estimator=grpo")
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0 must be > 0." in msg


@pytest.mark.parametrize("key", ["data.max_response_length", f"{A}.actor.ppo_epochs", "trainer.total_epochs"])
def test_zero_lengths_and_epochs_are_errors(key):
    assert f"{key}=0 must be >= 1." in error_of(f"{key}=0")


def test_batch_not_divisible_by_world():
    msg = error_of("trainer.n_gpus_per_node=3", "algorithm.adv_estimator=grpo")
    assert "data.train_batch_size=8 x actor_rollout_ref.rollout.n=1 = 8 sequences is not divisible by world size 3" in msg


def test_resource_rules_use_the_given_world_size():
    cfg = ppo()
    with pytest.raises(ConfigError, match=r"= 4 sequences is not divisible by world size 8"):
        validate_ppo_config(cfg, world_size=8)


def test_val_sampling_with_zero_temperature():
    msg = error_of(f"{A}.rollout.val_kwargs.do_sample=True")
    assert "actor_rollout_ref.rollout.val_kwargs.do_sample=True with actor_rollout_ref.rollout.val_kwargs." \
           "temperature=0: sampling needs temperature > 0" in msg
    ppo(f"{A}.rollout.val_kwargs.do_sample=True", f"{A}.rollout.val_kwargs.temperature=0.6")


@pytest.mark.parametrize("estimator", ["rloo", "rloo_vectorized"])
def test_rloo_needs_two_samples(estimator):
    msg = error_of(f"algorithm.adv_estimator={estimator}")
    assert f"algorithm.adv_estimator={estimator} needs actor_rollout_ref.rollout.n >= 2" in msg
    assert "got actor_rollout_ref.rollout.n=1" in msg
    ppo(f"algorithm.adv_estimator={estimator}", f"{A}.rollout.n=2")  # 4 x 2 = 8 = world 2 x micro 2 x 2


@pytest.mark.parametrize("key", [f"{A}.actor.rollout_is", "algorithm.rollout_is"])
def test_rollout_is_needs_rollout_log_probs(key):
    msg = error_of(f"{key}=True")
    assert f"{key}=True needs actor_rollout_ref.rollout.calculate_log_probs=True" in msg
    ppo(f"{key}=True", f"{A}.rollout.calculate_log_probs=True")


def test_critic_rules_apply_only_with_gae():
    # critic mini 3 (explicit) does not divide train batch 8; irrelevant for grpo (no critic)
    msg = error_of("critic.ppo_mini_batch_size=3")
    assert "data.train_batch_size=8 is not divisible by critic.ppo_mini_batch_size=3" in msg
    ppo("critic.ppo_mini_batch_size=3", "algorithm.adv_estimator=grpo")
    msg = error_of(f"{A}.actor.ppo_micro_batch_size_per_gpu=null", f"{A}.actor.use_dynamic_bsz=True",
                   "critic.use_dynamic_bsz=False")
    assert "[critic] Please set at least one of 'critic.ppo_micro_batch_size' or " \
           "'critic.ppo_micro_batch_size_per_gpu'" in msg


def test_all_problems_are_reported_together():
    msg = error_of(f"{A}.rollout.val_kwargs.do_sample=True", "algorithm.adv_estimator=rloo")
    assert "val_kwargs.do_sample=True" in msg and "adv_estimator=rloo" in msg


@pytest.mark.parametrize("override,expected", [
    (f"{A}.actor.strategy=megatron", "actor_rollout_ref.actor.strategy='megatron' is not supported yet (only FSDP"),
    (f"{A}.rollout.name=sglang", "actor_rollout_ref.rollout.name='sglang' is not supported yet"),
    (f"{A}.model.override_config.moe_config.freeze_moe_router=True", "freeze_moe_router=True is not supported yet (Megatron only)"),
    ("data.image_key=img", "data.image_key='img' is not supported yet (multimodal data)"),
    (f"{A}.actor.optim.lr_decay_style=cosine", "lr_decay_style='cosine' is not supported yet (Megatron-only optimizer key; set lr_scheduler_type)"),
    (f"+{A}.rollout.engine_kwargs.sglang.mem=1", "engine_kwargs.sglang={'mem': 1} is not supported yet (sglang)"),
])
def test_unsupported_backends_fail_at_non_default(override, expected):
    assert expected in error_of(override)


def test_ulysses_sizes_must_divide_the_world_and_need_remove_padding():
    packed = [f"{A}.model.use_remove_padding=True", "critic.model.use_remove_padding=True"]
    # world 2 = one SP group of 2: mini 4 seqs per data-parallel rank (not 2 per rank), micro 2 divides it
    cfg = ppo(*packed, f"{A}.actor.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2",
              f"{A}.actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2")
    assert cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size == 2  # the reference follows the actor's
    assert (f"{A}.actor.ulysses_sequence_parallel_size=4 does not divide world size 2"
            in error_of(*packed, f"{A}.actor.ulysses_sequence_parallel_size=4"))
    assert (f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size=2 needs {A}.model.use_remove_padding=True"
            in error_of(f"{A}.model.use_remove_padding=False", f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size=2"))
    assert ("critic.ulysses_sequence_parallel_size=2 needs critic.model.use_remove_padding=True"
            in error_of(*packed, "algorithm.adv_estimator=gae", "critic.ulysses_sequence_parallel_size=2",
                        "critic.model.use_remove_padding=False"))


def test_ulysses_size_and_its_fsdp_copy_must_agree_at_load():
    packed = [f"{A}.model.use_remove_padding=True", "trainer.n_gpus_per_node=4"]
    err = error_of(*packed, f"{A}.actor.ulysses_sequence_parallel_size=2",
                   f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size=4")
    assert (f"{A}.actor.ulysses_sequence_parallel_size=2 and {A}.actor.fsdp_config.ulysses_sequence_parallel_size=4 "
            "differ; set one of them" in err)
    err = error_of(*packed, "algorithm.adv_estimator=gae", "critic.model.use_remove_padding=True",
                   "critic.ulysses_sequence_parallel_size=4", "critic.fsdp.ulysses_sequence_parallel_size=2")
    assert "critic.ulysses_sequence_parallel_size=4 and critic.fsdp.ulysses_sequence_parallel_size=2 differ" in err
    # the copy alone sets the size: world 4 over SP 4 is one data-parallel rank, so mini 1 x n 1 = 1 sequence
    # splits (over world 4 it would give 0 per worker); equal sizes agree
    one = ["data.train_batch_size=4", f"{A}.actor.ppo_mini_batch_size=1", f"{A}.actor.ppo_micro_batch_size_per_gpu=1",
           "critic.model.use_remove_padding=True", "critic.ppo_mini_batch_size=1", "critic.ppo_micro_batch_size_per_gpu=1"]
    ppo(*packed, *one, f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size=4",
        f"{A}.ref.ulysses_sequence_parallel_size=4", "critic.fsdp.ulysses_sequence_parallel_size=4")
    err = error_of(*packed, *one, f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size=4")
    assert f"{A}.actor.ppo_mini_batch_size=1" not in err and "critic.ppo_mini_batch_size=1 x critic.rollout_n=1 = 1" in err
    ppo(f"{A}.model.use_remove_padding=True", f"{A}.actor.ulysses_sequence_parallel_size=2",
        f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size=2")


def test_sft_ulysses_size_is_read_through_its_alias():
    assert ("ulysses_sequence_parallel_size=3 does not divide world size 2"
            in error_of("engine.ulysses_sequence_parallel_size=3", "use_remove_padding=True", "trainer.n_gpus_per_node=2",
                        "data.train_batch_size=4", "data.micro_batch_size_per_gpu=1",
                        name="sft_trainer", base=[]))


def test_prefix_grouper_with_ulysses_is_refused_at_load():
    err = error_of(f"{A}.actor.use_prefix_grouper=True", f"{A}.model.use_remove_padding=False",
                   f"{A}.actor.ulysses_sequence_parallel_size=2")
    assert (f"{A}.actor.use_prefix_grouper=True with {A}.actor.ulysses_sequence_parallel_size=2 (or its fsdp_config "
            "copy): the grouped forward is not split over the SP group" in err)
    err = error_of(f"{A}.actor.use_prefix_grouper=True", f"{A}.actor.use_kl_loss=True",
                   f"{A}.ref.fsdp_config.ulysses_sequence_parallel_size=2")
    assert f"{A}.actor.use_prefix_grouper=True with {A}.ref.ulysses_sequence_parallel_size=2" in err
    assert f"{A}.actor.ulysses_sequence_parallel_size" not in err  # the actor runs whole: only the ref is named


def test_megatron_optim_keys_accepted_at_default():
    cfg = ppo(f"{A}.actor.optim.clip_grad=1.0", f"{A}.actor.optim.min_lr=0.0", f"{A}.actor.optim.optimizer=adamw")
    assert cfg.actor_rollout_ref.actor.optim.lr_wsd_decay_style == "exponential"


@pytest.mark.parametrize("override,expected", [
    ("data.train_batch_size=abc", "data.train_batch_size='abc': expected int, got str"),
    ("data.shuffle=1", "data.shuffle=1: expected bool, got int"),
    # verl 0.6's run_qwen2-7b_seq_balance.sh passes data.return_raw_chat=$return_raw_chat, unset in its sync mode
    ("data.return_raw_chat=", "data.return_raw_chat='': expected bool, got an empty value (a shell variable"),
    ("data.max_prompt_length=", "data.max_prompt_length='': expected int, got an empty value"),
    ("data.max_prompt_length=null", "data.max_prompt_length=null: this key cannot be null"),
    (f"{A}.actor.loss_agg_mode=tokenmean", "loss_agg_mode='tokenmean' is not one of ['token-mean',"),
    (f"{A}.actor.loss_agg_mode=tokenmean", "Did you mean 'token-mean'?"),
    ("data.truncation=center", "data.truncation='center' is not one of ['error', 'left', 'right', 'middle']"),
    ("trainer.logger=[console,mlfow]", "trainer.logger: ['mlfow'] not among the allowed values"),
    (f"{A}.actor.kl_loss_type=k4", f"{A}.actor.kl_loss_type='k4' is not one of"),
])
def test_schema_catches_typos(override, expected):
    assert expected in error_of(override)


def test_schema_accepts_int_for_float_and_strategic_types():
    cfg = ppo(f"{A}.actor.optim.lr=1", "trainer.experiment_name=123", f"{A}.actor.kl_loss_type=k3+",
              "data.train_files=[a.parquet,b.parquet]")
    assert cfg.trainer.experiment_name == "123"  # a name is a string, as in a structured config
    assert list(cfg.data.train_files) == ["a.parquet", "b.parquet"]


def test_sft_rules():
    load_config("sft_trainer", ["trainer.n_gpus_per_node=2", "data.train_batch_size=8", "data.micro_batch_size_per_gpu=2"])
    msg = error_of("data.train_batch_size=12", "data.micro_batch_size_per_gpu=4", name="sft_trainer",
                   base=["trainer.n_gpus_per_node=2"])
    assert "data.train_batch_size=12 / world size 2 = 6 per worker is not divisible by " \
           "data.micro_batch_size_per_gpu=4" in msg
    msg = error_of("data.micro_batch_size=16", name="sft_trainer", base=[])
    assert "You have set both 'data.micro_batch_size'=16 (deprecated) AND 'data.micro_batch_size_per_gpu'=4" in msg
    assert "data.truncation='middle' is not one of ['error', 'left', 'right']" in \
        error_of("data.truncation=middle", name="sft_trainer", base=[])
    assert "optim.lr_scheduler='linear' is not one of ['constant', 'cosine', 'wsd']" in \
        error_of("optim.lr_scheduler=linear", name="sft_trainer", base=[])
    assert "optim.warmup_steps_ratio=1.5 must lie in [0, 1]" in \
        error_of("optim.warmup_steps_ratio=1.5", name="sft_trainer", base=[])


def test_user_yaml_file_is_merged_over_the_shipped_config(tmp_path):
    good = tmp_path / "tiny.yaml"
    good.write_text("actor_rollout_ref:\n  rollout:\n    name: hf\ntrainer:\n  n_gpus_per_node: 8\n")
    assert load_config(str(good)).actor_rollout_ref.rollout.name == "hf"
    bad = tmp_path / "typo.yaml"
    bad.write_text("actor_rollout_ref:\n  actor:\n    ppo_mini_bach_size: 4\n")
    with pytest.raises(ConfigError, match=r"Did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'\?.* \(in "):
        load_config(str(bad))


def test_no_warning_without_deprecated_keys():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ppo()


def test_sampling_parameters_must_be_in_range():
    # a negative temperature or a top_p outside (0, 1] can never sample; both are named with their value
    with pytest.raises(ConfigError) as err:
        load_config("ppo_trainer", ["actor_rollout_ref.rollout.temperature=-1",
                                    "actor_rollout_ref.rollout.val_kwargs.top_p=0"])
    assert "actor_rollout_ref.rollout.temperature=-1 must be a finite number >= 0" in str(err.value)
    assert "actor_rollout_ref.rollout.val_kwargs.top_p=0 must be in (0, 1]" in str(err.value)


def test_a_missing_config_file_is_named_with_its_resolved_path(tmp_path):
    missing = tmp_path / "my_ppo.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"Unknown config '{missing}' (no file '{missing}')")):
        load_config(str(missing), [])
    with pytest.raises(ConfigError, match=re.escape("Unknown config 'ppo_trainr' (not a shipped config; did you mean "
                                                    "'ppo_trainer'?)")):
        load_config("ppo_trainr", [])  # a misspelt shipped name is not reported as a missing file, and gets a guess


@pytest.mark.parametrize("name,base", [("ppo_trainer", SMALL), ("sft_trainer", [])])
@pytest.mark.parametrize("value", [-5, 0])
def test_total_training_steps_below_one_is_an_error_naming_the_key(name, base, value):
    # verl takes any non-null value as the step count; -5 was read here as "use the epochs" (given > 0)
    msg = error_of(f"trainer.total_training_steps={value}", name=name, base=base)
    assert f"trainer.total_training_steps={value} must be >= 1, or null" in msg
    assert load_config(name, [*base, "trainer.total_training_steps=null"]).trainer.total_training_steps is None
