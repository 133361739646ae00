"""Intra-op CPU threads per worker rank, decoupled from the Ray CPU reservation.

A PPO step runs its roles one after another (rollout, old log-prob, reference, values, actor update, critic
update), so every role may use all the cores of its node while it runs. The Ray reservation stays fractional
(``main_ppo.worker_resources``) so that several worker groups fit one node; the *thread count* of a rank is
``CPUs of the node ÷ ranks of one group on that node`` (e.g. 2 threads for one rank on a 2-core node), unless the
role's ``fsdp_config.cpu_threads`` (ours) sets it, for a user who wants to split cores between roles.
"""
from __future__ import annotations


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


# libgomp's wait policy for every rank (issue 38): an idle OpenMP thread sleeps at once instead of spinning
OMP_WAIT_POLICY = "PASSIVE"


def omp_env(threads: int) -> dict[str, str]:
    """The OpenMP environment of a worker process with ``threads`` intra-op threads: ``OMP_NUM_THREADS`` and
    ``OMP_WAIT_POLICY=PASSIVE``. Both are read once, when libgomp initialises (the first ``import torch`` of the
    process), so they belong in the environment the process starts with (a Ray actor's ``runtime_env``).

    Why PASSIVE: with libgomp's default policy a thread that finishes its share of a parallel region spins (up to
    ``GOMP_SPINCOUNT`` iterations: 300 000 by default, fewer when there are more threads than CPUs) before it
    sleeps. A PPO step of a small
    model is thousands of short parallel regions, so on a machine whose cores other processes also want the
    spinning threads burn the cores the competing work (and the rank's own other threads) need
    (``bench/bench_contention.py``; BENCHMARKS.md, "Limits of the machine").

    Raises:
        ValueError: ``threads`` < 1.
    """
    if int(threads) < 1:
        raise ValueError(f"intra-op threads must be >= 1, got {threads}")
    return {"OMP_NUM_THREADS": str(int(threads)), "OMP_WAIT_POLICY": OMP_WAIT_POLICY}


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
