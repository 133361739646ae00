"""Bad configs through the user's entry points (``rlhf ppo``, a config file, ``run_ppo``): one line naming the key
and value, before Ray starts. Key-by-key rules are in tests/rlhf_core/config/test_config_bad_input.py and
tests/rlhf_core/config/test_config_validation.py; these check what the user sees and that nothing expensive started."""
from __future__ import annotations

import pytest

from rlhf_core.config import ConfigError

from bad_input_fixtures import good_rows, ppo_error, ppo_overrides, write_parquet


def test_rlhf_ppo_unknown_key_is_one_line_exit_1_without_traceback(tmp_path, capsys):
    import ray

    from rlhf_core.trainer.main_ppo import main

    rc = main([f"data.train_files={tmp_path}/t.parquet", "actor_rollout_ref.actor.clip_ratoi=0.2"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and not ray.is_initialized()
    assert err.startswith("rlhf ppo: error: Unknown config key 'actor_rollout_ref.actor.clip_ratoi'.")
    assert "Did you mean 'actor_rollout_ref.actor.clip_ratio'?" in err


def test_value_of_the_wrong_type_names_key_and_value():
    from rlhf_core.config import load_config

    with pytest.raises(ConfigError) as info:
        load_config("ppo_trainer", ["data.train_batch_size=eight"])
    assert "data.train_batch_size" in str(info.value) and "eight" in str(info.value)


def test_impossible_batch_sizes_are_refused_before_ray(tiny_model_dir, tmp_path):
    # mini-batch 3 does not divide the train batch 4: refused by validation in run_ppo, before the tokenizer or Ray
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, "actor_rollout_ref.actor.ppo_mini_batch_size=3"), ValueError)
    assert "actor_rollout_ref.actor.ppo_mini_batch_size" in msg and "3" in msg


def test_micro_batch_larger_than_mini_batch_is_refused_before_ray(tiny_model_dir, tmp_path):
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"),
                    ValueError)
    assert "ppo_micro_batch_size_per_gpu" in msg
