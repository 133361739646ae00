"""A CPU rank's OpenMP threads spin while they have the cores and sleep at once under contention (issue 38)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlhf_core.distributed import threads as T


def test_spin_is_safe_hand_values():
    # free = cpus - others, rounded to the nearest core; spinning is safe while every thread has a core
    assert T.spin_is_safe(0.0, 2, 2)        # a free 2-core machine
    assert T.spin_is_safe(0.5, 2, 2)        # free 1.5 -> 2 (the tie rounds up)
    assert not T.spin_is_safe(0.6, 2, 2)    # free 1.4 -> 1 < 2 threads
    assert not T.spin_is_safe(1.0, 2, 2)    # a busy loop takes a core
    assert T.spin_is_safe(1.0, 2, 1)        # ... which still leaves one thread its core
    assert T.spin_is_safe(3.3, 8, 4)        # free 4.7 -> 5 >= 4
    assert not T.spin_is_safe(4.6, 8, 4)    # free 3.4 -> 3 < 4
    assert T.spin_is_safe(-0.3, 2, 2)       # tick rounding can make "others" negative: read as 0


class Scripted:
    """Tick and time sources: every call window lasts ``wall`` s, in which the machine's busy ticks grow by
    ``busy_cores`` and this process's by ``own_cores`` (ticks of 1/SC_CLK_TCK s)."""

    def __init__(self) -> None:
        self.t, self.busy, self.own = 0.0, 0, 0

    def window(self, wall: float, busy_cores: float, own_cores: float) -> None:
        self.t += wall
        self.busy += round(busy_cores * wall * T._TICKS_PER_S)
        self.own += round(own_cores * wall * T._TICKS_PER_S)


class Recording(T.SpinSwitch):
    """The decisions, without parking a real thread."""

    def throttle(self) -> None:
        self.spinning = False

    def unthrottle(self) -> None:
        self.spinning = True


def call(sw: T.SpinSwitch, src: Scripted, wall: float, busy_cores: float, own_cores: float) -> bool:
    """One call of the rank; whether the threads spun during it."""
    sw.begin()
    spun = sw.spinning
    src.window(wall, busy_cores, own_cores)
    sw.end()
    return spun


def test_the_switch_follows_the_others_load_window_by_window():
    # calls of 0.25 s and a window of 0.75 s: a decision after every third call (times and ticks exact in binary)
    src = Scripted()
    sw = Recording(2, window_s=0.75, read_busy=lambda: src.busy, read_own=lambda: src.own, clock=lambda: src.t)
    sw.cpus = frozenset({0, 1})
    # alone: the machine's busy cores are all ours (2.0 of 2.0): others 0 -> keeps spinning
    assert [call(sw, src, 0.25, 2.0, 2.0) for _ in range(3)] == [True] * 3
    assert sw.others_cores == 0.0 and sw.spinning
    # a busy loop starts: the machine is busy 2.0 cores, ours 1.0 -> others 1.0 -> throttled from the next call
    assert [call(sw, src, 0.25, 2.0, 1.0) for _ in range(3)] == [True] * 3
    assert sw.others_cores == 1.0 and not sw.spinning
    assert [call(sw, src, 0.25, 2.0, 1.0) for _ in range(3)] == [False] * 3
    # the loop ends: busy 1.5, all ours -> others 0 -> spins again
    assert [call(sw, src, 0.25, 1.5, 1.5) for _ in range(3)] == [False] * 3
    assert sw.others_cores == 0.0 and sw.spinning
    # one call longer than the window is a window of its own: busy 2.0, ours 1.4 -> others 0.6 -> throttled
    assert call(sw, src, 1.0, 2.0, 1.4)
    assert sw.others_cores == pytest.approx(0.6) and not sw.spinning
    # nested calls (a threaded actor's interrupt during a generation) are one window, timed by the outer one:
    # 0.5 s idle inside + 0.5 s at busy = ours -> others 0 over 1.0 s -> spins
    sw.begin()
    call(sw, src, 0.5, 0.0, 0.0)
    src.window(0.5, 2.0, 2.0)
    sw.end()
    assert sw.others_cores == 0.0 and sw.spinning


PROBE = """
import json, time
import torch
from rlhf_core.distributed.threads import SpinSwitch

a = torch.ones(1 << 20)


def cpu_of_gaps(n=300):
    # parallel ops 2 ms apart: an idle thread that spins burns CPU in each gap, one that sleeps does not
    t0 = time.process_time()
    for _ in range(n):
        a.mul_(1.0000001)
        time.sleep(0.002)
    return time.process_time() - t0


sw = SpinSwitch(2)
out = {"spinning": cpu_of_gaps()}
sw.throttle()
out["throttled"] = cpu_of_gaps()
sw.unthrottle()
out["again"] = cpu_of_gaps()
print(json.dumps(out))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libgomp's spin (torch's Linux wheels)")
def test_throttle_makes_libgomp_threads_sleep_and_unthrottle_spin_again():
    """The real switch in a process started as a rank is (omp_env: GOMP_SPINCOUNT=30000 with OMP_WAIT_POLICY=PASSIVE,
    2 threads): 300 parallel ops 2 ms apart cost 0.28 s of CPU spinning on the idle machine (the partner spins
    ~0.7 ms per gap), 0.07 s throttled (PASSIVE's throttled spin is 0); spinning again after unthrottle."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(T.omp_env(2, spin_switch=True))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    cpu = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert cpu["throttled"] < 0.6 * cpu["spinning"], cpu
    assert cpu["throttled"] < 0.6 * cpu["again"], cpu
