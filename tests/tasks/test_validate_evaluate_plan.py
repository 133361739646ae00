"""Issue 33's plan functions for the validate and evaluate tasks: where validation runs (segments, or the validate
task's val-only run of a checkpoint), and the evaluation suites (sampling, generation keys, per-suite metric names)."""
from __future__ import annotations

import pytest

from tasks import plan


def _ppo(tmp_path, preset=(), user=()):
    return plan.ppo_overrides(list(preset), list(user), model_path="/m", train_file="/t.parquet",
                              val_file="/v.parquet", run_dir=str(tmp_path), total_steps=4, segment_steps=2,
                              stop_after_step=2, adv_estimator="grpo", experiment="e")


def test_validation_is_the_validate_tasks_unless_test_freq_was_set(tmp_path):
    """Issue 33: segments validate nothing (test_freq -1, no val_before_train) unless the preset or the user set
    trainer.test_freq; the validate task runs the same list in val-only mode on one checkpoint (or step 0)."""
    d = dict(x.split("=", 1) for x in plan.segment_overrides(_ppo(tmp_path, ["trainer.val_before_train=True"])))
    assert (d["trainer.test_freq"], d["trainer.val_before_train"]) == ("-1", "False")
    for preset, user in ((["trainer.test_freq=5"], []), ([], ["trainer.test_freq=5"])):
        assert dict(x.split("=", 1) for x in _ppo(tmp_path, preset, user))["trainer.test_freq"] == "5"
    ckpt = str(tmp_path / "checkpoints" / "global_step_2")
    v = dict(x.split("=", 1) for x in plan.validate_overrides(_ppo(tmp_path), ckpt))
    assert (v["trainer.val_only"], v["trainer.val_before_train"], v["trainer.resume_mode"]) == ("True", "True",
                                                                                                 "resume_path")
    assert v["trainer.resume_from_path"] == ckpt and v["trainer.del_local_ckpt_after_load"] == "False"
    step0 = dict(x.split("=", 1) for x in plan.validate_overrides(_ppo(tmp_path), None))
    assert step0["trainer.resume_mode"] == "disable" and "trainer.resume_from_path" not in step0
    from rlhf_core.config import load_config

    t = load_config("ppo_trainer", plan.validate_overrides(_ppo(tmp_path), ckpt)).trainer
    assert (t.val_only, t.val_before_train, t.resume_from_path) == (True, True, ckpt)


def test_suites_default_to_the_validation_sampling_and_named_suites_label_their_metrics():
    from rlhf_core.config import ConfigError, load_config

    cfg = load_config("ppo_trainer", ["actor_rollout_ref.rollout.val_kwargs.n=2", "data.max_response_length=64",
                                      "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
                                      "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"])
    [default] = plan.resolve_suites([], "/v.parquet", cfg)
    assert default == {"name": "val", "files": ["/v.parquet"], "n": 2, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                       "do_sample": True, "response_length": 64, "labelled": False}
    [greedy] = plan.resolve_suites([{"name": "math500", "files": ["/a", "/b"], "n": 1, "temperature": 0.0,
                                     "top_p": 0.9, "response_length": None}], "/v.parquet", cfg)
    assert (greedy["do_sample"], greedy["response_length"], greedy["labelled"]) == (False, 64, True)
    g = dict(x.split("=", 1) for x in plan.generation_overrides(greedy, "/p.parquet", "/r.parquet", "/m", cfg))
    assert (g["data.n_samples"], g["rollout.do_sample"], g["rollout.top_p"], g["rollout.response_length"]) == (
        "1", "False", "0.9", "64")
    assert load_config("generation", plan.generation_overrides(greedy, "/p", "/r", "/m", cfg)).model.path == "/m"
    with pytest.raises(ConfigError, match=r"evaluation.suites\[0\].name='a b'"):
        plan.resolve_suites([{**greedy, "name": "a b"}], "/v", cfg)
    named = plan.suite_metric_names({"test_score/openai/gsm8k": 0.5, "pass@2/num_prompts/openai/gsm8k": 8.0,
                                     "reward/num_errors/x": 0.0, "other": 1.0}, "math500", ["openai/gsm8k", "x"])
    assert named == {"test_score/math500/openai/gsm8k": 0.5, "pass@2/num_prompts/math500/openai/gsm8k": 8.0,
                     "reward/num_errors/math500/x": 0.0, "other": 1.0}
