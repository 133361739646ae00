"""``rlhf pipeline`` honours ``ray_kwargs.ray_init.runtime_env.py_executable`` as ``rlhf ppo`` does: the PPO
stages' Ray task (ppo_segment, validate) runs under it, and so do the worker actors that task starts (Ray's
runtime_env inheritance), with the user's ``runtime_env.env_vars``; a program that is not here is refused by name
before any task starts."""
from __future__ import annotations

import os
import stat
import sys

import pytest

from conftest_services import ray_local  # noqa: F401
from rlhf_core.config import ConfigError, load_config

pytestmark = pytest.mark.ray


def _wrapper(tmp_path) -> str:
    """A ``py_executable``: a script that marks the environment, then runs this Python with Ray's arguments."""
    script = tmp_path / "marked-python"
    script.write_text(f"#!/bin/sh\nRLHF_TEST_WRAPPED=yes exec {sys.executable} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def _marks() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in ("RLHF_TEST_WRAPPED", "USER_VAR", "ACTOR_VAR")}


def _probe() -> dict[str, dict[str, str | None]]:
    """Runs as the stage's driver task: its own environment, and that of an actor it starts with its own env_vars
    (as rlhf_core.distributed.worker_group starts the training ranks)."""
    import ray

    @ray.remote(num_cpus=0)
    class Rank:
        def marks(self):
            return _marks()

    actor = Rank.options(runtime_env={"env_vars": {"ACTOR_VAR": "1"}}).remote()
    try:
        return {"driver": _marks(), "actor": ray.get(actor.marks.remote())}
    finally:
        ray.kill(actor)


def test_the_ppo_stage_task_and_its_actors_run_under_py_executable(tmp_path, ray_local):
    from ray import cloudpickle

    from infra.ray_cluster import run_on_ray

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    from tasks.train_stages import ppo_runtime_env

    config = load_config("ppo_trainer", [f"ray_kwargs.ray_init.runtime_env.py_executable={_wrapper(tmp_path)}",
                                         "+ray_kwargs.ray_init.runtime_env.env_vars={USER_VAR:u}"])
    renv = ppo_runtime_env(config, {"ray_address": None})
    assert renv == {"py_executable": _wrapper(tmp_path), "env_vars": {"USER_VAR": "u"}}
    seen = run_on_ray(_probe, runtime_env=renv)
    assert seen == {"driver": {"RLHF_TEST_WRAPPED": "yes", "USER_VAR": "u", "ACTOR_VAR": None},
                    "actor": {"RLHF_TEST_WRAPPED": "yes", "USER_VAR": "u", "ACTOR_VAR": "1"}}
    # without the key: this Python, as before (no runtime_env of ours)
    assert ppo_runtime_env(load_config("ppo_trainer", []), {"ray_address": None}) is None
    assert run_on_ray(_probe)["actor"]["RLHF_TEST_WRAPPED"] is None


def test_a_missing_program_is_refused_by_name_and_the_stages_pass_the_runtime_env(tmp_path, monkeypatch):
    from tasks import train_stages

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    missing = load_config("ppo_trainer", ["ray_kwargs.ray_init.runtime_env.py_executable=no-such-uv-here run"])
    with pytest.raises(ConfigError, match="py_executable='no-such-uv-here run': 'no-such-uv-here' is not found"):
        train_stages.ppo_runtime_env(missing, {"ray_address": None})
    # on a cluster the program is the nodes' business: not checked here
    assert train_stages.ppo_runtime_env(missing, {"ray_address": "ray://h:10001"}) == {
        "py_executable": "no-such-uv-here run"}
    # ppo_segment and validate hand it to their Ray task
    seen = []

    def run_on_ray(self, fn, *args, **kwargs):
        seen.append((self.stage, kwargs["runtime_env"]))
        raise RuntimeError("stop here")

    monkeypatch.setattr(train_stages.StageDeadline, "run_on_ray", run_on_ray)
    ctx = {"home": str(tmp_path), "ray_address": None, "timeouts": {}}
    overrides = [f"ray_kwargs.ray_init.runtime_env.py_executable={sys.executable} -u",
                 f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.total_training_steps=2"]
    with pytest.raises(RuntimeError, match="stop here"):
        train_stages.ppo_segment.fn(overrides, 1, "run", ctx)
    with pytest.raises(RuntimeError, match="stop here"):
        train_stages.validate.fn(overrides, None, 0, "run", ctx)
    assert seen == [("ppo_segment", {"py_executable": f"{sys.executable} -u"}),
                    ("validate", {"py_executable": f"{sys.executable} -u"})]


def test_the_pipeline_checks_name_a_missing_py_executable_before_any_stage(monkeypatch):
    from flows.preflight import checks
    from flows.settings import resolve_settings

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    key = "ray_kwargs.ray_init.runtime_env.py_executable"
    field = f"ppo {key}"  # run_checks prefixes a failure with the experiment file and this field
    missing = dict(checks(resolve_settings({"preset": "countdown", "ppo_overrides": [f"{key}=no-such-uv-here run"]})))
    with pytest.raises(ConfigError, match=rf"{key}='no-such-uv-here run': 'no-such-uv-here' is not found on PATH"):
        missing[field]()
    here = dict(checks(resolve_settings({"preset": "countdown", "ppo_overrides": [f"{key}={sys.executable}"]})))
    assert here[field]() == f"{sys.executable} (found on PATH; the ppo stages' Ray workers start with it)"
    assert field not in dict(checks(resolve_settings({"preset": "countdown"})))  # unset: no such check
