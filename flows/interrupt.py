"""Ctrl-C during ``rlhf pipeline``: stop in seconds, with the flow run marked Crashed and nothing left running.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group. Before this module, that group held
Prefect's temporary API server, which died at once, and Prefect's engine, on the KeyboardInterrupt, first waited
for the running stage to end (its task runner's exit joins the thread), then retried every state report against
the dead server for minutes, printing tracebacks, and the flow run stayed "Running". Here:

* :func:`start_server` starts Prefect's temporary server in its own session, out of the terminal's process
  group, so it outlives the Ctrl-C long enough to record the Crashed state; SIGTERM and SIGHUP, which no longer
  reach it, are then read as a Ctrl-C (:func:`interrupt_on_termination`).
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
import logging
import os
import signal
import subprocess
import sys
from typing import Any

POLL_S = 0.5
"""Seconds between two looks at a task's future (the longest a Ctrl-C waits to be seen)."""

_flow_run: dict[str, str] = {}  # the flow run of this process (its id and name), for the message


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to send it SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), so a
    ``kill -9`` of ``rlhf pipeline`` does not leave its Prefect server running. Best effort: a no-op elsewhere."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def session_popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` in a new session; from the main thread of a Linux process, the child also gets SIGTERM
    when this process dies, SIGKILL included (:func:`_die_with_parent`; the death signal follows the thread that
    started the child, hence the main thread only, which lives as long as the process)."""
    import threading

    if sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread():
        kwargs.setdefault("preexec_fn", _die_with_parent)
    return subprocess.Popen(*args, start_new_session=True, **kwargs)


class _SessionSubprocess:
    """``subprocess`` as Prefect's server module sees it while its server starts: ``Popen`` is
    :func:`session_popen`; every other name is the real module's. Only that module's global is swapped (other
    threads' ``subprocess.Popen`` is untouched)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    Popen = staticmethod(session_popen)


def start_server() -> Any:
    """Start Prefect's temporary API server (``SubprocessASGIServer``, the instance Prefect's client uses) with
    its process in a new session (``start_new_session``): SIGINT sent to the terminal's process group does not
    reach it; SIGTERM and SIGHUP of this process are then read as a Ctrl-C (:func:`interrupt_on_termination`), so
    the server is stopped by :func:`stop` then too. Returns the server. Raises what ``SubprocessASGIServer.start``
    raises (RuntimeError)."""
    from prefect.server.api import server as server_module

    server = server_module.SubprocessASGIServer()
    server_module.subprocess = _SessionSubprocess()  # type: ignore[assignment]
    try:
        server.start()
    finally:
        server_module.subprocess = subprocess
    interrupt_on_termination()
    return server


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def interrupt_on_termination() -> None:
    """SIGTERM (``kill``, a scheduler's stop) and SIGHUP (the terminal closed) raise KeyboardInterrupt in the main
    thread, as Ctrl-C does, so the flow records its outcome and :func:`stop` stops the server started in its own
    session (which those signals no longer reach). A no-op outside the main thread. SIGKILL cannot be caught:
    after ``kill -9`` the server gets SIGTERM from the kernel instead (:func:`session_popen`)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)


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


MARK_TIMEOUT_S = 10.0
"""Seconds :func:`stop` waits for the server to record the Crashed state (a hung server must not keep the user
waiting: a second Ctrl-C is ignored by then)."""


def _crashed_within(flow_run: dict[str, str], timeout_s: float) -> str:
    """The message part naming ``flow_run`` and its recorded state, :func:`_mark_crashed` given ``timeout_s``
    seconds on a daemon thread (Prefect's client retries a dead server for minutes)."""
    import threading

    out: list[str] = []

    def mark() -> None:
        try:
            out.append(f"is {_mark_crashed(flow_run['id'])}")
        except Exception as exc:  # noqa: BLE001 - the message must come out whatever the server does
            out.append(f"its state was not recorded ({type(exc).__name__})")

    thread = threading.Thread(target=mark, daemon=True)
    thread.start()
    thread.join(timeout_s)
    state = out[0] if out else f"its state was not recorded (no answer from the server in {timeout_s:g} s)"
    return f"flow run '{flow_run['name']}' ({flow_run['id']}) {state}"


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


def interrupt_line(prog: str, crashed: str | None) -> str:
    """The one line a Ctrl-C of the pipeline prints: ``crashed`` is :func:`_crashed_within`'s part naming the flow
    run and its state (None: the flow run had not started), with how to continue it (``--resume``, flows/resume.py),
    as ``rlhf ppo``'s line names its checkpoint and how to resume."""
    if crashed is None:
        return f"{prog}: interrupted; before the flow run started; stopping Ray and the temporary Prefect server"
    return (f"{prog}: interrupted; {crashed}; stopping Ray and the temporary Prefect server; to continue it, run the "
            f"same command with --resume")


def stop(prog: str = "rlhf pipeline") -> None:
    """After a Ctrl-C in the flow (the record of the flow's own outcome already written by the caller): a second
    Ctrl-C is ignored; the flow run is marked Crashed; one line is printed; every child process (Ray's embedded
    instance, Prefect's temporary server) is stopped and the process ends with exit code 130 (``os._exit``: the
    stage's thread is not waited for; Prefect's engine would wait for it before reporting). Never returns."""
    from rlhf_core.cli import INTERRUPTED

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.disable(logging.CRITICAL)  # the stage's thread fails as Ray stops: no tracebacks from it
    what = _crashed_within(_flow_run, MARK_TIMEOUT_S) if _flow_run else None
    # first (Ray's core worker may end this process as soon as its raylet goes), and to file descriptor 2 itself:
    # inside the flow, print and sys.stderr may be Prefect's or Ray's (logging is off by now)
    sys.stdout.flush()
    os.write(2, (interrupt_line(prog, what) + "\n").encode())
    try:
        _stop_children()
    finally:
        os._exit(INTERRUPTED)
