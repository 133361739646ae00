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


# libgomp's wait policy of a rank with one thread, or on a GPU: an idle OpenMP thread sleeps at once
OMP_WAIT_POLICY = "PASSIVE"
# libgomp's spin of a CPU rank with several threads (:class:`SpinSwitch`): an idle OpenMP thread spins this many
# iterations (about 0.7 ms here) before it sleeps, which bridges the gap between two ops of a small model's step
GOMP_SPINCOUNT = 30000


def omp_env(threads: int, spin_switch: bool = False) -> dict[str, str]:
    """The OpenMP environment of a worker process with ``threads`` intra-op threads: ``OMP_NUM_THREADS`` and the
    wait policy. Both are read once, when libgomp initialises (the first ``import torch`` of the process), so they
    belong in the environment the process starts with (a Ray actor's ``runtime_env``).

    ``spin_switch=False``: ``OMP_WAIT_POLICY=PASSIVE``, idle threads sleep at once. With libgomp's default policy a
    thread that finishes its share of a parallel region spins (up to ``GOMP_SPINCOUNT`` iterations: 300 000 by
    default) before it sleeps, and on a machine whose cores other processes also want the spinning threads burn the
    cores the competing work (and the rank's own other threads) need: TRL's step ran 23× slower beside one busy
    loop (BENCHMARKS.md, "Limits of the machine").

    ``spin_switch=True`` (a CPU rank of several threads, :class:`SpinSwitch`): ``GOMP_SPINCOUNT=30000`` *and*
    ``OMP_WAIT_POLICY=PASSIVE``: libgomp takes an explicit ``GOMP_SPINCOUNT`` as the spin, while PASSIVE leaves its
    *throttled* spin (used while it manages more threads than CPUs) at 0 iterations (libgomp's ``initialize_env``;
    measured: 0.28 s of CPU spinning, 0.07 s throttled, in ``test_spin_switch.py``'s probe). Both are set here, so
    a rank gets the same whatever its driver's environment holds (the ``rlhf`` program sets PASSIVE for itself,
    and an embedded Ray's workers inherit the driver's environment). With PASSIVE alone every parallel region of a
    small model first wakes its sleeping partner thread (a futex round trip), which costs more than the op: alone
    on the machine, the Countdown step ran 2.4 steps/s at two passive threads against 4.8 at two threads spinning
    30 000 iterations, but 0.6 with a busy loop beside it (BENCHMARKS.md, "Short prompts and small steps"). The
    spin is safe because :class:`SpinSwitch` switches to the throttled spin (none: idle threads sleep at once) while
    other processes want the cores.

    Raises:
        ValueError: ``threads`` < 1.
    """
    if int(threads) < 1:
        raise ValueError(f"intra-op threads must be >= 1, got {threads}")
    if spin_switch and int(threads) > 1:
        return {"OMP_NUM_THREADS": str(int(threads)), "OMP_WAIT_POLICY": OMP_WAIT_POLICY,
                "GOMP_SPINCOUNT": str(GOMP_SPINCOUNT)}
    return {"OMP_NUM_THREADS": str(int(threads)), "OMP_WAIT_POLICY": OMP_WAIT_POLICY}


def spin_is_safe(others_cores: float, cpus: int, threads: int) -> bool:
    """Whether each of a rank's ``threads`` threads has a core of its own while other processes use
    ``others_cores`` cores (CPU-seconds per second) of its ``cpus`` CPUs: ``cpus - others_cores``, rounded to the
    nearest core (``⌊free + 0.5⌋``), is at least ``threads``.

    Example (2 CPUs, 2 threads): others 0.1 → True; 0.5 → True (the tie rounds up); 0.6 → False (more than half a
    core taken); 1.0 (a busy loop) → False. Tick rounding can make ``others_cores`` slightly negative: read as 0.
    """
    free = float(cpus) - max(0.0, float(others_cores))
    return math.floor(free + 0.5) >= int(threads)


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


class SpinSwitch:
    """A CPU rank's OpenMP threads spin while they have the cores to themselves and sleep at once while other
    processes want them (issue 38: fast alone, graceful under contention), at a fixed thread count.

    Measuring: around each call of the rank (:meth:`begin` before, :meth:`end` after) it reads the machine's busy
    CPU ticks (``/proc/stat``, the CPUs of this process's affinity) and its own (``/proc/self/stat``); the difference
    is the other processes' load *while this rank computed* (the driver waits in ``ray.get`` then, so it is not
    counted). Every ``window_s`` seconds of calls it decides with :func:`spin_is_safe`. Ticks are 10 ms
    (``USER_HZ`` 100): a window of 0.25 s reads the others' load to about ±0.1 core.

    Switching: the process starts with ``GOMP_SPINCOUNT=30000`` and ``OMP_WAIT_POLICY=PASSIVE`` (:func:`omp_env`).
    libgomp spins only its *throttled* count (0 iterations with PASSIVE; 100 without a policy) while it manages more
    threads than the process has CPUs (``gomp_managed_threads > gomp_available_cpus``, libgomp's ``do_spin``). To
    throttle, a parked Python thread runs one parallel op (its own OpenMP team: one more managed thread) and waits;
    to spin again it returns, and libgomp frees its team at the thread's exit. Seen from outside (300 parallel ops
    2 ms apart, 2 threads, ``test_spin_switch.py``'s probe): 0.28 s of CPU spinning, 0.07 s throttled.
    The thread count never changes, so results are bit-for-bit the same at any load (a count that followed the load
    changed the tiny model's weights by up to 5e-5 after 4 steps, and one thread under heavy load gets half the
    CPU share of two: 0.97 against 2.65 steps/s at load 14). With another OpenMP runtime the parked thread is
    harmless and the spin is that runtime's.

    Args:
        threads: the rank's intra-op threads (``OMP_NUM_THREADS``).
        window_s: seconds of calls between two decisions.
        read_busy, read_own, clock: the tick and time sources (``/proc/stat``, ``/proc/self/stat``,
            ``time.monotonic``); tests pass scripted ones.

    Attributes:
        spinning: False while throttled.
        others_cores: the other processes' load (cores) of the last window; None before the first decision.
    """

    def __init__(self, threads: int, window_s: float = 0.25, read_busy=None, read_own=None, clock=None) -> None:
        import time

        self.threads = int(threads)
        self.window_s = float(window_s)
        self.cpus = frozenset(os.sched_getaffinity(0))
        self._read_busy = read_busy or (lambda: _proc_stat_busy(self.cpus))
        self._read_own = read_own or _own_ticks
        self._clock = clock or time.monotonic
        self.others_cores: float | None = None
        self.spinning = True
        self._parked: threading.Thread | None = None
        self._release = threading.Event()
        self._lock = threading.Lock()  # the window's counters
        self._switch = threading.Lock()  # one throttle/unthrottle at a time
        self._depth = 0  # calls in progress (a threaded actor runs two at once)
        self._start: tuple[float, int, int] | None = None
        self._wall = 0.0
        self._others = 0  # ticks
        self.enabled = self._read_busy() is not None and self._read_own() is not None

    def begin(self) -> None:
        """Before a call: start timing the window (the outermost call only)."""
        with self._lock:
            self._depth += 1
            if self.enabled and self._depth == 1:
                self._start = (self._clock(), self._read_busy(), self._read_own())

    def end(self) -> None:
        """After a call: add its window; after ``window_s`` seconds of calls, spin or throttle from now on."""
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
            others = self.others_cores = self._others / _TICKS_PER_S / self._wall
            self._wall, self._others = 0.0, 0
            spin = spin_is_safe(others, len(self.cpus), self.threads)
        if spin != self.spinning:  # switched outside the window's lock: a concurrent call's begin() never waits
            with self._switch:
                if spin != self.spinning:
                    logger.info("OpenMP threads %s: other processes used %.2f of %d cores",
                                "spin again" if spin else "sleep at once", others, len(self.cpus))
                    self.unthrottle() if spin else self.throttle()

    def throttle(self) -> None:
        """libgomp's threads spin only its throttled count from now on (a parked thread's team; idempotent)."""
        if self._parked is not None:
            return
        ready, self._release, team = threading.Event(), threading.Event(), []

        def park() -> None:
            try:
                import torch

                torch.set_num_threads(self.threads)
                torch.ones(1 << 20).mul_(2.0)  # above torch's grain size: a parallel region, this thread's own team
                team.append(True)
            finally:
                ready.set()
            self._release.wait()

        parked = threading.Thread(target=park, name="omp-throttle", daemon=True)
        parked.start()
        if not ready.wait(timeout=10.0) or not team:  # the op failed (or hangs): nothing throttles, say so
            logger.warning("OpenMP threads: could not throttle the spin (the parked thread's op %s); they keep "
                           "spinning", "failed" if ready.is_set() else "did not finish in 10 s")
            self._release.set()
            return
        self._parked = parked
        self.spinning = False

    def unthrottle(self) -> None:
        """libgomp's threads spin ``GOMP_SPINCOUNT`` again (the parked thread returns; idempotent)."""
        if self._parked is None:
            return
        self._release.set()
        self._parked.join(timeout=10.0)
        if self._parked.is_alive():  # its team lives on: still throttled (never a second parked thread)
            logger.warning("OpenMP threads: the parked thread did not end in 10 s; they stay throttled")
            return
        self._parked = None
        self.spinning = True


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
