"""A rank's intra-op threads follow the cores other processes leave free (issue 38, graceful under contention)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from rlhf_core.distributed import threads as T


def test_threads_for_free_cores_hand_values():
    # free = cpus - others, rounded to the nearest core, clamped to [1, max_threads]
    assert T.threads_for_free_cores(0.0, 2, 2) == 2   # a free 2-core machine: both
    assert T.threads_for_free_cores(0.5, 2, 2) == 2   # free 1.5 -> 2 (the tie rounds up)
    assert T.threads_for_free_cores(0.6, 2, 2) == 1   # free 1.4 -> 1
    assert T.threads_for_free_cores(1.0, 2, 2) == 1   # one busy loop takes a core
    assert T.threads_for_free_cores(5.0, 2, 2) == 1   # never below one
    assert T.threads_for_free_cores(0.2, 8, 4) == 4   # never above the rank's count on a free machine
    assert T.threads_for_free_cores(3.3, 8, 8) == 5   # free 4.7 -> 5
    assert T.threads_for_free_cores(-0.3, 2, 2) == 2  # tick rounding can make "others" negative: read as 0


class Scripted:
    """Tick and time sources for FreeCoreThreads: every call window lasts ``wall`` s, in which the machine's busy
    ticks grow by ``busy`` and this process's by ``own`` (ticks of 1/SC_CLK_TCK s)."""

    def __init__(self) -> None:
        self.t, self.busy, self.own = 0.0, 0, 0

    def window(self, wall: float, busy_cores: float, own_cores: float) -> None:
        self.t += wall
        self.busy += round(busy_cores * wall * T._TICKS_PER_S)
        self.own += round(own_cores * wall * T._TICKS_PER_S)


def call(ctl: T.FreeCoreThreads, src: Scripted, wall: float, busy_cores: float, own_cores: float) -> int:
    """One call of the rank: the thread count it ran with."""
    ctl.begin()
    ran_with = torch.get_num_threads()
    src.window(wall, busy_cores, own_cores)
    ctl.end()
    return ran_with


def test_the_count_follows_the_others_load_window_by_window():
    # calls of 0.25 s and a window of 0.75 s: a decision after every third call (times and ticks exact in binary)
    before = torch.get_num_threads()
    src = Scripted()
    ctl = T.FreeCoreThreads(2, window_s=0.75, read_busy=lambda: src.busy, read_own=lambda: src.own,
                            clock=lambda: src.t)
    ctl.cpus = frozenset({0, 1})
    try:
        # alone: the machine's busy cores are all ours (2.0 of 2.0): others 0 -> stays at 2
        assert [call(ctl, src, 0.25, 2.0, 2.0) for _ in range(3)] == [2, 2, 2]
        assert ctl.others_cores == 0.0 and ctl.threads == 2
        # a busy loop starts: the machine is busy 2.0 cores, ours only 1.0 -> others 1.0; the window's calls ran
        # with two threads, the next ones run with one
        assert [call(ctl, src, 0.25, 2.0, 1.0) for _ in range(3)] == [2, 2, 2]
        assert ctl.others_cores == 1.0 and ctl.threads == 1
        # at one thread: busy 2.0, ours 1.0 -> others still 1.0, stays at 1
        assert [call(ctl, src, 0.25, 2.0, 1.0) for _ in range(3)] == [1, 1, 1]
        assert ctl.threads == 1
        # the loop ends: busy 1.0, all ours -> others 0 -> back to 2
        assert [call(ctl, src, 0.25, 1.0, 1.0) for _ in range(3)] == [1, 1, 1]
        assert ctl.others_cores == 0.0 and ctl.threads == 2
        # one call longer than the window is a window of its own: busy 2.0, ours 1.2 -> others 0.8 -> free 1.2 -> 1
        assert call(ctl, src, 1.0, 2.0, 1.2) == 2
        assert ctl.others_cores == pytest.approx(0.8) and ctl.threads == 1
        # nested calls (a threaded actor's interrupt during a generation) are one window, timed by the outer one:
        # 0.5 s idle inside + 0.5 s at busy = ours -> others 0 over 1.0 s -> 2
        ctl.begin()
        assert call(ctl, src, 0.5, 0.0, 0.0) == 1
        src.window(0.5, 2.0, 2.0)
        ctl.end()
        assert ctl.others_cores == 0.0 and ctl.threads == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not os.path.exists("/proc/stat") or len(os.sched_getaffinity(0)) != 2,
                    reason="reads /proc/stat of a 2-CPU process")
def test_a_real_busy_loop_takes_a_thread_away():
    """The real tick sources: while a busy loop runs beside this process, matrix products in calls of 0.05 s see
    at least 0.8 core taken by others (the loop; on a loaded machine more) and run on one thread."""
    before = torch.get_num_threads()
    ctl = T.FreeCoreThreads(2, window_s=0.25)
    assert ctl.enabled
    a = torch.randn(256, 256)
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        for _ in range(12):
            ctl.begin()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 0.05:
                a @ a
            ctl.end()
        assert ctl.others_cores is not None and ctl.others_cores >= 0.8, ctl.others_cores
        assert ctl.threads == 1
        ctl.begin()
        assert torch.get_num_threads() == 1
        ctl.end()
    finally:
        loop.kill()
        loop.wait()
        torch.set_num_threads(before)
