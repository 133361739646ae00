"""An embedded Ray whose ``py_executable`` names a program that is not here is refused before it starts.

verl 0.9's example scripts pass ``ray_kwargs.ray_init.runtime_env.py_executable="uv -v run --frozen ..."``; on a
machine without uv, Ray then starts no worker and retries for ever (measured: `rlhf ppo` still hanging after 150 s,
the raylet logging ``exec: uv: not found``)."""
from __future__ import annotations

import sys

import pytest

from rlhf_core.config.errors import ConfigError
from rlhf_core.distributed import ray_init


def test_a_missing_program_is_named_before_ray_starts(monkeypatch):
    started = []
    monkeypatch.setattr(ray_init.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_init, "start_embedded_ray", lambda *a, **k: started.append(k))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RLHF_CONFIG_READS", raising=False)  # config-read recording would add env_vars
    value = "no-such-uv-here -v run --frozen --extra fsdp"
    with pytest.raises(ConfigError, match=r"ray_kwargs.ray_init.runtime_env.py_executable='no-such-uv-here -v run "
                                          r"--frozen --extra fsdp': 'no-such-uv-here' is not found on PATH"):
        ray_init.init_ray(None, 1, value)
    # the same value through the user's own runtime_env section (ray_kwargs.ray_init.runtime_env) is checked too
    with pytest.raises(ConfigError, match="'no-such-uv-here' is not found"):
        ray_init.init_ray(None, 1, None, {"runtime_env": {"py_executable": value}})
    assert started == []
    ray_init.init_ray(None, 1, f"{sys.executable} -u")  # a program that exists (with arguments) starts Ray
    ray_init.init_ray(None, 1, None)  # null: this Python
    assert [k["runtime_env"] for k in started] == [{"py_executable": f"{sys.executable} -u"}, None]
