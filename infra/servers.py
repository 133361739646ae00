"""Command lines of the servers this project starts or documents, bound to ``127.0.0.1`` by default.

Every builder takes ``host``; ``None`` means :func:`rlhf_core.bind_host.bind_host` (``$RLHF_BIND_HOST``, else
``127.0.0.1``). A server reachable from other machines is an explicit choice (``RLHF_BIND_HOST=0.0.0.0`` or
``host=...``): the Prefect server, the MLflow server and the Ray dashboard authenticate nobody by default.
Prefect's ephemeral API server (no ``PREFECT_API_URL``) binds 127.0.0.1 by itself.
"""

from __future__ import annotations

import sys

from rlhf_core.bind_host import bind_host
from rlhf_core.distributed.ray_loopback import is_loopback, node_ip_address


PREFECT_ANALYTICS_OFF = "PREFECT_SERVER_ANALYTICS_ENABLED=false"


def prefect_server_command(port: int = 4200, host: str | None = None) -> list[str]:
    """``env PREFECT_SERVER_ANALYTICS_ENABLED=false prefect server start --host HOST --port PORT`` (the UI and API at
    ``http://HOST:PORT``). Analytics off, as in embedded mode (``infra.home``): the server would otherwise send
    telemetry at start (an error line on a machine without internet), and its clients (workers, flow runs) follow
    the server's setting (``GET /api/admin/settings``)."""
    return ["env", PREFECT_ANALYTICS_OFF, sys.executable, "-m", "prefect", "server", "start",
            "--host", host or bind_host(), "--port", str(port)]


def mlflow_server_command(backend_store_uri: str, port: int = 5000, host: str | None = None,
                          artifacts_destination: str | None = None) -> list[str]:
    """``mlflow server`` (tracking server and UI) on ``backend_store_uri`` (e.g. ``$MLFLOW_TRACKING_URI``)."""
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", host or bind_host(), "--port", str(port),
           "--backend-store-uri", backend_store_uri, "--workers", "1"]
    if artifacts_destination:
        cmd += ["--artifacts-destination", artifacts_destination]
    return cmd


def ray_head_command(port: int = 6379, host: str | None = None) -> list[str]:
    """``ray start --head``: its dashboard (when Ray has one) and client server on ``host``. Other nodes join
    a head only through an address they can reach: a multi-node head needs ``host`` set to that address.

    A loopback ``host`` (the default) puts every port of the head on ``127.0.0.1`` (checked with ``ss -ltnp`` on
    Ray 2.60): the command runs under ``env RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, without which Ray replaces
    ``--node-ip-address 127.0.0.1`` by the machine's address and binds its gRPC ports there
    (:mod:`rlhf_core.distributed.ray_loopback`); no other node can join such a head. A wildcard ``host`` leaves
    the node address to Ray (the machine's)."""
    host = host or bind_host()
    node_ip = node_ip_address(host)
    cmd = ["ray", "start", "--head", "--port", str(port)]
    cmd += ["--node-ip-address", node_ip] if node_ip else []
    cmd += ["--dashboard-host", host, "--ray-client-server-port", "10001"]
    return ["env", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0", *cmd] if is_loopback(host) else cmd


__all__ = ["PREFECT_ANALYTICS_OFF", "mlflow_server_command", "prefect_server_command", "ray_head_command"]
