"""Start or connect to Ray (verl: ``ray.init`` in ``main_ppo``).

``address=None`` starts an embedded local instance (token auth off, no dashboard or job API, every port on
``127.0.0.1``, its files in a private temp folder: :mod:`rlhf_core.distributed.ray_loopback`);
``"auto"`` or ``"ray://host:port"`` connects to an existing cluster.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
from typing import Any

import ray

from rlhf_core.bind_host import bind_host
from rlhf_core.config.errors import ConfigError
from rlhf_core.config.ray_kwargs import RAY_INIT_SECTION, ray_init_key_error  # noqa: F401  (re-exported)
from rlhf_core.data import RemoteUnavailableError
from rlhf_core.distributed.ray_loopback import LOOPBACK, loopback_ray_start, node_ip_address, ray_temp_dir

_started_here = False  # init_ray started the embedded instance this process is connected to (stop_started_ray)

CONNECT_TIMEOUT_S = 5.0
"""How long :func:`check_ray_address` waits for a TCP connection to the cluster's head."""


def check_ray_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast on a cluster address nothing listens at: ``ray.init(address=...)`` would retry for minutes.

    ``"auto"`` is left to Ray (it finds the local cluster's address itself and fails at once when there is none).

    Raises:
        RemoteUnavailableError: (a ``ConnectionError``) no TCP connection to ``host:port`` within ``timeout_s``
            seconds, naming ``ray_init.address``.
        ValueError: an address that is not ``auto``, ``host:port`` or ``ray://host:port``.
    """
    if address == "auto":
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ray_init.address={address!r}: expected auto, host:port or ray://host:port")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RemoteUnavailableError(
            f"ray_init.address={address!r} is unreachable ({exc}); start the cluster there (ray start --head) or "
            "set ray_init.address=null to start a local Ray instance") from exc


def local_ray_init_kwargs(num_cpus: int | None = None) -> dict:
    """``ray.init`` keyword arguments of an embedded (single-machine) instance: a new instance of its own
    (``address="local"``: ``ray.init()`` without an address would attach to whatever cluster ``ray start`` last
    started on this machine, found through ``/tmp/ray/ray_current_cluster``), no dashboard, Ray's files under
    this user's private temp folder (:func:`rlhf_core.distributed.ray_loopback.ray_temp_dir`, created mode 0700),
    and the node address :func:`rlhf_core.bind_host.bind_host` (``127.0.0.1`` unless ``$RLHF_BIND_HOST``; a
    wildcard address leaves Ray's default, the machine's address: :func:`ray_loopback.node_ip_address`). Ray binds
    its gRPC, agent and metrics ports to that address; it keeps a loopback one only inside
    :func:`start_embedded_ray`.

    Raises:
        PermissionError: the private temp folder is someone else's (:func:`ray_loopback.private_temp_root`).
    """
    host = bind_host()
    kwargs = {"address": "local", "num_cpus": num_cpus, "include_dashboard": False, "dashboard_host": host,
              "_temp_dir": ray_temp_dir()}
    if node_ip_address(host) is not None:
        kwargs["_node_ip_address"] = node_ip_address(host)
    return kwargs


def start_embedded_ray(num_cpus: int | None = None, **init_kwargs) -> None:
    """Start an embedded Ray instance as the product does (``init_ray`` and the flow's ``connect_ray``):
    :func:`set_embedded_ray_env`, then ``ray.init(**local_ray_init_kwargs(num_cpus), **init_kwargs)`` inside
    :func:`rlhf_core.distributed.ray_loopback.loopback_ray_start` (no dashboard-agent HTTP job API; every port on
    ``127.0.0.1`` when the node address is loopback); worker lines without colour codes when the output is
    redirected (:func:`plain_worker_prefix_when_redirected`). ``init_kwargs``: further ``ray.init`` arguments
    (``runtime_env``, ``log_to_driver``, ``configure_logging``).

    Raises:
        PermissionError: from :func:`local_ray_init_kwargs`, before anything starts.
    """
    kwargs = {**local_ray_init_kwargs(num_cpus), **init_kwargs}
    set_embedded_ray_env()
    plain_worker_prefix_when_redirected()
    with loopback_ray_start(loopback=kwargs.get("_node_ip_address") == LOOPBACK):
        ray.init(**kwargs)


def plain_worker_prefix_when_redirected(streams: tuple[Any, ...] | None = None) -> None:
    """Set ``RAY_COLOR_PREFIX=0`` (Ray's switch) unless the user set it, when ``streams`` (default: this process's
    stdout and stderr, where Ray prints the workers' lines) are not all terminals: Ray wraps each
    ``(ppo_remote pid=N)`` prefix in ANSI colour codes whatever the output, so a ``rlhf pipeline > run.log`` file
    held ``ESC[36m`` on every worker line (a new user's trial). A terminal keeps Ray's colours."""
    import sys

    if "RAY_COLOR_PREFIX" in os.environ:
        return
    for stream in (sys.stdout, sys.stderr) if streams is None else streams:
        isatty = getattr(stream, "isatty", None)
        if not (callable(isatty) and isatty()):
            os.environ["RAY_COLOR_PREFIX"] = "0"
            return


# Ray system settings of an embedded instance (env form ``RAY_<name>``); each removes a cost that slows the training
# ranks on a few-core machine (the Ray path's cost: BENCHMARKS.md, "The Ray path against the in-process step")
EMBEDDED_RAY_ENV = {
    # no token authentication: Ray 2.60 enables it by default, which a private local instance does not need
    "RAY_AUTH_MODE": "disabled",
    # workers at the driver's priority: Ray starts them at nice 15, so the training ranks lost the CPU to anything
    # else runnable (the driver, the reward pool, another program)
    "RAY_worker_niceness": "0",
    # no idle Python workers started ahead of tasks: each wakes many times a second, preempting the ranks'
    # compute threads (the actors are started explicitly; a task's first worker starts on demand)
    "RAY_enable_worker_prestart": "0",
    "RAY_prestart_worker_first_driver": "0",
    # batches up to 10 MiB travel inside the call instead of through the object store, which is slower for a
    # rollout-sized batch (bench/bench_kernels.py --only raycall, a 220 KB batch each way; BENCHMARKS.md "Kernels")
    "RAY_max_direct_call_object_size": str(10 * 1024 * 1024),
}


def set_embedded_ray_env() -> None:
    """Environment defaults for an embedded Ray instance, set before ``ray.init`` starts it (an explicit value in
    the environment is kept): :data:`EMBEDDED_RAY_ENV`. Used by :func:`init_ray` and by the flow's
    ``infra.ray_cluster.connect_ray``. Their effect on the step: ``bench/bench_ppo_step.py --peers ours_ray``
    (BENCHMARKS.md, "The Ray path against the in-process step")."""
    for key, value in EMBEDDED_RAY_ENV.items():
        os.environ.setdefault(key, value)


def ray_runtime_env(reads: str | None, py_executable: str | None) -> dict | None:
    """Ray's ``runtime_env`` for ``ray.init``: ``RLHF_CONFIG_READS`` passed to every worker when set (config-read
    recording) and ``py_executable`` when given; None when neither is."""
    env: dict = {}
    if reads:
        env["env_vars"] = {"RLHF_CONFIG_READS": reads}
    if py_executable is not None:
        env["py_executable"] = py_executable
    return env or None


def ray_init_extra(section: Any, declared: tuple[str, ...] = ("num_cpus", "runtime_env.py_executable")) -> dict:
    """The ``ray.init`` keyword arguments of ``ray_kwargs.ray_init`` (a DictConfig or dict) less the ``declared``
    keys (dotted below the section), which the caller reads through the schema and hands to :func:`init_ray` as
    its own parameters (``num_cpus``, ``py_executable``; the evaluation config declares no runtime_env). Keys the
    schema does not declare were checked against ``ray.init``'s signature at load (:func:`ray_init_key_error`).
    An emptied ``runtime_env`` is dropped."""
    from omegaconf import DictConfig, OmegaConf

    data = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else dict(section)
    for path in declared:
        head, _, leaf = path.rpartition(".")
        node = data.get(head) if head else data
        if isinstance(node, dict):
            node.pop(leaf, None)
            if head and not node:
                data.pop(head)
    return data


def init_ray(address: str | None = None, num_cpus: int | None = None, py_executable: str | None = None,
             extra: dict | None = None) -> None:
    """Initialise Ray once per process; a second call is a no-op.

    Args:
        address: ``None`` → ``$RAY_ADDRESS`` when set (as a ``ray job submit`` driver has it), else a new
            embedded local instance; ``"auto"`` / ``"ray://..."`` / ``"host:port"`` → connect to an existing
            cluster (``num_cpus`` is then ignored: a cluster's size is its own).
        num_cpus: CPUs the embedded instance offers (``None`` → Ray detects them).
        py_executable: the command Ray starts its worker processes with (Ray's ``runtime_env.py_executable``, e.g.
            ``uv run`` as verl's uv-launched scripts set ``ray_kwargs.ray_init.runtime_env.py_executable``);
            ``None`` → this Python.
        extra: further ``ray.init`` keyword arguments (:func:`ray_init_extra` of ``ray_kwargs.ray_init``, as verl
            passes that section): they win over the embedded instance's own (``include_dashboard``...); an
            ``address`` there is used when ``address`` is None; a ``runtime_env`` is merged with ours (its
            ``env_vars`` joined).

    The embedded case is :func:`start_embedded_ray`: every port on ``127.0.0.1``, no dashboard or job API, Ray's
    files in a private temp folder, and :func:`set_embedded_ray_env`'s defaults (:data:`EMBEDDED_RAY_ENV`: no token
    authentication; workers at the driver's priority, not nice 15; no prestarted idle workers; batches up to
    10 MiB inline in the call).

    Raises:
        RemoteUnavailableError / ValueError: from :func:`check_ray_address`, before ``ray.init`` is called.
        PermissionError: the private temp folder is someone else's (:func:`local_ray_init_kwargs`).
        ConfigError: an embedded instance's ``py_executable`` whose program is not here (:func:`check_py_executable`).
    """
    global _started_here
    if ray.is_initialized():
        return
    # config-read recording (rlhf_core/config/reads.py) must reach every worker process too
    reads = os.environ.get("RLHF_CONFIG_READS")
    kwargs = dict(extra or {})
    runtime_env = _merge_runtime_env(ray_runtime_env(reads, py_executable), kwargs.pop("runtime_env", None))
    address = kwargs.pop("address", None) if address is None else address
    if address is None:  # ray_init.address unset: a `ray job submit` driver's cluster, else an embedded one
        address = os.environ.get("RAY_ADDRESS") or None
    if address is None:
        check_py_executable((runtime_env or {}).get("py_executable"))
        start_embedded_ray(num_cpus, **{"log_to_driver": True, **kwargs, "runtime_env": runtime_env})
        _started_here = True
    else:
        kwargs.pop("address", None)
        check_ray_address(str(address))
        ray.init(address=address, runtime_env=runtime_env, **kwargs)


def stop_started_ray() -> bool:
    """Stop now the embedded Ray instance that :func:`init_ray` started in this process (after Ctrl-C: the command
    then exits within a second or two instead of about five); returns whether there was one. A cluster this process
    only connected to, or a Ray this process did not start through :func:`init_ray`, is left alone.

    The autoscaler monitor of the one-node instance is killed first (SIGKILL; it holds no state here): on SIGINT or
    SIGTERM it reports its end to the GCS, which Ctrl-C is taking down too, so Ray's own shutdown waited its full
    1 s grace for it. Then ``ray.shutdown()`` stops the raylet (and with it the workers), the GCS and the other
    processes; called here rather than at exit, it skips Ray's at-exit 0.5 s pause for log lines.
    """
    global _started_here
    if not (_started_here and ray.is_initialized()):
        return False
    _started_here = False
    node = getattr(ray._private.worker, "_global_node", None)  # the head node this process started
    if node is not None and hasattr(node, "kill_monitor"):
        with contextlib.suppress(Exception):  # already gone, or a Ray without a monitor: ray.shutdown copes
            node.kill_monitor(check_alive=False)
    ray.shutdown()
    return True


def check_py_executable(py_executable: str | None) -> None:
    """Refuse, before an embedded Ray starts, a ``runtime_env.py_executable`` whose program is not on ``PATH``:
    Ray would start no worker and retry for ever (``exec: uv: not found`` in the raylet's log), the run hanging.
    verl 0.9's example scripts pass ``uv -v run --frozen ...`` (unless ``VERL_USE_UV=0``); ``rlhf experiment
    from-verl`` keeps it. None (this Python) passes.

    Raises:
        ConfigError: naming the key, its value and the missing program.
    """
    if py_executable is None:
        return
    words = shlex.split(str(py_executable))
    program = words[0] if words else ""
    if not program or shutil.which(program) is None:
        raise ConfigError(
            f"ray_kwargs.ray_init.runtime_env.py_executable={py_executable!r}: {program!r} is not found on PATH, so "
            "Ray could start no worker process; set it to null (this Python; verl's scripts: VERL_USE_UV=0) or "
            f"install {program!r}")


def _merge_runtime_env(ours: dict | None, theirs: dict | None) -> dict | None:
    """``theirs`` (the user's ``runtime_env``) with ours on top; ``env_vars`` joined (ours win on a clash)."""
    if not theirs:
        return ours
    merged = {**theirs, **(ours or {})}
    if "env_vars" in theirs and ours and "env_vars" in ours:
        merged["env_vars"] = {**theirs["env_vars"], **ours["env_vars"]}
    return merged


def ppo_ray_extra(config: Any) -> dict:
    """``ray.init`` arguments of a PPO config beyond the declared ones: ``ray_kwargs.ray_init``
    (:func:`ray_init_extra`), with the environment of ``rollout.full_determinism`` (:func:`full_determinism_env`,
    seeded by ``rollout.seed``, null: ``data.seed``) in every worker's ``runtime_env`` (verl sets it in the driver's
    environment before ``ray.init``). ``rlhf ppo`` passes it to :func:`init_ray`; the pipeline's stages use it
    through :func:`ppo_stage_runtime_env`."""
    rollout = config.actor_rollout_ref.rollout
    seed = config.data.seed if rollout.seed is None else rollout.seed
    return with_env_vars(ray_init_extra(config.ray_kwargs.ray_init),
                         full_determinism_env(bool(rollout.full_determinism), seed))


def ppo_stage_runtime_env(config: Any, embedded: bool) -> dict | None:
    """The Ray ``runtime_env`` of a pipeline stage's task that runs the PPO driver (``ppo_segment``, ``validate``):
    what :func:`init_ray` gives ``ray.init`` for ``config`` under ``rlhf ppo`` (``ray_kwargs.ray_init.runtime_env``:
    its ``py_executable`` and ``env_vars``, plus :func:`ppo_ray_extra`'s), for the one task. In the pipeline Ray is
    started once by the flow, so the driver's own ``init_ray`` is a no-op; the task's runtime_env reaches the
    worker actors it starts, which inherit their parent's (Ray merges an actor's own ``env_vars`` over it).
    None when there is nothing to set.

    Raises:
        ConfigError: ``embedded`` (a local Ray instance) and a ``py_executable`` whose program is not on ``PATH``
            (:func:`check_py_executable`), before any task starts.
    """
    env = _merge_runtime_env(ray_runtime_env(None, config.ray_kwargs.ray_init.runtime_env.py_executable),
                             ppo_ray_extra(config).get("runtime_env"))
    if embedded:
        check_py_executable((env or {}).get("py_executable"))
    return env


def write_ray_timeline(path: str | None) -> None:
    """Write Ray's task timeline (a chrome://tracing / Perfetto JSON list of events) to ``path``
    (``ray_init.timeline_json_file`` / verl 0.6's ``ray_kwargs.timeline_json_file``, as verl's ``run_ppo`` does
    after training); None: nothing. The folder is created; Ray must still be initialized."""
    if path is None:
        return
    path = os.path.expanduser(str(path))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ray.timeline(filename=path)


def full_determinism_env(enabled: bool, seed: int) -> dict[str, str]:
    """The environment verl 0.9's ``run_ppo`` sets before ``ray.init`` when ``rollout.full_determinism`` is on:
    ``VERL_FULL_DETERMINISM=1``, ``VLLM_BATCH_INVARIANT=1`` (vLLM's batch-invariant kernels: a request's tokens do
    not depend on what it is batched with) and ``PYTHONHASHSEED`` = the rollout seed; empty when off."""
    if not enabled:
        return {}
    return {"VERL_FULL_DETERMINISM": "1", "VLLM_BATCH_INVARIANT": "1", "PYTHONHASHSEED": str(int(seed))}


def with_env_vars(extra: dict, env: dict[str, str]) -> dict:
    """``extra`` (``ray.init`` keyword arguments) with ``env`` added to its ``runtime_env.env_vars`` (``env`` wins),
    so every Ray worker process starts with it; ``extra`` itself is not changed."""
    if not env:
        return extra
    runtime_env = dict(extra.get("runtime_env") or {})
    runtime_env["env_vars"] = {**dict(runtime_env.get("env_vars") or {}), **env}
    return {**extra, "runtime_env": runtime_env}
