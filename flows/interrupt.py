"""Ctrl-C during ``rlhf pipeline``: stop in seconds, with the flow run marked Crashed and nothing left running.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group. Before this module, that group held
Prefect's temporary API server, which died at once, and Prefect's engine, on the KeyboardInterrupt, first waited
for the running stage to end (its task runner's exit joins the thread), then retried every state report against
the dead server for minutes, printing tracebacks, and the flow run stayed "Running". Here:

* :func:`start_server` starts Prefect's temporary server in its own session, out of the terminal's process
  group, so it outlives the Ctrl-C long enough to record the Crashed state.
* :func:`result_of` waits for a task in slices of :data:`POLL_S` seconds, so the interrupt is seen in the flow
  within that time whichever thread the signal was delivered to.
* the flow (``flows.rlhf.rlhf``) records its own outcome (DuckDB row, MLflow parent run: FAILED) as the
  KeyboardInterrupt passes, then calls :func:`stop`: the flow run is marked Crashed, the embedded Ray instance
  (whose workers run the stage) and the server are stopped, one line is printed, and the process ends with exit
  code 130 (``rlhf_core.cli.INTERRUPTED``) without waiting for the stage's thread.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
from typing import Any

POLL_S = 0.5
"""Seconds between two looks at a task's future (the longest a Ctrl-C waits to be seen)."""

_flow_run: dict[str, str] = {}  # the flow run of this process (its id and name), for the message


def start_server() -> Any:
    """Start Prefect's temporary API server (``SubprocessASGIServer``, the instance Prefect's client uses) with
    its process in a new session (``start_new_session``): SIGINT sent to the terminal's process group does not
    reach it. Returns the server. Raises what ``SubprocessASGIServer.start`` raises (RuntimeError)."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    popen = subprocess.Popen

    def run_uvicorn(original: Any = server._run_uvicorn_command) -> Any:
        subprocess.Popen = functools.partial(popen, start_new_session=True)  # type: ignore[misc]
        try:
            return original()
        finally:
            subprocess.Popen = popen  # type: ignore[misc]

    server._run_uvicorn_command = run_uvicorn
    server.start()
    return server


def note_flow_run(flow_run_id: str, name: str | None) -> None:
    """Remember the flow run this process runs (called at the start of the flow)."""
    _flow_run.update(id=flow_run_id, name=name or flow_run_id)


def result_of(future: Any) -> Any:
    """``future.result()`` of a Prefect task future, waiting in :data:`POLL_S` slices so that a Ctrl-C is raised
    here (KeyboardInterrupt) within that time instead of when the task ends."""
    while not concurrent.futures.wait([future.wrapped_future], timeout=POLL_S).done:
        pass
    return future.result()


def _mark_crashed(flow_run_id: str) -> str:
    """Record the flow run Crashed (as Prefect's engine does for an interrupt) and return the state read back."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Crashed(message="Execution was aborted by an interrupt signal "
                                                               "(Ctrl-C)."), force=True)
        state = client.read_flow_run(flow_run_id).state
    return state.name if state is not None else "unknown"


def _stop_children() -> None:
    """Kill every process this one started, recursively (Ray's embedded services, agents and workers, Prefect's
    server in its own session): each is suspended first, until a look at the tree finds none new, so that none
    forks a process that would outlive it (the raylet starts workers at any time), then all are killed. Not
    ``ray.shutdown()``: the stage's thread is inside a Ray call, and the core worker ends the process when it is
    touched after a shutdown. A Ray cluster this process only joined is not a child: it is left alone."""
    import psutil

    me, seen = psutil.Process(), {}
    while new := [p for p in me.children(recursive=True) if p.pid not in seen]:
        for proc in new:
            seen[proc.pid] = proc
            with contextlib.suppress(psutil.Error):
                proc.suspend()
    for proc in seen.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(list(seen.values()), timeout=5)


def stop(prog: str = "rlhf pipeline") -> None:
    """After a Ctrl-C in the flow (the record of the flow's own outcome already written by the caller): a second
    Ctrl-C is ignored; the flow run is marked Crashed; one line is printed; every child process (Ray's embedded
    instance, Prefect's temporary server) is stopped and the process ends with exit code 130 (``os._exit``: the
    stage's thread is not waited for; Prefect's engine would wait for it before reporting). Never returns."""
    from rlhf_core.cli import INTERRUPTED

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.disable(logging.CRITICAL)  # the stage's thread fails as Ray stops: no tracebacks from it
    what = "before the flow run started"
    try:
        if _flow_run:
            what = f"flow run '{_flow_run['name']}' ({_flow_run['id']}) is {_mark_crashed(_flow_run['id'])}"
    except Exception as exc:  # noqa: BLE001 - the message must come out whatever the server does
        what = f"flow run '{_flow_run['name']}' ({_flow_run['id']}): its state was not recorded ({type(exc).__name__})"
    # first (Ray's core worker may end this process as soon as its raylet goes), and to file descriptor 2 itself:
    # inside the flow, print and sys.stderr may be Prefect's or Ray's (logging is off by now)
    sys.stdout.flush()
    os.write(2, f"{prog}: interrupted; {what}; stopping Ray and the temporary Prefect server\n".encode())
    try:
        _stop_children()
    finally:
        os._exit(INTERRUPTED)
