"""copy_to_local: local passthrough, memory:// and http caches, re-copy on change, one copy for two processes."""
from __future__ import annotations

import http.server
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import fsspec
import pytest

from rlhf_core.data.fs import copy_to_local


def test_local_paths_are_returned_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert copy_to_local("/some/where/x.parquet") == "/some/where/x.parquet"
    assert copy_to_local("~/x.parquet") == str(tmp_path / "x.parquet")
    assert copy_to_local("file:///abs/y.jsonl") == "/abs/y.jsonl"


def test_memory_file_copied_once_and_recopied_when_changed(tmp_path):
    mem = fsspec.filesystem("memory")
    mem.pipe("/dp_fs/a.txt", b"first")
    cache = str(tmp_path / "cache")
    path = copy_to_local("memory://dp_fs/a.txt", cache_dir=cache)
    assert Path(path).read_bytes() == b"first"
    assert Path(path).name == "a.txt" and path.startswith(cache)
    inode = os.stat(path).st_ino
    # unchanged source: the same file, not rewritten (a rewrite goes through a new temp file => new inode)
    assert copy_to_local("memory://dp_fs/a.txt", cache_dir=cache) == path
    assert os.stat(path).st_ino == inode
    mem.pipe("/dp_fs/a.txt", b"second, longer")  # size changes => fingerprint changes
    assert copy_to_local("memory://dp_fs/a.txt", cache_dir=cache) == path
    assert Path(path).read_bytes() == b"second, longer"
    leftovers = [p for p in os.listdir(os.path.dirname(path)) if p.startswith(".tmp")]
    assert leftovers == []


def test_memory_directory_is_copied_whole(tmp_path):
    mem = fsspec.filesystem("memory")
    mem.pipe("/dp_dir/d/x.txt", b"x")
    mem.pipe("/dp_dir/d/sub/y.txt", b"yy")
    path = copy_to_local("memory://dp_dir/d", cache_dir=str(tmp_path))
    assert Path(path, "x.txt").read_bytes() == b"x"
    assert Path(path, "sub", "y.txt").read_bytes() == b"yy"
    mem.pipe("/dp_dir/d/x.txt", b"xxx")
    assert Path(copy_to_local("memory://dp_dir/d", cache_dir=str(tmp_path)), "x.txt").read_bytes() == b"xxx"


def test_missing_remote_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        copy_to_local("memory://dp_fs/does-not-exist.txt", cache_dir=str(tmp_path))


class _Server:
    """A real http.server on 127.0.0.1 in a thread, counting GET requests; each GET is slowed by 0.2 s."""

    def __init__(self, root: Path) -> None:
        counts = {"GET": 0}

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(root), **kw)

            def do_GET(self):  # noqa: N802
                counts["GET"] += 1
                time.sleep(0.2)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.counts = counts
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def http_server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    server = _Server(root)
    yield root, server
    server.close()


def test_http_file_cached_and_recopied_on_change(http_server, tmp_path):
    root, server = http_server
    (root / "data.jsonl").write_text('{"a": 1}\n')
    url = f"{server.url}/data.jsonl"
    path = copy_to_local(url, cache_dir=str(tmp_path / "c"))
    assert Path(path).read_text() == '{"a": 1}\n'
    gets = server.counts["GET"]
    assert copy_to_local(url, cache_dir=str(tmp_path / "c")) == path
    assert server.counts["GET"] == gets  # second call: only a HEAD for the fingerprint, no download
    (root / "data.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    assert Path(copy_to_local(url, cache_dir=str(tmp_path / "c"))).read_text() == '{"a": 1}\n{"a": 2}\n'


def _copy_in_child(url: str, cache: str, barrier, results) -> None:
    barrier.wait()
    results.put(copy_to_local(url, cache_dir=cache))


def test_two_processes_copy_the_same_url_once(http_server, tmp_path):
    root, server = http_server
    payload = os.urandom(200_000)
    (root / "big.bin").write_bytes(payload)
    url = f"{server.url}/big.bin"
    # GETs one copy needs (measured in a separate cache), so the concurrent case can be compared to it.
    copy_to_local(url, cache_dir=str(tmp_path / "solo"))
    gets_per_copy = server.counts["GET"]
    assert gets_per_copy >= 1
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    cache = str(tmp_path / "shared")
    procs = [ctx.Process(target=_copy_in_child, args=(url, cache, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    paths = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert paths[0] == paths[1]
    assert Path(paths[0]).read_bytes() == payload
    # the lock made the second process find the first one's copy: the body was downloaded once in all
    assert server.counts["GET"] == 2 * gets_per_copy
    assert [n for n in os.listdir(os.path.dirname(paths[0])) if n.startswith(".tmp")] == []


def test_check_local_files_names_the_key_and_the_missing_file(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from rlhf_core.data.fs import check_local_files

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "a.parquet").write_bytes(b"x")
    ok = OmegaConf.create({"data": {"train_files": ["~/a.parquet", f"file://{tmp_path}/a.parquet"],
                                    "val_files": None, "path": "s3://bucket/never-looked-up.parquet"}})
    check_local_files(ok, ("data.train_files", "data.val_files", "data.path"))  # ~ and file:// exist; URL skipped
    bad = OmegaConf.create({"data": {"train_files": "~/a.parquet", "val_files": ["~/a.parquet", "~/typo.parquet"]}})
    with pytest.raises(FileNotFoundError, match=r"^data.val_files: data file ~/typo.parquet does not exist$"):
        check_local_files(bad, ("data.train_files", "data.val_files"))
