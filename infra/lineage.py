"""MLflow lineage: one parent run per flow run, one nested run per stage.

Everything goes through an explicit ``MlflowClient`` and explicit run ids — never
mlflow's process-global active run — because Prefect runs tasks in threads and the core
runs in other (Ray) processes. A core process logs into a stage run when it is given
``MLFLOW_TRACKING_URI`` and ``MLFLOW_RUN_ID`` (see ``stage_env``).

Degraded lineage: when ``$MLFLOW_TRACKING_URI`` is an ``http(s)://`` server that does not answer its ``/health``
probe within :data:`PROBE_TIMEOUT_S`, or a ``sqlite:///`` store on a read-only file system (checked once per
process and URI), one warning says lineage is degraded and
every function here stops talking to MLflow: :func:`start_run` returns a local ``offline-<hex>`` id (unique, so the
results store still keys runs by it), logging calls do nothing, :func:`log_dataset` still returns the file's
sha256, :func:`stage_env` hands the core no MLflow run. Training and the DuckDB results go on; :func:`degraded`
says why lineage is missing. (MLflow's own client would instead retry each call for minutes.)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

from mlflow import MlflowClient
from mlflow.entities import DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH

from rlhf_core.redact import redact, redact_text
from rlhf_core.storage import read_only_reason, sqlite_store_path
from rlhf_core.trainer.tracking import mlflow_params

PARENT_TAG = "mlflow.parentRunId"
FLOW_RUN_TAG = "prefect.flow_run_id"
STAGE_TAG = "rlhf.stage"
GIT_TAG = "mlflow.source.git.commit"
GIT_DIRTY_TAG = "git.dirty"
CONFIG_HASH_TAG = "rlhf.config_sha256"
FLOW_RUN_URL_TAG = "prefect.flow_run_url"
# MLflow 3 shows an experiment without this tag as a GenAI one; this value opens the model-training view
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
CACHED_FROM_TAG = "rlhf.cached_from_run_id"
NOTE_TAG = "mlflow.note.content"  # the run's Description in the MLflow UI
SOURCE_NAME_TAG = "mlflow.source.name"
SOURCE_TYPE_TAG = "mlflow.source.type"
ML_VIEW_QUERY = "workflowType=machine_learning"
"""The query MLflow 3's UI reads to show the model-training view (Runs, Models, metric charts) instead of the GenAI
one (Traces, Latency, Token usage). The UI routes inside the ``#`` (a hash router), so the query follows the route:
``/#/experiments/1/runs/<id>?workflowType=machine_learning``. Without it the UI shows the view the browser last
chose (``mlflow.workflowType`` in its local storage, GenAI at first), whatever ``mlflow.experimentKind`` says."""
UI_DEFAULT = "http://127.0.0.1:5000"
"""Where ``mlflow server`` / ``mlflow ui`` serve the UI by default (the links for a SQLite store point there)."""
ARTIFACT_LIMIT_BYTES = 50 * 2**20
OFFLINE_PREFIX = "offline-"
PROBE_TIMEOUT_S = 3.0
"""Seconds the tracking server gets to answer ``GET <uri>/health`` before lineage is degraded."""

logger = logging.getLogger(__name__)

_READY_STORES: set[str] = set()
_PROBED: dict[str, str | None] = {}  # tracking URI -> why it is unreachable (None: it answered)


def degraded() -> str | None:
    """Why lineage is degraded for ``$MLFLOW_TRACKING_URI`` — the ``http(s)://`` tracking server did not answer
    ``GET /health`` within :data:`PROBE_TIMEOUT_S`, or the ``sqlite:///`` store is on a read-only file system
    or not writable by this process (:func:`rlhf_core.storage.read_only_reason`) — or None (a server that
    answered, a writable store). Probed once per process and URI; the first failed probe logs one warning."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    store = sqlite_store_path(uri)
    if store and uri not in _PROBED:
        reason = read_only_reason(store)
        _PROBED[uri] = f"MLflow store {store} is not writable ({reason})" if reason else None
        if reason:
            logger.warning("%s: lineage is degraded — training goes on and results still reach the DuckDB store, "
                           "but no runs, params, metrics or artifacts are recorded in MLflow; what the store "
                           "already holds is kept", _PROBED[uri])
    if not uri.startswith(("http://", "https://")) and not store:
        return None
    if uri not in _PROBED:
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S).close()
            _PROBED[uri] = None
        except urllib.error.HTTPError:  # it answered (with an error status): the server is there
            _PROBED[uri] = None
        except (urllib.error.URLError, OSError) as exc:
            _PROBED[uri] = f"MLflow tracking server {uri} is unreachable ({getattr(exc, 'reason', exc)})"
            logger.warning("%s: lineage is degraded — training goes on and results still reach the DuckDB store, "
                           "but no runs, params, metrics or artifacts are recorded in MLflow", _PROBED[uri])
    return _PROBED[uri]


def _unless_degraded(default: Any):
    """Decorator: when :func:`degraded`, return ``default`` (called when callable) instead of calling MLflow."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if degraded() is not None:
                return default() if callable(default) else default
            return fn(*args, **kwargs)
        return inner
    return wrap


def client() -> MlflowClient:
    """A client for ``$MLFLOW_TRACKING_URI`` (call ``infra.home.configure_environment`` first).

    The first use of a SQLite store in this process creates its tables under a file lock
    (``<db>.lock``): two flow runs starting at once on a fresh ``$RLHF_HOME`` would otherwise race
    on MLflow's schema creation ("table ... already exists").
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri and uri.startswith("sqlite:///") and uri not in _READY_STORES:
        from filelock import FileLock

        with FileLock(uri[len("sqlite:///"):] + ".lock", timeout=300):
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # creates / migrates the schema
        _READY_STORES.add(uri)
    return MlflowClient(tracking_uri=uri)


@_unless_degraded("0")
def get_or_create_experiment(name: str) -> str:
    """Return the id of experiment ``name``, creating it (artifacts under the home) if missing."""
    c = client()
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if EXPERIMENT_KIND_TAG not in exp.tags:
            c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    from infra.home import artifact_root

    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    location = f"{artifact_root()}/{name}" if uri.startswith("sqlite:") else None
    try:
        return c.create_experiment(name, artifact_location=location,
                                   tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except Exception:  # created concurrently by another process
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def ui_base() -> str:
    """The MLflow UI's address: ``$MLFLOW_TRACKING_URI`` when it is an ``http(s)://`` server, else
    :data:`UI_DEFAULT` (what ``mlflow server --backend-store-uri <the SQLite store>`` serves)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else UI_DEFAULT


def experiment_url(experiment_id: str) -> str:
    """Link to an experiment's runs in the MLflow UI's model-training view (:data:`ML_VIEW_QUERY`)."""
    return f"{ui_base()}/#/experiments/{experiment_id}/runs?{ML_VIEW_QUERY}"


def run_url(run_id: str, experiment_id: str | None = None) -> str:
    """Link to a run in the MLflow UI's model-training view (:data:`ML_VIEW_QUERY`).

    ``experiment_id`` None: looked up in the store; ``"0"`` when lineage is degraded or the run is
    unknown (the link then finds nothing, and nothing worse)."""
    if experiment_id is None:
        experiment_id = "0"
        if degraded() is None:
            try:
                experiment_id = client().get_run(run_id).info.experiment_id
            except Exception:  # noqa: BLE001 - an unknown run: the link still names it
                pass
    return f"{ui_base()}/#/experiments/{experiment_id}/runs/{run_id}?{ML_VIEW_QUERY}"


def model_version_url(name: str, version: str) -> str:
    """Link to a registered model version in the MLflow UI (model-training view)."""
    from urllib.parse import quote

    return f"{ui_base()}/#/models/{quote(name, safe='')}/versions/{version}?{ML_VIEW_QUERY}"


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The HEAD commit of the repository at ``cwd``, or None when unavailable."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_dirty(cwd: str | Path | None = None) -> bool | None:
    """Whether the work tree at ``cwd`` has uncommitted changes (None when git is unavailable)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def config_hash(params: Mapping[str, Any]) -> str:
    """sha256 of the flattened ``params`` as sorted JSON (the same config, the same hash)."""
    import json

    return hashlib.sha256(json.dumps(mlflow_params(params), sort_keys=True).encode()).hexdigest()


@_unless_degraded(0)
def log_params(run_id: str, params: Mapping[str, Any]) -> int:
    """Log ``params`` in batches of 100, named and cut as the core's ``mlflow`` sink names them
    (:func:`rlhf_core.trainer.tracking.mlflow_params`); returns how many were logged."""
    flat = mlflow_params(params)
    items = [Param(k, v) for k, v in flat.items()]
    c = client()
    for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
        c.log_batch(run_id, params=items[i: i + MAX_PARAMS_TAGS_PER_BATCH])
    return len(items)


@_unless_degraded(None)
def log_metrics(run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
    """Log numeric ``metrics`` at ``step`` (non-numeric values are skipped)."""
    now = int(time.time() * 1000)
    ms = [Metric(k, float(v), now, step) for k, v in metrics.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool)]
    for i in range(0, len(ms), 1000):
        client().log_batch(run_id, metrics=ms[i: i + 1000])


@_unless_degraded(None)
def set_tags(run_id: str, tags: Mapping[str, Any]) -> None:
    """Set string tags on a run."""
    client().log_batch(run_id, tags=[RunTag(k, redact_text(str(v))) for k, v in tags.items()])


@_unless_degraded(None)
def log_dict_artifact(run_id: str, data: Mapping[str, Any], artifact_file: str) -> None:
    """Save ``data`` as a JSON artifact ``artifact_file`` (e.g. ``config/ppo.json``) of ``run_id``."""
    client().log_dict(run_id, redact(dict(data)), artifact_file)


@_unless_degraded(None)
def log_text_artifact(run_id: str, text: str, artifact_file: str) -> None:
    """Save ``text`` (secrets scrubbed: :func:`rlhf_core.redact.redact_text`) as artifact ``artifact_file``
    (e.g. ``summary.md``) of ``run_id``."""
    client().log_text(run_id, redact_text(text), artifact_file)


@_unless_degraded(lambda: OFFLINE_PREFIX + uuid.uuid4().hex)
def start_run(experiment: str, run_name: str, tags: Mapping[str, Any] | None = None,
              parent_run_id: str | None = None) -> str:
    """Create a RUNNING run (nested under ``parent_run_id`` when given) and return its id."""
    all_tags = {k: redact_text(str(v)) for k, v in (tags or {}).items()}
    if parent_run_id:
        all_tags[PARENT_TAG] = parent_run_id
    run = client().create_run(get_or_create_experiment(experiment), tags=all_tags, run_name=run_name)
    return run.info.run_id


@_unless_degraded(None)
def end_run(run_id: str, status: str = "FINISHED") -> None:
    """Mark a run FINISHED / FAILED / KILLED."""
    client().set_terminated(run_id, status=status)


@contextlib.contextmanager
def pipeline_run(experiment: str, flow_run_id: str | None, params: Mapping[str, Any],
                 run_name: str = "rlhf", tags: Mapping[str, Any] | None = None) -> Iterator[str]:
    """Parent run of one flow run, named ``run_name`` (the flow run's name): tags the flow run
    id, the git commit and dirty flag, the hash of ``params`` and ``tags`` (e.g. the flow-run
    URL); logs ``params``.

    Yields the run id; the run ends FINISHED, or FAILED when the body raises.
    """
    tags = {FLOW_RUN_TAG: flow_run_id or "", STAGE_TAG: "pipeline", CONFIG_HASH_TAG: config_hash(params),
            **{k: str(v) for k, v in (tags or {}).items()}}
    here = Path(__file__).resolve().parent
    commit = git_commit(here)
    if commit:
        tags[GIT_TAG] = commit
        tags[GIT_DIRTY_TAG] = str(git_dirty(here)).lower()
    with _tracked_run(experiment, run_name, tags, params) as run_id:
        yield run_id


@contextlib.contextmanager
def _tracked_run(experiment: str, run_name: str, tags: dict[str, str], params: Mapping[str, Any],
                 parent_run_id: str | None = None) -> Iterator[str]:
    """Start a run with ``params``; end it FINISHED when the body returns, FAILED when it raises."""
    run_id = start_run(experiment, run_name, tags, parent_run_id)
    log_params(run_id, params)
    status = "FAILED"
    try:
        yield run_id
        status = "FINISHED"
    finally:
        end_run(run_id, status)


def stage_run_name(stage_name: str, flow_run_name: str | None) -> str:
    """A stage run's name: ``ppo · practical-fox`` (the stage and its Prefect flow run's name), so that runs of
    different flow runs differ in MLflow's charts and tables; the stage alone without a flow run name."""
    return f"{stage_name} · {flow_run_name}" if flow_run_name else stage_name


@contextlib.contextmanager
def stage_run(stage_name: str, params: Mapping[str, Any], parent_run_id: str | None = None,
              experiment: str = "rlhf", flow_run_id: str | None = None,
              flow_run_name: str | None = None) -> Iterator[str]:
    """Nested run of one stage, yielding its run id; FINISHED on success, FAILED on error.

    Args:
        stage_name: the ``rlhf.stage`` tag, e.g. ``sft``; the run is named :func:`stage_run_name`.
        params: the stage's resolved config (flattened and truncated to MLflow's limits).
        parent_run_id: the flow's parent run; when None, the run is top-level.
        experiment: experiment name used when there is no parent.
        flow_run_name: the Prefect flow run's name (``practical-fox``), appended to the run name.
    """
    experiment = _parent_experiment(parent_run_id) or experiment
    tags = {STAGE_TAG: stage_name}
    if flow_run_id:
        tags[FLOW_RUN_TAG] = flow_run_id
    with _tracked_run(experiment, stage_run_name(stage_name, flow_run_name), tags, params,
                      parent_run_id) as run_id:
        yield run_id


def _parent_experiment(parent_run_id: str | None) -> str | None:
    """The experiment name of ``parent_run_id`` (None without a parent or when lineage is degraded)."""
    if not parent_run_id or degraded() is not None:
        return None
    experiment_id = client().get_run(parent_run_id).info.experiment_id
    return client().get_experiment(experiment_id).name


@_unless_degraded(lambda: OFFLINE_PREFIX + uuid.uuid4().hex)
def cached_stage_run(stage_name: str, source_run_id: str, parent_run_id: str, flow_run_id: str | None = None,
                     flow_run_name: str | None = None) -> str:
    """Record a stage that Prefect served from its cache as a FINISHED child of ``parent_run_id`` that points
    at the run which produced the output (``source_run_id``, of an earlier flow run); returns its id.

    The child is named :func:`stage_run_name`, tagged ``rlhf.cached_from_run_id`` = ``source_run_id``, its
    description (``mlflow.note.content``) says where the output came from, and it repeats the source run's
    dataset inputs and its ``dataset.*`` / ``artifact.*`` tags (paths and sha256), so the lineage of a cached
    model is on this flow run's own tree. A source run missing from the store is said so in the description.
    """
    from mlflow.exceptions import MlflowException

    try:
        source = client().get_run(source_run_id)
    except MlflowException:
        source = None
    where = (f"run {source.info.run_name!r} ({source_run_id}) of flow run "
             f"{source.data.tags.get(FLOW_RUN_TAG) or '?'}" if source else f"run {source_run_id} (not in this store)")
    tags = {STAGE_TAG: stage_name, CACHED_FROM_TAG: source_run_id,
            NOTE_TAG: f"Served from Prefect's cache: this stage did not run again; its output is the output of "
                      f"MLflow {where}.", **({FLOW_RUN_TAG: flow_run_id} if flow_run_id else {})}
    if source:
        tags.update({k: v for k, v in source.data.tags.items() if k.startswith(("dataset.", "artifact."))})
    run_id = start_run(_parent_experiment(parent_run_id) or "rlhf", stage_run_name(stage_name, flow_run_name),
                       tags, parent_run_id)
    if source and source.inputs and source.inputs.dataset_inputs:
        client().log_inputs(run_id, datasets=list(source.inputs.dataset_inputs))
    end_run(run_id)
    return run_id


def stage_env(run_id: str) -> dict[str, str]:
    """Environment that makes the core's MLflow sink log into ``run_id`` from any process ({} when degraded)."""
    if degraded() is not None:
        return {}
    env = {"MLFLOW_RUN_ID": run_id}
    if os.environ.get("MLFLOW_TRACKING_URI"):
        env["MLFLOW_TRACKING_URI"] = os.environ["MLFLOW_TRACKING_URI"]
    return env


def file_digest(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def log_dataset(run_id: str, path: str | Path, name: str, context: str) -> str:
    """Log a parquet file as a dataset input of ``run_id`` and return its sha256 digest.

    The MLflow dataset carries the schema and row count (``mlflow.data.from_pandas``) with
    ``source`` = the file's URI; the sha256 of the file's bytes is its digest and is also
    set as tag ``dataset.<name>.sha256``.

    Args:
        context: ``training``, ``validation``, ``evaluation``...

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    import mlflow.data
    import pandas as pd

    path = Path(path).resolve()
    digest = file_digest(path)
    if degraded() is not None:
        return digest
    df = pd.read_parquet(path)
    with warnings.catch_warnings():  # "source can be interpreted in multiple ways": both are local files
        warnings.simplefilter("ignore", UserWarning)
        ds = mlflow.data.from_pandas(df, source=path.as_uri(), name=name, digest=digest[:36])
    entity = ds._to_mlflow_entity()
    tags = [InputTag(key="mlflow.data.context", value=context)]
    client().log_inputs(run_id, datasets=[DatasetInput(dataset=entity, tags=tags)])
    set_tags(run_id, {f"dataset.{name}.sha256": digest, f"dataset.{name}.path": str(path)})
    return digest


def dir_size(path: str | Path) -> int:
    """Total bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


@_unless_degraded(False)
def log_dir_artifact(run_id: str, local_dir: str | Path, artifact_path: str,
                     max_bytes: int = ARTIFACT_LIMIT_BYTES) -> bool:
    """Log a model/checkpoint folder as artifacts when it is at most ``max_bytes``.

    Larger folders are not copied: only tag ``artifact.<artifact_path>.path`` records where
    they are. Returns True when the folder was copied.
    """
    local_dir = Path(local_dir).resolve()
    tags = {f"artifact.{artifact_path}.path": str(local_dir)}
    copied = dir_size(local_dir) <= max_bytes
    if copied:
        client().log_artifacts(run_id, str(local_dir), artifact_path)
    set_tags(run_id, tags)
    return copied
