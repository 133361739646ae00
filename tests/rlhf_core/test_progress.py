"""The progress-bar rule: bars on a terminal, quiet under CI=true or when the stream is not a TTY."""
from __future__ import annotations

import fcntl
import io
import os
import struct
import termios

import pytest

from rlhf_core.progress import bars_enabled, progress


@pytest.fixture
def pty_stream():
    """A text stream on the slave side of a pseudo-terminal (a real TTY) and the master fd to read what it got."""
    master, slave = os.openpty()
    # a fresh pty is 0x0; a terminal window is not (tqdm sizes the bar to the width, and width 0 draws nothing)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    stream = os.fdopen(slave, "w", buffering=1, encoding="utf-8")
    try:
        yield stream, master
    finally:
        stream.close()
        os.close(master)


def _read_all(master: int) -> str:
    os.set_blocking(master, False)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except BlockingIOError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes", "Yes"])
def test_disabled_under_ci_even_on_a_tty(monkeypatch, pty_stream, value):
    stream, master = pty_stream
    monkeypatch.setenv("CI", value)
    assert stream.isatty()
    assert not bars_enabled(stream)
    assert list(progress(range(5), "quiet", stream=stream)) == [0, 1, 2, 3, 4]
    stream.flush()
    assert _read_all(master) == ""  # nothing reached the terminal


@pytest.mark.parametrize("value", ["false", "0", "no", ""])
def test_falsy_ci_leaves_a_tty_enabled(monkeypatch, pty_stream, value):
    stream, _ = pty_stream
    monkeypatch.setenv("CI", value)
    assert bars_enabled(stream)


def test_disabled_on_a_non_tty(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    buf = io.StringIO()  # isatty() is False, as for a pipe or a log file
    assert not bars_enabled(buf)
    assert list(progress(["a", "b"], "piped", stream=buf)) == ["a", "b"]
    assert buf.getvalue() == ""


def test_enabled_on_a_tty_writes_desc_and_count(monkeypatch, pty_stream):
    stream, master = pty_stream
    monkeypatch.delenv("CI", raising=False)
    items = [{"row": i} for i in range(7)]
    out = list(progress(iter(items), "scoring responses", total=7, unit="prompt", stream=stream))
    assert out == items  # same objects, same order
    assert all(a is b for a, b in zip(out, items))
    stream.flush()
    text = _read_all(master)
    assert "scoring responses" in text
    assert "7/7" in text  # the final refresh on close shows n/total


def test_total_defaults_to_len_and_break_closes_the_bar(monkeypatch, pty_stream):
    stream, master = pty_stream
    monkeypatch.delenv("CI", raising=False)
    gen = progress([10, 20, 30, 40], "SFT epoch 1/1", unit="step", stream=stream)
    seen = []
    for x in gen:
        seen.append(x)
        if x == 20:
            break
    gen.close()  # what a for-loop's garbage collection does; runs the finally that closes the bar
    assert seen == [10, 20]
    stream.flush()
    text = _read_all(master)
    assert "SFT epoch 1/1" in text
    # total from len() of the list. tqdm counts an item done when the loop asks for the next one: the break at 20
    # (as in the SFT loop, which breaks before working on the batch) leaves 1 of 4 done, never 2/4.
    assert "1/4" in text and "2/4" not in text
    assert text.endswith("\r\n")  # close() ended the bar's line


def test_leave_false_erases_the_bar(monkeypatch, pty_stream):
    stream, master = pty_stream
    monkeypatch.delenv("CI", raising=False)
    assert list(progress([1, 2, 3], "rollout", unit="micro-batch", stream=stream, leave=False)) == [1, 2, 3]
    stream.flush()
    text = _read_all(master)
    assert "rollout" in text  # drawn while running
    assert not text.endswith("\r\n")  # ... and cleared on close instead of ending its line (the default leave=True)
