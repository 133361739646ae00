"""The address every server we start listens on: ``127.0.0.1`` unless ``$RLHF_BIND_HOST`` says otherwise.

Used by the embedded Ray instance's dashboard host (``rlhf_core.distributed.ray_init``,
``infra.ray_cluster``) and by the server command lines of ``infra.servers`` (Prefect server, MLflow
server/UI, Ray head). Set ``RLHF_BIND_HOST=0.0.0.0`` (or an interface address) only on a trusted network:
none of these servers authenticates requests by default. Ours (issue #12's security defaults), not verl's.
"""
from __future__ import annotations

import os

BIND_HOST_ENV = "RLHF_BIND_HOST"
DEFAULT_BIND_HOST = "127.0.0.1"


def bind_host() -> str:
    """``$RLHF_BIND_HOST`` when set and not empty, else ``127.0.0.1`` (loopback only)."""
    return os.environ.get(BIND_HOST_ENV) or DEFAULT_BIND_HOST


__all__ = ["BIND_HOST_ENV", "DEFAULT_BIND_HOST", "bind_host"]
