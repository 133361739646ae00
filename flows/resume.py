"""Resuming a pipeline run that did not finish (``rlhf pipeline ... --resume [RUN]``).

A flow run keeps everything of its PPO stage in ``$RLHF_HOME/runs/<flow run id>/`` (checkpoints, metrics files,
validation samples). A new flow run gets a new id, so re-running the same command after a crash or a ``kill -9``
would train PPO from step 0 in a new folder. ``--resume`` makes the new flow run (a new Prefect flow run and MLflow
parent run, as a Prefect retry of a flow run is a new attempt) work in the old run's folder instead:

* the stages before PPO (prepare_data, build_model, filter_prompts, sft) come from Prefect's cache, whose record a
  task writes only after it returned (the completion marker): a stage that had finished is reused, one that was cut
  short runs again (sft itself resumes from its own checkpoints, ``trainer.resume_mode=auto``);
* every ppo_segment resumes from the latest *complete* checkpoint (``trainer.resume_mode=auto``; a checkpoint is
  complete when the tracker names it and its files are all there: ``CheckpointManager.resolve_resume``); finished
  segments train nothing, and no checkpoint is removed.

Resuming is explicit (a flag), not automatic, because each ``rlhf pipeline`` is its own Prefect flow run: a user of
Prefect expects a new command to start a new run, as a scheduled deployment does every night, and a run to be
continued only when asked (Prefect's "retry" of a crashed flow run). A plain re-run that finds an unfinished run of
the same experiment and settings says how to continue it (:func:`unfinished_note`).

Each flow run holds an ``flock`` on its run folder (:func:`lock_run_dir`) while it runs, so a run that is still
alive (another terminal, a deployment) is never resumed twice: the kernel drops the lock when its process dies,
``kill -9`` included.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from infra.results import ResultsStore
from rlhf_core.config import ConfigError
from rlhf_core.redact import redact_json

LAST = "last"
"""``--resume`` without a value: the newest unfinished run of the same experiment and settings (none: a new run)."""

logger = logging.getLogger(__name__)

# flow-run statuses with nothing left to resume: FINISHED, or RESUMED (a run that continued it finished)
DONE = ("FINISHED", "RESUMED")


RESUMED_TAG = "rlhf.resumed_flow_run_id"
"""Tag of a resumed run's MLflow parent run: the flow run id whose folder it continued."""


class ResumeError(ConfigError):
    """A ``--resume`` that cannot be honoured: one line naming the run and why (an input error, never retried)."""


def run_dir(home: Path, flow_run_id: str) -> Path:
    """The folder of a flow run's PPO stage: ``<home>/runs/<flow run id>``."""
    return Path(home) / "runs" / flow_run_id


def _flow_rows(store: ResultsStore) -> list[dict[str, Any]]:
    """The ``runs`` rows of flow runs, newest first (``[]`` when the store has none)."""
    try:
        cols, rows = store.sql("SELECT run_id, name, status, params_json, started_at FROM runs "
                               "WHERE kind = 'flow' ORDER BY started_at DESC")
    except Exception:  # noqa: BLE001 - a store without a runs table yet: no earlier run
        return []
    return [dict(zip(cols, r)) for r in rows]


def _differences(recorded: str, params: dict[str, Any]) -> list[str]:
    """The settings (top-level names) in which the recorded ``params_json`` differs from ``params``."""
    old = json.loads(recorded or "{}")
    new = json.loads(redact_json(json.dumps(params, sort_keys=True, default=str)))
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def checkpoint_step(folder: Path) -> int | None:
    """The step of the latest checkpoint the run folder's tracker names (``checkpoints/
    latest_checkpointed_iteration.txt``), or None when it has none. Reads the tracker only: the trainer checks that
    the checkpoint is complete when it resumes (an incomplete one: the newest complete one before it)."""
    from rlhf_core.trainer.commands import TRACKER_FILE

    try:
        return int((folder / "checkpoints" / TRACKER_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(folder: Path) -> str | None:
    """The holder of the run folder's lock when a live process holds it (``PID 12 on host h ...``), else None."""
    from rlhf_core.safe_load import CheckpointError
    from rlhf_core.trainer.checkpoint_lock import CheckpointDirLock

    if not folder.is_dir():
        return None
    lock = CheckpointDirLock(str(folder))
    quiet = logging.getLogger("rlhf_core.trainer.checkpoint_lock")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # a killed run's lock file: no "taking over" notice for a look
    try:
        lock.acquire()
    except CheckpointError as exc:
        return str(getattr(exc, "holder", exc))
    finally:
        quiet.setLevel(level)
    lock.release()
    return None


def find_run(home: Path, given: str, params: dict[str, Any]) -> str | None:
    """The flow run id ``--resume given`` continues.

    Args:
        given: a flow run id or its Prefect name (``practical-fox``), or :data:`LAST` (the newest run of this home
            that did not finish and was made with the same experiment content and settings ``params``).
        params: this run's settings (``PipelineSettings.as_params()``), compared with the run's recorded ones.

    Returns:
        The flow run id, or None for :data:`LAST` when there is no such run (a new run starts).

    Raises:
        ResumeError: an id or name that names no flow run of this home (the unfinished ones listed), a run that
            finished, whose settings differ (naming the settings), whose folder is gone, or that is still running
            (naming its process).
    """
    rows = _flow_rows(ResultsStore(home))
    if given == LAST:
        candidates = [r for r in rows if r["status"] not in DONE and not _differences(r["params_json"], params)
                      and run_dir(home, r["run_id"]).is_dir() and _alive(run_dir(home, r["run_id"])) is None]
        return candidates[0]["run_id"] if candidates else None
    match = [r for r in rows if given in (r["run_id"], r["name"])]
    if not match:
        open_runs = [f"{r['run_id']} ({r['name']}, {r['status']})" for r in rows if r["status"] not in DONE]
        raise ResumeError(f"--resume {given}: no flow run with that id or name in {home} (runs that did not finish: "
                          f"{', '.join(open_runs[:5]) or 'none'})")
    row = match[0]
    rid = row["run_id"]
    if row["status"] in DONE:
        how = "finished" if row["status"] == "FINISHED" else "was continued by a resumed run that finished"
        raise ResumeError(f"--resume {given}: flow run {rid} ({row['name']}) {how}; nothing to resume (leave out "
                          "--resume to start a new run)")
    diff = _differences(row["params_json"], params)
    if diff:
        raise ResumeError(f"--resume {given}: flow run {rid} was made with other settings ({', '.join(diff)}); "
                          "resume it with the same experiment file and options, or leave out --resume")
    if not run_dir(home, rid).is_dir():
        raise ResumeError(f"--resume {given}: flow run {rid} has no run folder {run_dir(home, rid)}")
    holder = _alive(run_dir(home, rid))
    if holder is not None:
        raise ResumeError(f"--resume {given}: flow run {rid} is still running ({holder})")
    return rid


def unfinished_note(home: Path, params: dict[str, Any], flow_run_id: str) -> str | None:
    """For a run started without ``--resume``: a line naming the newest unfinished run of the same experiment and
    settings that has a PPO checkpoint, and how to continue it instead; None when there is none."""
    rid = find_run(home, LAST, params)
    step = None if rid is None or rid == flow_run_id else checkpoint_step(run_dir(home, rid))
    if step is None:
        return None
    return (f"note: flow run {rid} of this experiment (same settings) did not finish and has a PPO checkpoint at step "
            f"{step} (in {run_dir(home, rid)}); this run starts anew. To continue that one instead, stop this one "
            f"and run the same command with --resume {rid} (or --resume for the newest)")


def mark_resumed(store: ResultsStore, flow_run_id: str) -> None:
    """Record the resumed flow run as ``RESUMED`` (ended now) once the run that continued it in its folder finished:
    neither ``--resume`` (no RUN) nor a plain run's note offers it again (its evaluation and model registration
    are done), and a query of the store tells it from a run that failed."""
    import datetime as dt

    _, rows = store.sql(f"SELECT name, params_json, started_at FROM runs WHERE kind = 'flow' "
                        f"AND run_id = '{flow_run_id}'")
    if rows:
        name, params_json, started = rows[0]
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        store.index_run(flow_run_id, flow_run_id, "flow", "RESUMED", started, now, params_json, name=name, kind="flow")


def mark_interrupted(store: ResultsStore, flow_run_id: str) -> list[str]:
    """Record the resumed flow run, and each of its stage runs, as FAILED (ended now) where its ``runs`` row still
    says RUNNING: it was killed without recording its end (a ``kill -9``), and a query of the store should not show
    it running. The stage runs' MLflow runs (their run ids are MLflow's) are ended ``KILLED`` as well. Returns the
    stage run ids marked."""
    import datetime as dt

    from mlflow.exceptions import MlflowException

    from infra import lineage

    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    _, rows = store.sql(f"SELECT name, status, params_json, started_at FROM runs WHERE kind = 'flow' "
                        f"AND run_id = '{flow_run_id}'")
    if rows and rows[0][1] == "RUNNING":
        name, _, params_json, started = rows[0]
        store.index_run(flow_run_id, flow_run_id, "flow", "FAILED", started, now, params_json, name=name, kind="flow")
    _, stages = store.sql(f"SELECT run_id, stage, name, params_json, started_at FROM runs WHERE kind = 'stage' "
                          f"AND flow_run_id = '{flow_run_id}' AND status = 'RUNNING'")
    for run_id, stage, name, params_json, started in stages:
        store.index_run(run_id, flow_run_id, stage, "FAILED", started, now, params_json, name=name)
        try:
            lineage.end_run(run_id, "KILLED")
        except MlflowException as exc:  # the store's row is what queries read; MLflow's status is a courtesy
            logger.warning("stage run %s of the resumed flow run: its MLflow run was not ended (%s)", run_id, exc)
    return [row[0] for row in stages]


def lock_run_dir(folder: Path) -> Any:
    """Hold the run folder's lock (``<folder>/.rlhf_run.lock``, an ``flock``) for this flow run: returns the lock
    (its ``release()`` removes the file; the kernel drops it when the process dies).

    Raises:
        ResumeError: a live process holds it (naming its PID, host and start time).
    """
    from rlhf_core.safe_load import CheckpointError
    from rlhf_core.trainer.checkpoint_lock import CheckpointDirLock

    os.makedirs(folder, exist_ok=True)
    lock = CheckpointDirLock(str(folder))
    try:
        lock.acquire()
    except CheckpointError as exc:
        raise ResumeError(f"run folder {folder} is in use by another flow run: {getattr(exc, 'holder', exc)} holds "
                          f"{lock.path}; wait for it to end (rlhf pipeline runs one flow run per run folder)") from None
    return lock
