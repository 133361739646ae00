"""Bad model folders and tokenizers: refused in the driver, naming the path, before Ray (and so any worker) starts."""
from __future__ import annotations

import json

import pytest

from rlhf_core.config import ConfigError

from bad_input_fixtures import good_rows, ppo_error, ppo_overrides, tokenizer_without_pad_and_eos, write_parquet


def test_missing_model_path_is_named_before_ray(tmp_path):
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    missing = tmp_path / "no_model"
    msg = ppo_error(ppo_overrides(str(missing), data), FileNotFoundError)
    assert msg == f"actor_rollout_ref.model.path={str(missing)!r}: model path {str(missing)!r} does not exist"


@pytest.mark.parametrize("role, extra", [
    ("critic.model.path", ["algorithm.adv_estimator=gae"]),  # critic.enable=null: the critic is built for GAE
    ("critic.model.tokenizer_path", ["algorithm.adv_estimator=gae"]),
    ("reward_model.model.path", ["reward_model.enable=True"]),
])
@pytest.mark.parametrize("scheme", ["", "file://"])
def test_missing_model_path_of_another_role_is_named_before_ray(tiny_model_dir, tmp_path, role, extra, scheme):
    # the pipeline's GAE run once reached a Ray worker with verl's default critic.model.path
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    missing = str(tmp_path / "no_model")
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, *extra, f"{role}={scheme}{missing}"), FileNotFoundError)
    assert msg == f"{role}={scheme + missing!r}: model path {missing!r} does not exist"


def test_a_model_path_that_is_a_file_is_named_before_ray(tiny_model_dir, tmp_path):
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, "algorithm.adv_estimator=gae", f"critic.model.path={data}"),
                    FileNotFoundError)
    assert msg == f"critic.model.path={data!r}: model path {data!r} is a file; a model or tokenizer is a directory"


def test_tokenizer_without_pad_and_eos_is_refused(tiny_model_dir, tmp_path):
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    model = tokenizer_without_pad_and_eos(tiny_model_dir, tmp_path / "model")
    msg = ppo_error(ppo_overrides(model, data), ConfigError)
    assert msg.startswith(f"tokenizer at {model!r} has neither a pad token nor an eos token")


def test_tokenizer_without_pad_uses_eos(tiny_model_dir, tmp_path):
    # the control for the case above: a tokenizer with an eos but no pad is accepted, padding with the eos (verl)
    from rlhf_core.models.loading import load_tokenizer

    model = tmp_path / "model"
    tokenizer_without_pad_and_eos(tiny_model_dir, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["eos_token"] = "<|im_end|>"
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_tokenizer(str(model))
    assert tok.pad_token == tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id


def test_separate_data_tokenizer_missing_is_named(tiny_model_dir, tmp_path):
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    missing = tmp_path / "tok"
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, f"data.tokenizer={missing}"), FileNotFoundError)
    assert msg == f"model path {str(missing)!r} does not exist"
