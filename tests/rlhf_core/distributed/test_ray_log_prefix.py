"""Worker log lines without ANSI colour codes when the driver's output is a file or a pipe (a user's trial: a
``rlhf pipeline > run.log`` file held ``ESC[36m(ppo_remote pid=N)ESC[0m`` on every worker line); a terminal keeps
Ray's colours, and a user's own ``RAY_COLOR_PREFIX`` wins."""
from __future__ import annotations

import io

from rlhf_core.distributed.ray_init import plain_worker_prefix_when_redirected


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_redirected_output_turns_the_colour_off(monkeypatch):
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    plain_worker_prefix_when_redirected((_Tty(), io.StringIO()))  # stderr to a file: one stream is enough
    import os

    assert os.environ["RAY_COLOR_PREFIX"] == "0"


def test_a_terminal_and_a_users_setting_are_left_alone(monkeypatch):
    import os

    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    plain_worker_prefix_when_redirected((_Tty(), _Tty()))
    assert "RAY_COLOR_PREFIX" not in os.environ
    monkeypatch.setenv("RAY_COLOR_PREFIX", "1")
    plain_worker_prefix_when_redirected((io.StringIO(), io.StringIO()))
    assert os.environ["RAY_COLOR_PREFIX"] == "1"
