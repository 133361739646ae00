"""Worker groups: ``world_size`` ranks of one worker class joined by a torch.distributed group.

verl's ``RayWorkerGroup`` + ``RayResourcePool``, trimmed: one placement group per worker group
(``STRICT_PACK``, falling back to ``PACK`` when one node cannot hold it), one Ray actor per rank, a
gloo (CPU) or nccl (CUDA) process group formed over ``tcp://<rank-0 node ip>:<free port>``.
Dispatch is by method name: :meth:`execute_all` sends the same arguments to every rank,
:meth:`execute_dp` gives every rank its equal contiguous shard of a :class:`Batch` and concatenates
the shards it gets back (verl's ``DP_COMPUTE_PROTO``). Batches cross the call with tensors owning their storage
(:meth:`Batch.own_storage`): pickled views would carry the whole batch to every rank.

:class:`LocalWorkerGroup` has the same interface for one in-process rank (fast unit tests, or a
driver that trains without Ray).
"""
from __future__ import annotations

import datetime
import logging
import os
import socket
import uuid
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlhf_core.distributed.ray_init import init_ray
from rlhf_core.distributed.threads import SpinSwitch, keep_freed_heap, omp_env
from rlhf_core.protocol import Batch
from rlhf_core.redact import install_log_redaction

logger = logging.getLogger(__name__)


OWNER_ENV = "RLHF_RAY_OWNER"


def owner_prefix() -> str:
    """``"<$RLHF_RAY_OWNER>."`` (or ``""`` when unset): the prefix of every actor and placement-group name this
    process creates, so whoever dispatched this driver (``infra.ray_cluster.run_on_ray``) can find and remove what a
    driver that died without cleaning up (SIGKILL, a lost node) left behind."""
    owner = os.environ.get(OWNER_ENV)
    return f"{owner}." if owner else ""


def free_port() -> int:
    """An unused TCP port on this host (bound then released; a tiny race is accepted, as in verl)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def setup_process_group(rank: int, world_size: int, master_addr: str, master_port: int,
                        local_rank: int = 0, omp_threads: int | None = None,
                        collective_timeout_s: float | None = None) -> str:
    """Export the torch.distributed environment and join the process group.

    First makes ``malloc`` keep freed memory for reuse (:func:`~rlhf_core.distributed.threads.keep_freed_heap`:
    a rank's steps allocate the same blocks again and again). Sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT`` (and
    ``OMP_NUM_THREADS`` + ``torch.set_num_threads`` when ``omp_threads`` is given), then
    ``init_process_group`` with ``nccl`` when CUDA is visible, else ``gloo``, over :func:`rendezvous_store`
    (rank 0's store listens on ``master_addr`` only). Blocks until all ``world_size`` ranks have joined.
    ``collective_timeout_s``: the group's timeout for a collective (verl's ``actor_rollout_ref.nccl_timeout``,
    for gloo too); None = torch's default. Returns the backend name.
    """
    keep_freed_heap()
    env = {"RANK": rank, "WORLD_SIZE": world_size, "LOCAL_RANK": local_rank,
           "MASTER_ADDR": master_addr, "MASTER_PORT": master_port}
    if omp_threads:
        env["OMP_NUM_THREADS"] = omp_threads
    os.environ.update({k: str(v) for k, v in env.items()})
    # imported after the environment is set: OMP_NUM_THREADS must be in place before torch first loads
    import torch
    import torch.distributed as dist

    if omp_threads:
        torch.set_num_threads(int(omp_threads))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        timeout = None if collective_timeout_s is None else datetime.timedelta(seconds=float(collective_timeout_s))
        dist.init_process_group(backend, store=rendezvous_store(rank, world_size, master_addr, master_port),
                                rank=rank, world_size=world_size, timeout=timeout)
    return backend


def rendezvous_store(rank: int, world_size: int, master_addr: str, master_port: int):
    """The ``torch.distributed.TCPStore`` of a process group: rank 0 serves it, the others connect.

    Rank 0 binds the listening socket to ``master_addr`` itself and hands it over (``master_listen_fd``):
    ``init_method="tcp://..."`` would listen on every interface whatever the address (seen with ``ss -ltnp``
    during ``rlhf ppo``: ``*:PORT``), exposing the embedded instance's store to the network. Timeout: torch's
    default process-group timeout (``default_pg_timeout``, 30 min), as the ``tcp://`` rendezvous uses.

    Raises:
        OSError: rank 0 cannot bind ``master_addr:master_port`` (taken since :func:`free_port` probed it).
    """
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    if rank != 0:
        return dist.TCPStore(master_addr, master_port, world_size, is_master=False, timeout=default_pg_timeout)
    family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((master_addr, master_port))
        listener.listen(socket.SOMAXCONN)
    except OSError:
        listener.close()
        raise
    return dist.TCPStore(master_addr, master_port, world_size, is_master=True, timeout=default_pg_timeout,
                         master_listen_fd=listener.detach())


class _WorkerHost:
    """The Ray actor body: joins the process group, then builds and serves one worker."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        install_log_redaction()  # a worker's log lines reach the driver's output: no secrets in them
        self.worker: Any = None
        self.spin: SpinSwitch | None = None  # a CPU rank of several threads: spin alone, sleep under contention

    def node_ip_and_port(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), free_port()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def setup(self, worker_cls: type, init_kwargs: dict, rank: int, world_size: int,
              master_addr: str, master_port: int, omp_threads: int | None,
              collective_timeout_s: float | None = None, spin_switch: bool = False) -> str:
        backend = setup_process_group(rank, world_size, master_addr, master_port, 0, omp_threads,
                                      collective_timeout_s)
        if spin_switch:
            self.spin = SpinSwitch(int(omp_threads))
        self.worker = worker_cls(**init_kwargs)
        return backend

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``worker.method(*args, **kwargs)``, timed by the rank's :class:`SpinSwitch` when it has one; a returned
        :class:`Batch` leaves in :meth:`Batch.own_storage` form."""
        if self.spin is not None:
            self.spin.begin()
        try:
            out = getattr(self.worker, method)(*args, **kwargs)
        finally:
            if self.spin is not None:
                self.spin.end()
        return out.own_storage() if isinstance(out, Batch) else out

    def omp_spinning(self) -> bool | None:
        """Whether this rank's OpenMP threads spin now (:class:`SpinSwitch`); None without a switch."""
        return None if self.spin is None else self.spin.spinning


def _gather_results(results: list) -> Batch | list:
    if results and all(isinstance(r, Batch) for r in results):
        return Batch.concat(results)
    return results


class RayWorkerGroup:
    """``world_size`` Ray actors each holding ``worker_cls(**init_kwargs)``, one process group.

    Args:
        worker_cls: a plain class (not ``@ray.remote``); its methods take this rank's shard.
        world_size: number of ranks (actors).
        init_kwargs: keyword arguments for ``worker_cls``.
        num_cpus_per_worker: Ray CPUs reserved per actor (fractional values let several groups share a node).
        num_threads: intra-op threads per actor (``OMP_NUM_THREADS`` and ``torch.set_num_threads``), decoupled
            from the reservation (see :mod:`rlhf_core.distributed.threads`); ``None`` →
            ``max(1, int(num_cpus_per_worker))``.
            On CPU with more than one thread, a rank's idle threads spin while the machine leaves it the cores and
            sleep at once while other processes want them (:class:`~rlhf_core.distributed.threads.SpinSwitch`);
            otherwise they sleep at once (``OMP_WAIT_POLICY=PASSIVE``).
        num_gpus_per_worker: Ray GPUs per actor (``> 0`` → nccl; Ray sets ``CUDA_VISIBLE_DEVICES``).
        name_prefix: prefix of the actor and placement-group names, after :func:`owner_prefix` (a random suffix
            keeps groups distinct).
        env: extra environment variables exported in every actor before the worker is built.
        pg_timeout_s: seconds to wait for the placement group, per placement strategy (STRICT_PACK, then PACK).
        ready_timeout_s: seconds to wait for the actors to start and join the process group; ``None`` = no limit.
            The PPO driver passes ``trainer.ray_wait_register_center_timeout`` for both.
        max_concurrency: calls one actor runs at once (Ray's threaded actor when > 1): the fully async rollout
            group takes 2, so an ``interrupt_generation`` call reaches a rank while it generates.
        nnodes: ``trainer.nnodes``. Above 1, the ranks are placed as verl's resource pool does: one placement
            group (``STRICT_PACK``) of ``world_size / nnodes`` bundles per node, each on a different node;
            rank ``r`` runs in group ``r // (world_size / nnodes)``.

    Raises:
        ValueError: when ``world_size < 1``.
        TimeoutError: when the placement group cannot be scheduled (not enough resources), or the actors are
            not ready within ``ready_timeout_s`` (the group is shut down first).
    """

    in_process = False  # the ranks compute in other processes (the driver keeps one thread: threads.py)

    def __init__(self, worker_cls: type, world_size: int, init_kwargs: dict,
                 num_cpus_per_worker: float = 1, num_gpus_per_worker: float = 0,
                 name_prefix: str = "wg", env: dict | None = None, pg_timeout_s: float = 60.0,
                 ready_timeout_s: float | None = None, num_threads: int | None = None, nnodes: int = 1,
                 collective_timeout_s: float | None = None, max_concurrency: int = 1) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if nnodes < 1 or world_size % nnodes:
            raise ValueError(f"trainer.nnodes={nnodes} must divide the world size {world_size}")
        if not ray.is_initialized():
            init_ray()
        self.world_size = world_size
        self.name_prefix = f"{owner_prefix()}{name_prefix}_{uuid.uuid4().hex[:6]}"
        bundle: dict[str, float] = {"CPU": num_cpus_per_worker}
        if num_gpus_per_worker:
            bundle["GPU"] = num_gpus_per_worker
        per_node = world_size // nnodes
        if nnodes == 1:
            self._pgs = [self._placement_group([dict(bundle) for _ in range(world_size)], pg_timeout_s,
                                               self.name_prefix)]
        else:
            self._pgs = _node_placement_groups(nnodes, [dict(bundle) for _ in range(per_node)], pg_timeout_s,
                                               self.name_prefix)
        omp = int(num_threads) if num_threads else max(1, int(num_cpus_per_worker))
        spin = not num_gpus_per_worker and omp > 1
        # OpenMP reads its environment once, when torch loads it: unpickling _WorkerHost imports torch before its
        # __init__ runs, so the variables go in the actor's runtime_env (set when Ray starts the process)
        actor_env = {**omp_env(omp, spin), **{k: str(v) for k, v in (env or {}).items()}}
        remote_cls = ray.remote(_WorkerHost)
        self._actors = [
            remote_cls.options(
                num_cpus=num_cpus_per_worker, num_gpus=num_gpus_per_worker, max_concurrency=int(max_concurrency),
                name=f"{self.name_prefix}_{rank}", runtime_env={"env_vars": actor_env},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pgs[rank // per_node], placement_group_bundle_index=rank % per_node),
            ).remote(actor_env)
            for rank in range(world_size)
        ]
        try:
            addr, port = ray.get(self._actors[0].node_ip_and_port.remote(), timeout=ready_timeout_s)
            backends = ray.get([
                a.setup.remote(worker_cls, init_kwargs, rank, world_size, addr, port, omp, collective_timeout_s,
                               spin)
                for rank, a in enumerate(self._actors)
            ], timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            self.shutdown()
            raise TimeoutError(f"worker group {self.name_prefix}: {world_size} actors not ready after "
                               f"{ready_timeout_s:.0f} s") from exc
        self.backend = backends[0]
        logger.info("worker group %s: %d ranks, backend %s", self.name_prefix, world_size, self.backend)

    @staticmethod
    def _placement_group(bundles: list[dict], timeout_s: float, name: str = ""):
        for strategy in ("STRICT_PACK", "PACK"):
            pg = placement_group(bundles, strategy=strategy, name=name)
            ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
            if ready:
                return pg
            remove_placement_group(pg)
            logger.warning("placement group %s not ready after %.0f s; trying the next strategy", strategy, timeout_s)
        raise TimeoutError(f"cannot place {len(bundles)} workers of {bundles[0]} on the Ray cluster within "
                           f"{timeout_s:.0f} s per strategy (available: {ray.available_resources()})")

    def omp_spinning(self) -> list[bool | None]:
        """Per rank, whether its OpenMP threads spin now (None: a rank without a :class:`SpinSwitch`)."""
        return ray.get([a.omp_spinning.remote() for a in self._actors])

    def node_ids(self) -> list[str]:
        """The Ray node id of every rank, in rank order."""
        return ray.get([a.node_id.remote() for a in self._actors])

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method(*args, **kwargs)`` on every rank; results in rank order."""
        return ray.get([a.call.remote(method, *args, **kwargs) for a in self._actors])

    def execute_dp(self, method: str, batch: Batch, **kwargs: Any) -> Batch | list:
        """Split ``batch`` into ``world_size`` equal shards, call rank i with shard i.

        Returns the concatenated :class:`Batch` when every rank returns one, else the list of results.
        Raises ``ValueError`` when ``len(batch)`` is not divisible by ``world_size``.
        """
        shards = [s.own_storage() for s in batch.chunk(self.world_size)]  # not n copies of the whole batch
        return _gather_results(ray.get([a.call.remote(method, s, **kwargs) for a, s in zip(self._actors, shards)]))

    def shutdown(self) -> None:
        """Kill the actors and free the placement group (idempotent)."""
        for a in getattr(self, "_actors", []):
            ray.kill(a)
        self._actors = []
        for pg in getattr(self, "_pgs", []):
            remove_placement_group(pg)
        self._pgs = []


def _node_placement_groups(nnodes: int, bundles: list[dict], timeout_s: float, name: str = "") -> list:
    """One ``STRICT_PACK`` placement group of ``bundles`` on each of ``nnodes`` different alive nodes.

    Nodes are chosen among those whose total resources can hold the bundles (most free CPUs first) and
    targeted with ``_soft_target_node_id``; the groups are checked to sit on distinct nodes.

    Raises:
        TimeoutError: fewer than ``nnodes`` nodes can hold the bundles, a group is not ready within
            ``timeout_s``, or two groups landed on one node; names what is missing.
    """
    need = {k: sum(b.get(k, 0) for b in bundles) for k in bundles[0]}
    nodes = [n for n in ray.nodes() if n.get("Alive")
             and all(n.get("Resources", {}).get(k, 0) >= v for k, v in need.items())]
    if len(nodes) < nnodes:
        raise TimeoutError(f"trainer.nnodes={nnodes} needs {nnodes} nodes with {need} each; the Ray cluster has "
                           f"{len(nodes)} such node(s) of {len(ray.nodes())} (resources: {ray.cluster_resources()})")
    nodes.sort(key=lambda n: -n.get("Resources", {}).get("CPU", 0))
    pgs = []
    try:
        for i, node in enumerate(nodes[:nnodes]):
            pg = placement_group(bundles, strategy="STRICT_PACK", name=f"{name}_node{i}" if name else "",
                                 _soft_target_node_id=node["NodeID"])
            if not ray.wait([pg.ready()], timeout=timeout_s)[0]:
                pgs.append(pg)
                raise TimeoutError(f"cannot place {len(bundles)} workers of {bundles[0]} on node {node['NodeID']} "
                                   f"within {timeout_s:.0f} s (available: {ray.available_resources()})")
            pgs.append(pg)
        used = [set(placement_group_table(pg)["bundles_to_node_id"].values()) for pg in pgs]
        if len(set().union(*used)) != nnodes:
            raise TimeoutError(f"trainer.nnodes={nnodes}: the worker groups landed on nodes {used}, "
                               f"not on {nnodes} different nodes")
    except BaseException:
        for pg in pgs:
            remove_placement_group(pg)
        raise
    return pgs


class LocalWorkerGroup:
    """One in-process rank with the :class:`RayWorkerGroup` interface (a single-rank gloo/nccl group).

    If this process already belongs to a process group (e.g. a second local group) it is reused.
    """

    in_process = True  # the rank computes in this process, on its threads

    def __init__(self, worker_cls: type, init_kwargs: dict, collective_timeout_s: float | None = None) -> None:
        import torch.distributed as dist

        self.world_size = 1
        if not dist.is_initialized():
            setup_process_group(0, 1, "127.0.0.1", free_port(), collective_timeout_s=collective_timeout_s)
        elif dist.get_world_size() != 1:
            raise RuntimeError("LocalWorkerGroup needs a world of 1; this process is in a larger group")
        self.backend = dist.get_backend()
        self.worker = worker_cls(**init_kwargs)

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list:
        return [getattr(self.worker, method)(*args, **kwargs)]

    def execute_dp(self, method: str, batch: Batch, **kwargs: Any) -> Batch | list:
        return _gather_results([getattr(self.worker, method)(batch, **kwargs)])

    def shutdown(self) -> None:
        self.worker = None
