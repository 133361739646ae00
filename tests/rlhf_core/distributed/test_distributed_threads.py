"""Workers use the cores they are given: the intra-op thread count of a Ray rank follows the node's CPUs ÷ its
ranks (or the role's ``fsdp_config.cpu_threads``), independent of the fractional Ray CPU reservation."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from rlhf_core.config import load_config  # noqa: E402
from rlhf_core.distributed import RayWorkerGroup, init_ray  # noqa: E402
from rlhf_core.distributed.threads import threads_per_rank  # noqa: E402
from rlhf_core.trainer.main_ppo import worker_resources, worker_threads  # noqa: E402

pytestmark = pytest.mark.ray  # starts Ray: calls init_ray


def test_threads_per_rank_hand_values():
    # 2 CPUs, 1 node, 1 rank -> both cores; 16 CPUs on 2 nodes with 4 ranks each -> 8 per node / 4 = 2
    assert threads_per_rank(2, 1, 1) == 2
    assert threads_per_rank(16, 2, 4) == 2
    # fewer CPUs than ranks still gives each rank one thread; 2.5 CPUs (fractional Ray count) -> floor 2
    assert threads_per_rank(2, 1, 4) == 1
    assert threads_per_rank(2.5, 1, 1) == 2
    assert threads_per_rank(2, 1, 1, override=1) == 1  # the user's split wins
    with pytest.raises(ValueError, match="cpu_threads=0"):
        threads_per_rank(2, 1, 1, override=0)
    with pytest.raises(ValueError, match="ranks_per_node=0"):
        threads_per_rank(2, 1, 0)


@pytest.fixture(scope="module")
def ray_2cpu():
    import ray

    # the driver's own OMP_WAIT_POLICY (rlhf_cli.main sets it; a test calling main in this process leaves it) would
    # reach the workers without the actor runtime_env under test: start Ray without it
    saved = os.environ.pop("OMP_WAIT_POLICY", None)
    try:
        init_ray(num_cpus=2)
        yield
    finally:
        ray.shutdown()
        if saved is not None:
            os.environ["OMP_WAIT_POLICY"] = saved


def test_ray_worker_threads_follow_the_node_not_the_reservation(ray_2cpu):
    class ThreadReport:  # defined here so Ray pickles it by value
        def threads(self) -> tuple[int, str]:
            import torch

            return torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]

    cfg = load_config("ppo_trainer", ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.device=cpu"])
    # actor + critic groups on 2 CPUs: each reserves 1 CPU (min(1, 2 / 2)), ...
    cpus, _ = worker_resources(cfg, 2)
    assert cpus == 1.0
    # ... yet the one actor rank runs 2 threads (the node's 2 CPUs / 1 rank): the roles run one after another
    n = worker_threads(cfg, cfg.actor_rollout_ref.actor.fsdp_config.cpu_threads)
    assert n == 2
    wg = RayWorkerGroup(ThreadReport, 1, {}, num_cpus_per_worker=cpus, name_prefix="thr", num_threads=n)
    try:
        assert wg.execute_all("threads") == [(2, "2")]
    finally:
        wg.shutdown()
    # a user's per-role split: critic.fsdp.cpu_threads=1
    cfg1 = load_config("ppo_trainer", ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "critic.fsdp.cpu_threads=1"])
    n1 = worker_threads(cfg1, cfg1.critic.fsdp.cpu_threads)
    wg = RayWorkerGroup(ThreadReport, 1, {}, num_cpus_per_worker=0.5, name_prefix="thr1", num_threads=n1)
    try:
        assert wg.execute_all("threads") == [(1, "1")]
    finally:
        wg.shutdown()


def test_ray_ranks_start_with_the_openmp_environment(ray_2cpu):
    """libgomp reads OMP_* once, when torch loads it, and unpickling the actor class imports torch before the actor's
    __init__ runs: the variables must be in the environment the process *started* with (/proc/self/environ, which
    a later os.environ update does not change), i.e. in the actor's runtime_env (issue 38, contention)."""
    class StartEnv:  # defined here so Ray pickles it by value
        def start_env(self) -> dict:
            with open("/proc/self/environ", "rb") as f:
                pairs = [kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv]
            return {k.decode(): v.decode() for k, v in pairs if k.startswith((b"OMP_", b"GOMP_"))}

    assert "OMP_WAIT_POLICY" not in os.environ  # only the runtime_env can give the worker PASSIVE (ray_2cpu)
    envs = {}
    for threads in (1, 2):
        wg = RayWorkerGroup(StartEnv, 1, {}, num_cpus_per_worker=1, name_prefix="ompenv", num_threads=threads)
        try:
            (envs[threads],) = wg.execute_all("start_env")
            spinning = wg.omp_spinning()
        finally:
            wg.shutdown()
        # one thread: nothing to spin for, idle threads sleep at once and the rank has no switch
        # two threads on CPU: a short spin (threads.GOMP_SPINCOUNT) that the rank's SpinSwitch throttles
        assert spinning == ([None] if threads == 1 else [True]), (threads, spinning)
    assert envs[1] == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}, envs
    assert envs[2] == {"GOMP_SPINCOUNT": "30000", "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2"}, envs


@pytest.mark.skipif(len(os.sched_getaffinity(0)) != 2, reason="a busy loop must take one of two CPUs")
def test_a_ray_rank_stops_spinning_while_a_busy_loop_runs(ray_2cpu):
    """A rank of 2 threads on 2 CPUs whose calls run while a busy loop holds a core measures the loop's load and
    throttles its OpenMP spin (threads.SpinSwitch); its thread count stays 2."""
    class Compute:  # defined here so Ray pickles it by value
        def work(self, seconds: float) -> int:
            import time

            import torch

            a, t0 = torch.randn(256, 256), time.monotonic()
            while time.monotonic() - t0 < seconds:
                a @ a
            return torch.get_num_threads()

    wg = RayWorkerGroup(Compute, 1, {}, num_cpus_per_worker=1, name_prefix="spin", num_threads=2)
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        # three calls of 0.1 s fill the first 0.25 s window, decided at the third call's end
        ran = [wg.execute_all("work", 0.1)[0] for _ in range(3)]
        assert wg.omp_spinning() == [False] and ran == [2, 2, 2], ran
    finally:
        loop.kill()
        loop.wait()
        wg.shutdown()


def test_embedded_ray_workers_run_at_the_drivers_priority(ray_2cpu):
    """Ray starts workers at nice 15 (raylet ``worker_niceness``): under any other load on the machine the ranks
    lost the CPU (a 4 s GRPO step took 39 s beside one other busy process). Embedded, they keep the driver's."""
    class Nice:  # defined here so Ray pickles it by value
        def niceness(self) -> int:
            return os.nice(0)

    wg = RayWorkerGroup(Nice, 1, {}, num_cpus_per_worker=1, name_prefix="nice", num_threads=1)
    try:
        assert wg.execute_all("niceness") == [os.nice(0)]
    finally:
        wg.shutdown()


_HEAP_CYCLES = r"""
import ctypes, importlib.util, resource, sys
spec = importlib.util.spec_from_file_location("threads", sys.argv[1])
threads = importlib.util.module_from_spec(spec)
spec.loader.exec_module(threads)  # the module alone: no torch in this process, only malloc
kept = threads.keep_freed_heap() if sys.argv[2] == "1" else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

def cycle():  # a micro-batch's activations: four 8 MiB blocks written, then freed
    blocks = [libc.malloc(8 << 20) for _ in range(4)]
    for b in blocks:
        libc.memset(b, 1, 8 << 20)
    for b in blocks:
        libc.free(b)

cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_keep_freed_heap_stops_the_page_faults_of_reallocating_the_same_blocks():
    """Four 8 MiB blocks written and freed ten times: with glibc's defaults the first free raises the mmap
    threshold to 8 MiB and the trim threshold to 16 MiB, so the 32 MiB freed at the heap's top go back to the
    kernel each time and every cycle faults its 8,192 pages (4 KiB) in again: about 80,000 minor faults. With
    :func:`keep_freed_heap` the heap keeps them (trim threshold 1 GiB): almost none."""
    from rlhf_core.distributed import threads

    def faults(keep: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", _HEAP_CYCLES, threads.__file__, keep], capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0], int(out[1])

    default, kept = faults("0"), faults("1")
    assert default[0] == "None" and default[1] > 10 * 8192 * 0.9  # the pages of every cycle, again and again
    assert kept == ("True", kept[1]) and kept[1] < 8192 // 4  # not even one cycle's pages
