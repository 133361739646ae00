"""``ray_kwargs.ray_init.<any>`` (issue 35's trial): verl hands that section to ``ray.init`` whole, so any argument of
``ray.init`` is accepted (checked against its signature, with a did-you-mean) and reaches the real ``ray.init``."""
from __future__ import annotations

import pytest
import ray

from rlhf_core.config import ConfigError, load_config
from rlhf_core.distributed.ray_init import init_ray, ray_init_extra

pytestmark = pytest.mark.ray  # starts Ray: calls init_ray


def test_any_ray_init_argument_loads_and_a_typo_is_named():
    cfg = load_config("ppo_trainer", ["+ray_kwargs.ray_init.namespace=rlhf_ns", "+ray_kwargs.ray_init.log_to_driver=False",
                                      "+ray_kwargs.ray_init.runtime_env.env_vars={RLHF_X: '1'}",
                                      "ray_kwargs.ray_init.runtime_env.py_executable=python3"])
    # num_cpus and runtime_env.py_executable are init_ray's own parameters (read through the schema); the rest
    # is passed on as written
    assert ray_init_extra(cfg.ray_kwargs.ray_init) == {"namespace": "rlhf_ns", "log_to_driver": False,
                                                       "runtime_env": {"env_vars": {"RLHF_X": "1"}}}
    assert cfg.ray_kwargs.ray_init.runtime_env.py_executable == "python3"
    ev = load_config("evaluation", ["+ray_kwargs.ray_init.namespace=e"])
    assert ray_init_extra(ev.ray_kwargs.ray_init, ("num_cpus",)) == {"namespace": "e"}
    with pytest.raises(ConfigError) as info:
        load_config("ppo_trainer", ["+ray_kwargs.ray_init.include_dashbord=True"])
    assert "'ray_kwargs.ray_init.include_dashbord': 'include_dashbord' is not an argument of ray.init" in str(info.value)
    assert "Did you mean 'include_dashboard'?" in str(info.value)


def test_the_extra_arguments_reach_ray_init():
    cfg = load_config("ppo_trainer", ["+ray_kwargs.ray_init.namespace=rlhf_ns",
                                      "+ray_kwargs.ray_init.runtime_env.env_vars={RLHF_X: '7'}"])
    assert not ray.is_initialized()
    init_ray(None, 1, None, ray_init_extra(cfg.ray_kwargs.ray_init))
    try:
        assert ray.get_runtime_context().namespace == "rlhf_ns"

        @ray.remote(num_cpus=0)
        def read_env() -> str | None:
            import os
            return os.environ.get("RLHF_X")

        assert ray.get(read_env.remote()) == "7"  # the user's runtime_env env_vars reached the worker
    finally:
        ray.shutdown()
