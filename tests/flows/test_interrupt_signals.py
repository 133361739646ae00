"""flows.interrupt without Prefect: the server's Popen shim, SIGTERM/SIGHUP read as Ctrl-C, the bounded Crashed mark.
(The whole Ctrl-C path, with a real server and flow, is tests/flows/test_pipeline_interrupt.py, slow.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from flows import interrupt


def test_the_shim_starts_the_server_process_in_its_own_session_and_leaves_subprocess_alone():
    proc = interrupt._SessionSubprocess().Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # a new session: its id is the child's own pid (the terminal's Ctrl-C goes to this process's group only)
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
    finally:
        proc.kill()
        proc.wait()
    assert interrupt._SessionSubprocess().PIPE is subprocess.PIPE  # every other name is the real module's
    assert subprocess.Popen is not interrupt._SessionSubprocess.Popen  # the real module is untouched


def test_the_server_process_ends_when_its_parent_is_killed_with_sigkill(tmp_path):
    # `kill -9` of `rlhf pipeline`: before, its Prefect server (own session, out of reach of the group's signals)
    # ran on, listening, until killed by hand. A parent starts a child through the shim, then gets SIGKILL.
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from flows import interrupt; "
        "p = interrupt._SessionSubprocess().Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        try:  # reaped by init soon after it ends: a zombie counts as gone
            with open(f"/proc/{child}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its SIGKILLed parent by 30 s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_raise_keyboard_interrupt_in_the_main_thread(sig):
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        interrupt.interrupt_on_termination()
        with pytest.raises(KeyboardInterrupt, match=signal.Signals(sig).name):
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler runs at the next bytecode boundary
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_a_hung_server_delays_the_message_by_the_timeout_only(monkeypatch):
    monkeypatch.setattr(interrupt, "_mark_crashed", lambda _id: time.sleep(60) or "Crashed")
    t0 = time.monotonic()
    text = interrupt._crashed_within({"id": "f1", "name": "run-a"}, 0.5)
    assert time.monotonic() - t0 < 5
    assert text == "flow run 'run-a' (f1) its state was not recorded (no answer from the server in 0.5 s)"
    monkeypatch.setattr(interrupt, "_mark_crashed", lambda _id: "Crashed")
    assert interrupt._crashed_within({"id": "f1", "name": "run-a"}, 5) == "flow run 'run-a' (f1) is Crashed"


def test_the_interrupt_line_says_how_to_continue_a_started_flow_run():
    # a new user's Ctrl-C of `rlhf pipeline` named the Crashed flow run but not how to go on (`rlhf ppo`'s line does)
    crashed = "flow run 'piquant-rooster' (d0b81cb7) is Crashed"
    assert interrupt.interrupt_line("rlhf pipeline", crashed) == (
        "rlhf pipeline: interrupted; flow run 'piquant-rooster' (d0b81cb7) is Crashed; stopping Ray and the temporary "
        "Prefect server; to continue it, run the same command with --resume")
    # nothing to continue before the flow run exists
    assert interrupt.interrupt_line("rlhf pipeline", None) == (
        "rlhf pipeline: interrupted; before the flow run started; stopping Ray and the temporary Prefect server")
