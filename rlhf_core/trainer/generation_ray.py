"""``rlhf generate`` on a Ray worker group: ``trainer.nnodes × trainer.n_gpus_per_node`` rollout ranks, each with its
own engine, the batch split between them as verl 0.6's ``main_generation`` does (its ``ActorRolloutRefWorker`` group
of role ``rollout``: pad the batch to a multiple of the world size with copies of its first rows
(``pad_dataproto_to_divisor``), give rank ``r`` the ``r``-th contiguous shard, concatenate, drop the padding).

Resources, as ``rlhf ppo``'s worker groups (:func:`~rlhf_core.trainer.main_ppo.worker_resources`): Ray is started by
:func:`~rlhf_core.distributed.ray_init.init_ray` with ``ray_init.num_cpus`` (null: every CPU) and the rest of
``ray_kwargs.ray_init``; on CPU each rank reserves ``min(1, CPUs ÷ ranks)`` Ray CPUs and runs
:func:`~rlhf_core.distributed.threads.threads_per_rank` intra-op threads (⌊node CPUs ÷ ranks per node⌋, at least
1); on CUDA each rank takes one GPU. ``ray_init.timeline_json_file`` (= ``ray_kwargs.timeline_json_file``) receives
Ray's timeline once the responses are generated. A Ray instance started here is shut down at the end.

Where Ray is used (:func:`use_ray`): with more than one rank, or a timeline asked for. One rank without a timeline
runs in the calling process (as before; verl always starts Ray): Ray's start and a worker process cost seconds and
change no output (3 prompts x 2 greedy responses of the tests' tiny model at load 6 on 2 cores: 1.6 s in process,
12.4 s on one Ray rank with a timeline, 17.7 s on two ranks). generation.yaml's ``trainer.n_gpus_per_node`` defaults
to 1 for this reason (verl's is 8, GPUs); more ranks per node than CPUs run, one thread each, with a warning naming
the key (:func:`rank_resources`). ``rollout.name=vllm`` always runs one engine in the calling process, spread over
``rollout.tensor_model_parallel_size`` devices by vLLM itself.

Outputs: rank ``r`` seeds its engine calls with ``rollout.seed + 7919·r + call`` (:class:`HFRollout`), so rank 0 of
any group samples what the in-process engine samples; greedy decoding (``rollout.do_sample=False``) gives the same
responses in the same order for any rank count (each row keeps the batch's left-padded width). With sampling the
hf engine draws one random stream per call and rank, not per row, so which responses are sampled depends on the
rank count (as in verl, where each worker samples its shard); a run is reproducible for a fixed rank count.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable

import torch
from omegaconf import DictConfig

from rlhf_core.config.errors import ConfigError
from rlhf_core.protocol import Batch
from rlhf_core.trainer.driver_utils import pad_to_divisor, unpad

logger = logging.getLogger(__name__)


def generation_ranks(config: DictConfig) -> int:
    """``trainer.nnodes × trainer.n_gpus_per_node``: the rollout ranks of ``rlhf generate``.

    Raises:
        ConfigError: either key below 1, naming it and its value.
    """
    nnodes, per_node = int(config.trainer.nnodes), int(config.trainer.n_gpus_per_node)
    for name, value in (("trainer.nnodes", nnodes), ("trainer.n_gpus_per_node", per_node)):
        if value < 1:
            raise ConfigError(f"{name}={value}: rlhf generate needs at least one rollout rank; set it to 1 or more")
    return nnodes * per_node


def use_ray(config: DictConfig) -> bool:
    """Whether ``rlhf generate`` runs on a Ray worker group: the hf engine with more than one rank
    (:func:`generation_ranks`) or ``ray_init.timeline_json_file`` set (a timeline needs Ray). vLLM: never (one engine
    in this process; a notice says so when more ranks are asked for)."""
    ranks = generation_ranks(config)
    if str(config.rollout.name) == "vllm":
        if ranks > 1:
            logger.warning("rollout.name=vllm: one vLLM engine in this process (over "
                           "rollout.tensor_model_parallel_size devices); trainer.nnodes x trainer.n_gpus_per_node = %d "
                           "ranks are not started", ranks)
        return False
    return ranks > 1 or config.ray_init.timeline_json_file is not None


def rank_resources(cpus: float, nnodes: int, per_node: int, cuda: bool) -> tuple[float, int, str | None]:
    """``(Ray CPUs reserved per rank, intra-op threads per rank, warning or None)`` for ``nnodes × per_node`` ranks
    on a Ray cluster of ``cpus`` CPUs.

    CUDA: one CPU and the threads :func:`threads_per_rank` gives. CPU: ``min(1, cpus ÷ ranks)`` (rounded down to
    0.01, at least 0.01: as ``rlhf ppo``'s one worker group) and ⌊cpus ÷ nnodes ÷ per_node⌋ threads (at least 1).
    More ranks per node than CPUs (verl's default ``n_gpus_per_node=8`` on a 2-core machine) run — one thread each,
    sharing the cores — with a warning naming ``trainer.n_gpus_per_node``: each rank holds a copy of the model and
    the responses are the same with fewer ranks (greedy) or as reproducible (sampled).

    Example: 2 CPUs, 1 node, 8 ranks on CPU → ``(0.25, 1, "trainer.n_gpus_per_node=8: ...")``.
    """
    from rlhf_core.distributed.threads import threads_per_rank

    threads = threads_per_rank(cpus, nnodes, per_node)
    if cuda:
        return 1.0, threads, None
    reserve = max(0.01, int(min(1.0, cpus / (nnodes * per_node)) * 100) / 100)
    warning = None
    if per_node > cpus / nnodes:
        warning = (f"trainer.n_gpus_per_node={per_node}: {per_node} generation ranks per node share {cpus / nnodes:g} "
                   "CPUs (one thread and one model copy each); the responses do not need more ranks than CPUs: set "
                   f"trainer.n_gpus_per_node={max(1, int(cpus / nnodes))} for less memory and no oversubscription")
    return reserve, threads, warning


class GenerationWorker:
    """One rollout rank (built inside a :class:`~rlhf_core.distributed.worker_group.RayWorkerGroup` actor): the
    tokenizer and ``make_engine(config, tokenizer, device, rank=rank)`` (``rlhf generate``'s
    :func:`~rlhf_core.trainer.main_generation._engine`, passed in: this module does not import the command) on
    ``device`` (``"cpu"``, or ``"cuda"``: the actor's one GPU). ``rank`` None: the process group's ``RANK``."""

    def __init__(self, config: DictConfig, make_engine: Callable[..., Any], rank: int | None = None,
                 device: str = "cpu") -> None:
        from rlhf_core.models.loading import load_tokenizer

        rank = int(os.environ.get("RANK", 0)) if rank is None else int(rank)
        tokenizer = load_tokenizer(str(config.model.path), bool(config.data.trust_remote_code))
        self.engine = make_engine(config, tokenizer, torch.device(device), rank=rank)

    def generate_sequences(self, batch: Batch) -> Batch:
        """This rank's shard through the engine: ``HFRollout.generate_sequences`` (its rollout batch)."""
        return self.engine.generate_sequences(batch)


class RayGeneration:
    """The engine facade :func:`~rlhf_core.trainer.main_generation.run_generation` calls: ``generate_sequences``
    splits each batch over the worker group (module docstring). Use as a context manager: the group is shut down,
    the timeline written and a Ray instance started here stopped on exit.

    Args:
        config: generation.yaml's config (``trainer``, ``rollout``, ``model``, ``ray_init``, ``ray_kwargs``).
        device: ``cpu`` or ``cuda`` (``trainer.device`` resolved by the driver).
        make_engine: builds a rank's engine (:class:`GenerationWorker`); an importable module-level function.

    Raises:
        ConfigError: from :func:`generation_ranks`; a CUDA run with fewer GPUs in the Ray cluster than ranks.
        TimeoutError: the placement group cannot be scheduled or the actors do not start within 300 s.
    """

    def __init__(self, config: DictConfig, device: torch.device, make_engine: Callable[..., Any]) -> None:
        import ray

        from rlhf_core.distributed.ray_init import init_ray, ray_init_extra
        from rlhf_core.distributed.worker_group import RayWorkerGroup

        self.config = config
        self.world = generation_ranks(config)
        nnodes, per_node = int(config.trainer.nnodes), int(config.trainer.n_gpus_per_node)
        self.started = not ray.is_initialized()
        # verl hands ray_kwargs.ray_init to ray.init (its num_cpus is ray_init.num_cpus's alias, read here)
        init_ray(None, config.ray_init.num_cpus, extra=ray_init_extra(config.ray_kwargs.ray_init, ("num_cpus",)))
        self.group = None
        self.calls = 0  # rank calls made (world size per batch): what the timeline must show before it is written
        try:
            cpus = float(ray.cluster_resources().get("CPU", 1))
            cuda = device.type == "cuda"
            if cuda and ray.cluster_resources().get("GPU", 0) < self.world:
                raise ConfigError(f"trainer.nnodes x trainer.n_gpus_per_node = {self.world} rollout ranks need "
                                  f"{self.world} GPUs; the Ray cluster has {ray.cluster_resources().get('GPU', 0):g}")
            reserve, threads, warning = rank_resources(cpus, nnodes, per_node, cuda)
            if warning:
                logger.warning(warning)
            self.group = RayWorkerGroup(
                GenerationWorker, self.world,
                {"config": config, "make_engine": make_engine, "device": "cuda" if cuda else "cpu"},
                num_cpus_per_worker=reserve, num_gpus_per_worker=1 if cuda else 0, name_prefix="generate",
                num_threads=threads, nnodes=nnodes, pg_timeout_s=300.0, ready_timeout_s=300.0)
            logger.info("generate: %d rollout ranks on Ray, %d intra-op threads each", self.world, threads)
        except BaseException:
            self.close(write_timeline=False)
            raise

    def generate_sequences(self, batch: Batch) -> Batch:
        """Generate one response per row of ``batch`` over the ranks; rows and order as given.

        Pads ``batch`` to a multiple of the world size with copies of its first rows, calls rank ``r`` with the
        ``r``-th contiguous shard, concatenates and drops the padding rows (verl's pad/unpad)."""
        padded, pad = pad_to_divisor(batch, self.world)
        out = unpad(self.group.execute_dp("generate_sequences", padded), pad)
        self.calls += self.world
        return out

    def close(self, write_timeline: bool = True) -> None:
        """Shut the group down, write ``ray_init.timeline_json_file`` (when set and ``write_timeline``), and stop a
        Ray instance this object started."""
        import ray

        from rlhf_core.distributed.ray_init import write_ray_timeline

        try:
            try:
                path = self.config.ray_init.timeline_json_file  # = ray_kwargs.timeline_json_file
                if write_timeline and path is not None and self.group is not None:
                    wait_for_calls(self.calls)
                    write_ray_timeline(path)
            finally:  # the ranks go even when the timeline cannot be written (on a cluster Ray itself stays)
                if self.group is not None:
                    self.group.shutdown()
                    self.group = None
        finally:
            if self.started and ray.is_initialized():
                ray.shutdown()

    def __enter__(self) -> "RayGeneration":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def wait_for_calls(calls: int, timeout_s: float = 10.0) -> bool:
    """Wait until Ray's timeline shows at least ``calls`` finished worker-group calls (``_WorkerHost.call`` events;
    each worker reports its task events about once a second, Ray's ``task_events_report_interval_ms``, so the
    last calls are missing from a timeline read at once); True when they are, False after ``timeout_s`` seconds
    (the timeline is then written as it is)."""
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    state_log = logging.getLogger("ray._private.state")  # a notice about ray.timeline's future source, per read
    level = state_log.level
    state_log.setLevel(logging.ERROR)
    try:
        while True:
            done = sum(1 for e in ray.timeline() if str(e.get("cat", "")).endswith("_WorkerHost.call"))
            if done >= calls:
                return True
            if time.monotonic() > deadline:
                logger.warning("ray timeline: %d of %d generate calls reported after %.0f s; written as it is",
                               done, calls, timeout_s)
                return False
            time.sleep(0.25)
    finally:
        state_log.setLevel(level)
