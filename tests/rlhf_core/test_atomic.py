"""rlhf_core.atomic: a failure mid-write leaves the old file/folder intact and no temporary behind."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_core.atomic import atomic_directory, atomic_write, atomic_write_text
from rlhf_core.trainer.checkpoint_manager import TRACKER_FILE, write_tracker


def test_write_replaces_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "sub" / "f.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert os.listdir(target.parent) == ["f.txt"]
    # a normally created file: 0o666 minus the umask, not mkstemp's 0o600
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_failure_mid_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "table.parquet"
    with atomic_write(target) as fh:
        pq.write_table(pa.table({"x": [1, 2]}), fh)
    with pytest.raises(RuntimeError, match="disk gone"):
        with atomic_write(target) as fh:
            fh.write(b"PAR1 half a table")  # part of the new content is already in the temporary file
            raise RuntimeError("disk gone")
    assert pq.read_table(target).column("x").to_pylist() == [1, 2]
    assert os.listdir(tmp_path) == ["table.parquet"]


def test_killed_writer_never_exposes_a_partial_tracker(tmp_path):
    # a process killed (SIGKILL, no cleanup) while writing: the tracker still holds the previous step
    write_tracker(str(tmp_path), 3)
    code = textwrap.dedent(f"""
        import os, signal
        from rlhf_core.atomic import atomic_write
        with atomic_write({str(tmp_path / TRACKER_FILE)!r}, "w") as fh:
            fh.write("1")
            fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ}, timeout=60)
    assert proc.returncode == -9
    assert (tmp_path / TRACKER_FILE).read_text() == "3"
    write_tracker(str(tmp_path), 4)
    assert (tmp_path / TRACKER_FILE).read_text() == "4"


def test_directory_swap_and_failure(tmp_path):
    target = tmp_path / "model"
    with atomic_directory(target) as tmp:
        (open(os.path.join(tmp, "a.bin"), "wb")).close()
    with atomic_directory(target) as tmp:
        with open(os.path.join(tmp, "b.bin"), "wb") as fh:
            fh.write(b"new")
    assert os.listdir(target) == ["b.bin"]                # replaced as a whole, the old folder is gone
    with pytest.raises(OSError):
        with atomic_directory(target) as tmp:
            with open(os.path.join(tmp, "c.bin"), "wb") as fh:
                fh.write(b"half")
            raise OSError("save_pretrained failed")
    assert os.listdir(target) == ["b.bin"] and (target / "b.bin").read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["model"]


def test_bad_mode():
    with pytest.raises(ValueError, match="'a'"):
        with atomic_write("/tmp/never", "a"):
            pass
