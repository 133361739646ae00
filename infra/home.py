"""The project's home folder and the embedded-service defaults under it.

Everything the pipeline writes by default lives under ``$RLHF_HOME`` (default ``./.rlhf``):
the MLflow SQLite store and artifacts, the DuckDB results database and its parquet files,
Prefect's ephemeral state, checkpoints and data caches.
"""

from __future__ import annotations

import os
from pathlib import Path


def rlhf_home() -> Path:
    """Return the absolute home folder (``$RLHF_HOME`` or ``./.rlhf``), creating it.

    Raises:
        OSError: the folder cannot be created (same ``errno``), in one line naming ``RLHF_HOME`` and the folder
            (a read-only file system, a file in the way, no permission), not only the bare path.
    """
    home = Path(os.environ.get("RLHF_HOME") or ".rlhf").expanduser().resolve()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        given = "RLHF_HOME" if os.environ.get("RLHF_HOME") else "RLHF_HOME (unset: ./.rlhf of the current folder)"
        raise OSError(exc.errno, f"{given}: cannot create {home} ({exc.strerror}); set RLHF_HOME to a writable "
                                 "folder or run from one") from None
    return home


def embedded_defaults(home: Path) -> dict[str, str]:
    """The environment an embedded (single-machine) run uses, as variable -> value."""
    return {
        "RLHF_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # the ephemeral API server needs more than Prefect's 20 s on a busy 2-core machine
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
        "RLHF_MLFLOW_ARTIFACT_ROOT": (home / "mlartifacts").as_uri(),
        # MLflow's client prints "View run ... at: <url>" when a run on a tracking server ends: a link without
        # ?workflowType=machine_learning, which opens the GenAI view; the pipeline prints its own (infra.lineage)
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
        "RAY_AUTH_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
    }


def configure_environment() -> dict[str, str]:
    """Set the embedded defaults in ``os.environ`` without overriding what the user set.

    ``PREFECT_HOME`` and ``MLFLOW_TRACKING_URI`` are left alone when already set (a user with
    a real Prefect or MLflow server keeps it). ``RAY_AUTH_MODE=disabled`` is only applied when
    no Ray address is configured (a private local instance).

    Returns:
        The effective values of the variables this function manages.
    """
    home = rlhf_home()
    defaults = embedded_defaults(home)
    if os.environ.get("RAY_ADDRESS"):
        defaults.pop("RAY_AUTH_MODE")
    for key, value in defaults.items():
        if not os.environ.get(key):
            os.environ[key] = value
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
    return {key: os.environ[key] for key in defaults}


def artifact_root() -> str:
    """The artifact location for new MLflow experiments (a ``file://`` URI under the home)."""
    return os.environ.get("RLHF_MLFLOW_ARTIFACT_ROOT") or (rlhf_home() / "mlartifacts").as_uri()


SETTINGS_FILE = "settings.json"


def remembered(key: str, home: Path | None = None) -> str | None:
    """A value an earlier flow run recorded under the home (``remember``), or None."""
    import json

    path = (home or rlhf_home()) / SETTINGS_FILE
    try:
        value = json.loads(path.read_text()).get(key)
    except (OSError, ValueError):
        return None
    return str(value) if value is not None else None


def remember(key: str, value: str, home: Path | None = None) -> None:
    """Record ``key = value`` in ``$RLHF_HOME/settings.json`` (written atomically), so the next
    ``rlhf pipeline`` in this home finds e.g. the GSM8K folder ``make demo`` used."""
    import json
    import uuid

    home = home or rlhf_home()
    path = home / SETTINGS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = value
    tmp = home / f".{SETTINGS_FILE}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
