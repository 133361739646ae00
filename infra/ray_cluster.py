"""Connection to Ray and dispatch of a stage's driver function as a Ray task.

Each pipeline stage (SFT, a PPO segment, evaluation) runs its driver function as one Ray
remote task — the stage's "Ray job". The driver then creates its own worker actors on the
same cluster. The driver task asks for ``num_cpus=0`` by default so that, on a small
machine, all CPU slots stay free for the training workers.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import ray

from rlhf_core.distributed.ray_init import start_embedded_ray

logger = logging.getLogger(__name__)

# rlhf_core.distributed.worker_group.OWNER_ENV (not imported: that module loads torch, this one is on the CLI's path)
OWNER_ENV = "RLHF_RAY_OWNER"

# Variables a remote driver needs to find the project home and the lineage run.
FORWARDED_ENV = (
    "RLHF_HOME",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_RUN_ID",
    "MLFLOW_EXPERIMENT_ID",
    "RLHF_MLFLOW_ARTIFACT_ROOT",
    "OMP_NUM_THREADS",
    "RLHF_FP32_LINEAR",
    "TOKENIZERS_PARALLELISM",
    "HF_HUB_OFFLINE",
    "GSM8K_DIR",
    "RLHF_FAULT",  # the test-only fault hook (rlhf_core.faults) and its marker file
    "RLHF_FAULT_MARKER",
)


def connect_ray(address: str | None = None, num_cpus: int | None = None) -> dict[str, Any]:
    """Connect to Ray once per process; a no-op when already connected.

    Args:
        address: ``None`` → start an embedded local instance (``start_embedded_ray``: every port on 127.0.0.1,
            no dashboard or job API, Ray's files in a private temp folder; token auth off, workers not niced);
            ``"auto"`` → the cluster on this machine; ``"ray://host:port"`` → Ray Client.
            ``$RAY_ADDRESS`` is used when ``address`` is None and it is set.
        num_cpus: CPU slots for an embedded instance (default: all cores).

    Returns:
        ``ray.cluster_resources()`` of the connected cluster.

    Raises:
        ConnectionError: an explicit address cannot be reached within ``REACH_TIMEOUT_S``
            (:func:`check_reachable`, naming the address), or Ray refuses it.
        PermissionError: the embedded instance's private temp folder is someone else's.
    """
    if ray.is_initialized():
        return ray.cluster_resources()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        check_reachable(address)
    if address is None:
        # every port on 127.0.0.1, no job API, private temp folder; no token auth, workers not niced
        start_embedded_ray(num_cpus, log_to_driver=True, configure_logging=False)
    else:
        # the job's runtime_env ships the code: cluster nodes need the dependencies only, not a checkout
        # (a local working_dir is only accepted here, at the job level, not per task)
        ray.init(address=address, log_to_driver=True, runtime_env=code_runtime_env())
    return ray.cluster_resources()


REPO_ROOT = Path(__file__).resolve().parents[1]
# What a cluster node needs of the checkout: the packages (with rlhf_core/configs/, beside the code)
CODE_EXCLUDES = [".git", ".rlhf", ".venv*", "tests", "bench", "docs", "**/__pycache__", "*.parquet",
                 "*.safetensors", "*.pt", "data", "checkpoints", "mlruns"]
REACH_TIMEOUT_S = 5.0
DEFAULT_PORTS = {"ray://": 10001, "": 6379}  # Ray Client server, GCS


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Open (and close) a TCP connection to a Ray address, so a wrong ``RAY_ADDRESS`` fails in
    seconds instead of after Ray's own minute of retries.

    ``auto`` / ``local`` are not checked (Ray looks for a cluster on this machine itself).

    Raises:
        ConnectionError: the host does not answer on the port within ``timeout_s``; the message
            names the address and where it came from.
    """
    if address in ("auto", "local"):
        return
    scheme = "ray://" if address.startswith("ray://") else ""
    hostport = address[len(scheme):].split("/", 1)[0]
    host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
    try:
        with socket.create_connection((host, int(port or DEFAULT_PORTS[scheme])), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"Ray cluster at {address!r} (ray_address / $RAY_ADDRESS) is unreachable: "
                              f"{exc}; start it with `ray start --head` or fix the address") from exc


def code_runtime_env() -> dict[str, Any]:
    """Ray ``runtime_env`` that ships this checkout's code (``working_dir``, without data, tests or
    caches) to the cluster, so a driver and its workers import the same ``rlhf_core`` everywhere.
    The remote working directory is the unpacked copy: paths handed to a stage must be absolute."""
    return {"working_dir": str(REPO_ROOT), "excludes": list(CODE_EXCLUDES)}


def _path_status(paths: list[str]) -> tuple[str, dict[str, bool]]:
    import ray as _ray

    return _ray.get_runtime_context().get_node_id(), {p: os.path.isdir(p) for p in paths}


def check_shared_paths(paths: list[str], timeout_s: float = 120.0) -> None:
    """Check that every alive node of the cluster sees the folders ``paths`` (``$RLHF_HOME`` must be
    on a filesystem shared by all nodes: checkpoints, data and samples are exchanged through it).

    Raises:
        FileNotFoundError: names the nodes and the folders they do not see.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    fn = ray.remote(num_cpus=0, max_retries=0)(_path_status)
    refs = [fn.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(paths)
            for n in ray.nodes() if n.get("Alive")]
    missing = {node: [p for p, ok in seen.items() if not ok] for node, seen in ray.get(refs, timeout=timeout_s)}
    missing = {node: ps for node, ps in missing.items() if ps}
    if missing:
        raise FileNotFoundError(f"Ray nodes {sorted(missing)} do not see {sorted({p for ps in missing.values() for p in ps})}: "
                                f"put $RLHF_HOME on a filesystem every node mounts at the same path")


def forwarded_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables passed to a remote driver: FORWARDED_ENV that are set, plus ``extra``."""
    env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def run_on_ray(
    fn: Callable[..., Any],
    *args: Any,
    num_cpus: float = 0,
    runtime_env: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    on_poll: Callable[[], None] | None = None,
    poll_s: float = 2.0,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` as a Ray remote task and wait for its result.

    Connects to Ray first (embedded when no address is configured). The remote side gets
    ``RLHF_HOME`` and the ``MLFLOW_*`` variables of this process plus ``env`` through the
    runtime environment, so a core running in another process logs into the right run.

    Args:
        fn: an importable (module-level) function; its result must be picklable.
        num_cpus: CPU slots the driver task reserves (0: leave them to its workers).
        runtime_env: extra Ray runtime environment; its ``env_vars`` win over forwarded ones.
        env: extra environment variables for the remote side.
        timeout_s: seconds to wait; ``None`` waits forever.
        on_poll: called every ``poll_s`` seconds while ``fn`` runs (progress reporting).

    Returns:
        What ``fn`` returned.

    Raises:
        ray.exceptions.RayTaskError: ``fn`` raised (the original exception is its cause).
        ray.exceptions.GetTimeoutError: the result did not arrive within ``timeout_s``;
            the task is cancelled.
    """
    connect_ray()
    owner = f"{fn.__name__}-{uuid.uuid4().hex[:12]}"  # names every actor / placement group the driver creates
    renv = dict(runtime_env or {})
    renv["env_vars"] = {**forwarded_env(env), **renv.get("env_vars", {})}
    remote_fn = ray.remote(num_cpus=num_cpus, max_retries=0)(_owned_call).options(runtime_env=renv,
                                                                                 name=fn.__name__)
    ref = remote_fn.remote(owner, fn, *args, **kwargs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while on_poll is not None and not ray.wait([ref], timeout=poll_s)[0]:
            on_poll()
            if deadline is not None and time.monotonic() > deadline:
                raise ray.exceptions.GetTimeoutError(f"{fn.__name__} did not finish within {timeout_s} s")
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return ray.get(ref, timeout=left)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise
    finally:
        try:
            release_owned(owner)
        except Exception as exc:  # noqa: BLE001 - never hide the stage's own error behind a clean-up failure
            logger.warning("could not release the Ray resources of %s: %s", owner, exc)


def _owned_call(owner: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with ``$RLHF_RAY_OWNER=owner`` for its duration (the worker process may be reused;
    the owner is not part of the runtime environment, so it does not force a new worker process per call)."""
    before = os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = owner
    try:
        return fn(*args, **kwargs)
    finally:
        if before is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = before


def release_owned(owner: str) -> dict[str, list[str]]:
    """Kill the named actors and remove the placement groups that a driver dispatched with owner tag ``owner`` left.

    A driver that ends normally (or raises) has already shut its worker groups down and this finds nothing. A
    driver killed outright (SIGKILL, OOM, a lost node) cannot: Ray kills the actors it owned, but a placement group
    created inside a task lives until the job ends, holding its CPUs/GPUs — a retry would place its workers next to
    it, or not at all. Names are matched by the prefix ``"<owner>."`` (``rlhf_core.distributed.worker_group``).

    Returns:
        ``{"actors": names killed, "placement_groups": names removed}``.
    """
    from ray.util.placement_group import get_placement_group, placement_group_table, remove_placement_group

    prefix = f"{owner}."
    released: dict[str, list[str]] = {"actors": [], "placement_groups": []}
    for name in ray.util.list_named_actors():
        if name.startswith(prefix):
            try:
                ray.kill(ray.get_actor(name))
            except ValueError:  # died in the meantime
                continue
            released["actors"].append(name)
    for info in placement_group_table().values():
        name = info.get("name") or ""
        if name.startswith(prefix) and info.get("state") != "REMOVED":
            remove_placement_group(get_placement_group(name))
            released["placement_groups"].append(name)
    if released["actors"] or released["placement_groups"]:
        logger.warning("released what a dead driver (%s) left on Ray: actors %s, placement groups %s", owner,
                       released["actors"], released["placement_groups"])
    return released


def shutdown_ray() -> None:
    """Disconnect from Ray (stops an embedded instance); a no-op when not connected."""
    if ray.is_initialized():
        ray.shutdown()
