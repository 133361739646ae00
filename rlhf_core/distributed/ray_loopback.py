"""What keeps an embedded Ray 2.60 instance off the network and its files private (issue 32).

Measured with ``ss -ltnp`` during an embedded run on Ray 2.60 (``tests/reliability/test_network_exposure.py``):

* Ray binds its gRPC servers (GCS, raylet, every worker, the dashboard agent), the runtime-env agent, the
  dashboard agent's HTTP server and the metrics ports of the monitor and the dashboard head to the *node IP
  address*, or to all interfaces where that address is not loopback. ``ray.init(_node_ip_address="127.0.0.1")``
  and ``ray start --node-ip-address 127.0.0.1`` are not enough: ``services.resolve_ip_for_localhost`` replaces a
  loopback address by the machine's own address, except when ``ray_constants.ENABLE_RAY_CLUSTER`` is false (the
  environment variable ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when ``ray`` is imported). With it false
  during ``ray.init`` every listening socket of the instance is on ``127.0.0.1`` (``::ffff:127.0.0.1``).
* The dashboard agent serves an HTTP job API (``POST /api/job_agent/jobs/`` runs a shell command) whenever
  ``ray[default]``'s dashboard packages import, whatever ``include_dashboard`` says. Ray starts the agent with
  ``--minimal`` (no HTTP server) when ``ray._private.utils.get_dashboard_dependency_error()`` reports them
  missing in the starting process; nothing else turns it off.
* Ray makes its temp dir (``/tmp/ray``) and every session folder mode 0777. Under a parent folder of mode 0700
  they are reachable by their owner only.

Ours, not verl's (verl's ``ray.init`` leaves Ray's defaults).
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) names this machine's loopback interface only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def node_ip_address(host: str) -> str | None:
    """Ray's node address for bind host ``host``: ``127.0.0.1`` for a loopback one, ``None`` (Ray's default: the
    machine's own address) for a wildcard meaning all interfaces, else ``host`` itself."""
    if is_loopback(host):
        return LOOPBACK
    try:
        return None if ipaddress.ip_address(host).is_unspecified else host
    except ValueError:  # a host name
        return host


def private_temp_root() -> Path:
    """This user's private folder for Ray's files: ``<tempfile.gettempdir()>/rlhf-ray-<uid>``, mode 0700.

    Created when missing (mode 0700). An existing one that is ours but readable, writable or searchable by
    others is set back to 0700.

    Raises:
        PermissionError: the path exists as a symbolic link, as something other than a folder, or owned by another
            user (someone could read or replace Ray's sockets and logs there); the message names the path and the
            owner's uid.
    """
    root = Path(tempfile.gettempdir()) / f"rlhf-ray-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"{root} is not a folder of uid {os.getuid()} (mode {stat.filemode(info.st_mode)}, "
                              f"owner uid {info.st_uid}): remove it or set TMPDIR to a private folder")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(root, 0o700)
    return root


def ray_temp_dir() -> str:
    """Ray's ``_temp_dir`` for an embedded instance: ``ray`` inside :func:`private_temp_root` (Ray makes the
    folder itself 0777, so it must sit inside the private one; creating it is left to Ray)."""
    return str(private_temp_root() / "ray")


@contextlib.contextmanager
def loopback_ray_start(loopback: bool) -> Iterator[None]:
    """Context for ``ray.init`` of an embedded instance: no dashboard-agent HTTP API (its job submission runs
    commands), and with ``loopback`` every port on ``127.0.0.1`` (pass ``_node_ip_address="127.0.0.1"`` too).

    Changes two Ray 2.60 internals for the duration only (see the module docstring for why each):
    ``ray._private.utils.get_dashboard_dependency_error`` reports the dashboard packages missing, so the agent
    is started ``--minimal``; with ``loopback``, ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` is false, so
    ``127.0.0.1`` is kept as the node address. Both are restored on exit: a later ``ray.init(address=...)`` to a
    cluster in the same process sees Ray's own values.
    """
    import ray._private.ray_constants as ray_constants
    import ray._private.utils as ray_utils

    saved = ray_constants.ENABLE_RAY_CLUSTER, ray_utils.get_dashboard_dependency_error
    ray_utils.get_dashboard_dependency_error = lambda: ImportError(
        "rlhf: the embedded Ray instance starts no dashboard-agent HTTP (job) API")
    if loopback:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER, ray_utils.get_dashboard_dependency_error = saved


__all__ = ["LOOPBACK", "is_loopback", "loopback_ray_start", "node_ip_address", "private_temp_root",
           "ray_temp_dir"]
