"""Intra-op CPU threads per worker rank, decoupled from the Ray CPU reservation.

A PPO step runs its roles one after another (rollout, old log-prob, reference, values, actor update, critic
update), so every role may use all the cores of its node while it runs. The Ray reservation stays fractional
(``main_ppo.worker_resources``) so that several worker groups fit one node; the *thread count* of a rank is
``CPUs of the node ÷ ranks of one group on that node`` (e.g. 2 threads for one rank on a 2-core node), unless the
role's ``fsdp_config.cpu_threads`` (ours) sets it, for a user who wants to split cores between roles.
"""
from __future__ import annotations

import logging
import math
import os
import threading

logger = logging.getLogger(__name__)
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def threads_per_rank(cluster_cpus: float, nnodes: int, ranks_per_node: int, override: int | None = None) -> int:
    """Intra-op threads for one rank: ``override`` when given, else ``max(1, ⌊cluster_cpus ÷ nnodes ÷ ranks_per_node⌋)``.

    Args:
        cluster_cpus: CPUs of the Ray cluster (``ray.cluster_resources()["CPU"]``; ``ray_init.num_cpus`` sets it
            for an embedded instance).
        nnodes: nodes of the cluster the group spans (``trainer.nnodes``).
        ranks_per_node: ranks of one worker group per node (``trainer.n_gpus_per_node``).
        override: the role's ``fsdp_config.cpu_threads``; ``None`` = derive from the node.

    Raises:
        ValueError: when ``override`` is given and < 1, or ``nnodes``/``ranks_per_node`` < 1.
    """
    if nnodes < 1 or ranks_per_node < 1:
        raise ValueError(f"nnodes={nnodes} and ranks_per_node={ranks_per_node} must be >= 1")
    if override is not None:
        if int(override) < 1:
            raise ValueError(f"fsdp_config.cpu_threads={override} must be >= 1 (null = the node's CPUs ÷ its ranks)")
        return int(override)
    return max(1, int(float(cluster_cpus) / nnodes) // ranks_per_node)


# intra-op threads of a driver whose ranks are Ray actors (verl's TaskRunner is a Ray actor of num_cpus=1, which Ray
# starts with OMP_NUM_THREADS=1)
DRIVER_THREADS = 1


def use_driver_threads() -> int:
    """Give this process (a driver whose training ranks run as Ray actors) :data:`DRIVER_THREADS` intra-op thread
    from now on; returns the count it had.

    The driver's own tensor work is bookkeeping on ``(batch, tokens)`` tensors (repeating prompts, rule rewards,
    advantages, metrics), too small to gain from a second thread. With two, the driver's idle OpenMP thread spins
    for a while after each such op (libgomp's default wait policy) on a core the ranks are computing on, which
    slows the Ray path (``bench/bench_ray_path.py``; BENCHMARKS.md, "The Ray path against the in-process step").
    Compute stays in the ranks, which keep the threads :func:`threads_per_rank` gives them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(DRIVER_THREADS)
    return before


# libgomp's wait policy of a rank whose thread count is fixed (issue 38): an idle OpenMP thread sleeps at once
OMP_WAIT_POLICY = "PASSIVE"
# libgomp's spin of a rank whose threads follow the free cores (:class:`FreeCoreThreads`): an idle OpenMP thread
# spins this many iterations before it sleeps, enough to bridge the gap between two ops of a small model's step
GOMP_SPINCOUNT = 30000


def omp_env(threads: int, adaptive: bool = False) -> dict[str, str]:
    """The OpenMP environment of a worker process with (at most) ``threads`` intra-op threads: ``OMP_NUM_THREADS``
    and the wait policy. Both are read once, when libgomp initialises (the first ``import torch`` of the process),
    so they belong in the environment the process starts with (a Ray actor's ``runtime_env``).

    Fixed thread count (``adaptive=False``): ``OMP_WAIT_POLICY=PASSIVE``. With libgomp's default policy a thread
    that finishes its share of a parallel region spins (up to ``GOMP_SPINCOUNT`` iterations: 300 000 by default,
    fewer when there are more threads than CPUs) before it sleeps. A PPO step of a small model is thousands of short
    parallel regions, so on a machine whose cores other processes also want the spinning threads burn the cores
    the competing work (and the rank's own other threads) need (``bench/bench_contention.py``; BENCHMARKS.md,
    "Limits of the machine").

    Threads that follow the free cores (``adaptive=True``: ``trainer.adaptive_cpu_threads``,
    :class:`FreeCoreThreads`): ``GOMP_SPINCOUNT=30000`` (no ``OMP_WAIT_POLICY``). With PASSIVE every parallel
    region of a small model first wakes its sleeping partner thread (a futex round trip), which costs more than the
    op: alone on the machine, the Countdown step ran 2.4 steps/s at two passive threads against 3.3 at one and 4.8
    at two threads spinning 30 000 iterations, but 0.6 with a busy loop beside it (BENCHMARKS.md, "Short prompts
    and small steps"). The spin is only safe because the thread count drops to what other processes leave free.

    Raises:
        ValueError: ``threads`` < 1.
    """
    if int(threads) < 1:
        raise ValueError(f"intra-op threads must be >= 1, got {threads}")
    if adaptive:
        return {"OMP_NUM_THREADS": str(int(threads)), "GOMP_SPINCOUNT": str(GOMP_SPINCOUNT)}
    return {"OMP_NUM_THREADS": str(int(threads)), "OMP_WAIT_POLICY": OMP_WAIT_POLICY}


def threads_for_free_cores(others_cores: float, cpus: int, max_threads: int) -> int:
    """Intra-op threads for the cores other processes leave free: ``free = cpus - others_cores`` rounded to the
    nearest core (``⌊free + 0.5⌋``), at least 1 and at most ``max_threads``.

    Args:
        others_cores: cores (CPU-seconds per second) the *other* processes of the machine used while this one
            computed, e.g. 1.0 for one busy loop.
        cpus: the CPUs this process may run on (its affinity).
        max_threads: the rank's thread count on a free machine (:func:`threads_per_rank`).

    Example (2 CPUs, 2 threads at most): others 0.1 → 2; others 0.6 (more than half a core taken) → 1; others 1.0
    (a busy loop) → 1; others 3.0 → 1.
    """
    free = float(cpus) - max(0.0, float(others_cores))
    return max(1, min(int(max_threads), math.floor(free + 0.5)))


def _proc_stat_busy(cpus: frozenset[int]) -> int | None:
    """Busy clock ticks (user, nice, system, irq, softirq, steal) of the CPUs ``cpus`` since boot, from
    ``/proc/stat``; None where it cannot be read (not Linux)."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            v = [int(x) for x in rest.split()]
            busy += v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    return busy


def _own_ticks() -> int | None:
    """Clock ticks (user + system) all threads of this process ran since it started (``/proc/self/stat``)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)


class FreeCoreThreads:
    """A rank's intra-op thread count that follows the cores other processes leave free (issue 38).

    Around each call of the rank (:meth:`begin` before, :meth:`end` after) it reads the machine's busy CPU ticks
    (``/proc/stat``, the CPUs of this process's affinity) and its own (``/proc/self/stat``); the difference is the
    other processes' load *while this rank computed* (the driver waits in ``ray.get`` then, so it is not counted).
    Once ``window_s`` seconds of calls have been seen, the next calls run with
    :func:`threads_for_free_cores` threads (``torch.set_num_threads`` in the calling thread, where OpenMP keeps it),
    so a rank that alone uses both cores of a 2-core machine drops to one thread while another process keeps a core
    busy, and takes the second back when it leaves: its threads never wait for a core another process holds
    (the spinning partner of a descheduled thread made a step 10-20× slower, issue 38).

    The thread count changes the order of floating-point sums (the tiny test model's weights after 4 GRPO steps
    differ by up to 5e-5 between one and two threads), so results are bit-for-bit reproducible only at a fixed
    count: this class is used only when ``trainer.adaptive_cpu_threads`` asks for it. Ticks are 10 ms
    (``USER_HZ`` 100): a window of 0.25 s reads the others' load to ±0.1 core.

    Args:
        max_threads: the thread count on a free machine (:func:`threads_per_rank`).
        window_s: seconds of calls between two decisions.
        read_busy, read_own, clock: the tick and time sources (``/proc/stat``, ``/proc/self/stat``,
            ``time.monotonic``); tests pass scripted ones.

    Attributes:
        threads: the count the next call runs with.
        others_cores: the other processes' load (cores) of the last window; None before the first decision.
    """

    def __init__(self, max_threads: int, window_s: float = 0.25, read_busy=None, read_own=None, clock=None) -> None:
        import time

        self._read_busy = read_busy or (lambda: _proc_stat_busy(self.cpus))
        self._read_own = read_own or _own_ticks
        self._clock = clock or time.monotonic
        self.others_cores: float | None = None
        self.max_threads = int(max_threads)
        self.threads = self.max_threads
        self.window_s = float(window_s)
        self.cpus = frozenset(os.sched_getaffinity(0))
        self._lock = threading.Lock()
        self._depth = 0  # calls in progress (a threaded actor runs two at once)
        self._start: tuple[float, int, int] | None = None
        self._wall = 0.0
        self._others = 0  # ticks
        self.enabled = self._read_busy() is not None and self._read_own() is not None

    def begin(self) -> None:
        """Before a call: run it with the current thread count; start timing the window (outermost call only)."""
        import torch

        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        with self._lock:
            self._depth += 1
            if self.enabled and self._depth == 1:
                self._start = (self._clock(), self._read_busy(), self._read_own())

    def end(self) -> None:
        """After a call: add its window; after ``window_s`` seconds of calls, choose the next calls' count."""
        with self._lock:
            self._depth -= 1
            if not self.enabled or self._depth or self._start is None:
                return
            t0, busy0, own0 = self._start
            self._start = None
        self._wall += self._clock() - t0
        self._others += (self._read_busy() - busy0) - (self._read_own() - own0)
        if self._wall < self.window_s:
            return
        others_cores = self.others_cores = self._others / _TICKS_PER_S / self._wall
        threads = threads_for_free_cores(others_cores, len(self.cpus), self.max_threads)
        if threads != self.threads:
            logger.info("intra-op threads %d -> %d: other processes used %.2f of %d cores", self.threads, threads,
                        others_cores, len(self.cpus))
            self.threads = threads
        self._wall, self._others = 0.0, 0


# glibc malloc settings of every rank (issue 38): allocations below 32 MiB come from the heap (glibc's largest
# dynamic mmap threshold on 64-bit), and up to 1 GiB of freed memory at the heap's top stays for reuse
MALLOC_MMAP_THRESHOLD = 32 << 20
MALLOC_TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (glibc's malloc.h)


def keep_freed_heap() -> bool:
    """Make this process's glibc ``malloc`` keep freed memory for reuse instead of handing it back to the kernel
    (``mallopt(M_MMAP_THRESHOLD, 32 MiB)``, ``mallopt(M_TRIM_THRESHOLD, 1 GiB)``); returns True when both took
    effect, False where the C library has no ``mallopt`` (not glibc: a no-op).

    Why: torch's CPU tensors come from ``malloc``. A step of a small model allocates and frees the same
    activation-sized blocks (hundreds of KiB to a few MiB) every micro-batch; with glibc's defaults (mmap
    threshold 128 KiB, raised as blocks are freed; trim threshold twice it) the freed top of the heap is returned
    to the kernel and the next micro-batch faults every page in again: 19,134 minor page faults per actor update
    of the Countdown model (128 rows × 44 tokens, one thread), 1 with these settings, and about a tenth less CPU
    time per update (BENCHMARKS.md, "Short prompts and small steps"). PyTorch's CPU performance guide gives the
    same cause and recommends another allocator (jemalloc, tcmalloc) for it; these two settings get the effect
    without a preloaded library. Cost: the process keeps its peak heap (up to 1 GiB more than it uses at a
    given moment); blocks of 32 MiB and more are still mapped and unmapped one by one."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # no C library by that name, or one without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                                     MALLOC_TRIM_THRESHOLD))
