"""A hostile environment: a full disk during a checkpoint write, an unreachable Ray cluster, an MLflow server that
is down, a results database that is locked or corrupt. Each names its cause; nothing already written is lost and
nothing half-written is left."""
from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from bad_input_fixtures import good_rows, listing, ppo_error, ppo_overrides, write_parquet


def _closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- full disk during a checkpoint write -----------------------------------------------------------------------
@pytest.fixture
def tmpfs(tmp_path):
    """``mount(size_bytes) -> folder``: a real tmpfs at ``tmp_path/disk`` of that size (again: resized in place);
    unmounted afterwards. Skips, saying why, where this process may not mount (it needs root)."""
    mnt = tmp_path / "disk"

    def mount(size: int):
        mounted = os.path.ismount(mnt)
        mnt.mkdir(exist_ok=True)
        opts = (["-o", f"remount,size={size}"] if mounted else ["-t", "tmpfs", "-o", f"size={size}", "tmpfs"])
        proc = subprocess.run(["mount", *opts, str(mnt)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
        return mnt

    yield mount
    if os.path.ismount(mnt):
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fit_one_more_half(mount, disk) -> tuple[int, int]:
    """Shrink the tmpfs ``disk`` (holding one checkpoint) to what it uses plus half of it: the next checkpoint,
    as big as the first, fills it half way through. Returns the bytes used and the bytes then free."""
    import shutil

    used = shutil.disk_usage(disk).used  # tmpfs counts whole 4 KiB pages: the first checkpoint, as stored
    mount(used + used // 2)
    return used, shutil.disk_usage(disk).free


def test_full_disk_during_checkpoint_write_keeps_the_last_one(tiny_model_dir, tmp_path, tmpfs):
    """A real full disk: the checkpoint folder is a tmpfs sized to the first checkpoint and a half. DCP reports the
    failed write as ``RuntimeError: ... unexpected pos`` (not ENOSPC); the save names the disk as full anyway."""
    from rlhf_core.config import load_config
    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.storage import StorageError
    from rlhf_core.trainer.checkpoint_manager import CheckpointManager, find_latest_checkpoint
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    cfg = load_config("ppo_trainer", ppo_overrides(tiny_model_dir, data))
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    wg.execute_all("init_model")
    root = tmpfs(64 << 20) / "ckpt"
    mgr = CheckpointManager(str(root))

    def save(step):
        return mgr.save(step, {"actor": lambda p: wg.execute_all("save_checkpoint", p, None, step)},
                        {"epoch": 0, "batches_done": step})

    save(1)
    before = {p: (root / p).stat().st_size for p in listing(root)}
    used, free = fit_one_more_half(tmpfs, root.parent)
    assert used // 2 <= free < used // 2 + 4096  # half a checkpoint is free (the size rounded up to a 4 KiB page)
    with pytest.raises(StorageError) as info:
        save(2)
    message = str(info.value)
    assert info.value.errno == errno.ENOSPC and "\n" not in message
    assert message.startswith(f"[Errno {errno.ENOSPC}] checkpoint {root}/global_step_2: writing 'actor' failed (No "
                              f"space left on device: ")
    free = int(message.split("No space left on device: ")[1].split(" ")[0])
    assert 0 <= free < 1 << 20  # the disk was full when the write failed
    assert message.endswith(f"bytes free on the disk of {root}/global_step_2/actor when the write failed); the "
                            f"partial checkpoint was removed, the last complete one is still {root}/global_step_1")
    assert {p: (root / p).stat().st_size for p in listing(root)} == before  # no global_step_2, no actor.tmp
    assert find_latest_checkpoint(str(root)) == str(root / "global_step_1")
    wg.execute_all("load_checkpoint", str(root / "global_step_1" / "actor"))  # still loadable


@pytest.mark.slow
def test_rlhf_ppo_on_a_disk_that_fills_during_a_checkpoint_stops_in_one_line(tiny_model_dir, tmp_path, tmpfs):
    """A real ``rlhf ppo`` saves step 1 on a tmpfs; the tmpfs is shrunk to that checkpoint and a half, and a
    resumed run (loading step 1) fills it while saving step 2: one line naming the step folder, the bytes free and
    step 1, exit 1, no traceback; no step 2 folder; the tracker and step 1's files unchanged."""
    import hashlib

    from bad_input_fixtures import rlhf_ppo

    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    ckpt = tmpfs(64 << 20) / "ckpt"
    first = rlhf_ppo(tiny_model_dir, data, ckpt, "trainer.total_training_steps=1", "trainer.save_freq=1")
    assert first.returncode == 0, first.stderr[-3000:]
    step1 = ckpt / "global_step_1"

    def digests():
        return {p: hashlib.sha256((step1 / p).read_bytes()).hexdigest() for p in listing(step1)
                if (step1 / p).is_file()}

    before = digests()
    used, free = fit_one_more_half(tmpfs, ckpt.parent)
    assert free < used  # the next checkpoint, as big as this one, cannot fit
    proc = rlhf_ppo(tiny_model_dir, data, ckpt, "trainer.total_training_steps=2", "trainer.save_freq=1",
                    "trainer.resume_mode=auto")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"resuming from {step1} (global step 1)" in proc.stderr  # step 1 loaded
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rlhf ppo: error:")]
    assert len(errors) == 1 and proc.stderr.endswith(errors[0] + "\n"), proc.stderr[-3000:]
    assert errors[0].startswith(f"rlhf ppo: error: [Errno {errno.ENOSPC}] checkpoint {ckpt}/global_step_2: writing "
                                f"'actor' failed (No space left on device: "), errors[0]
    assert errors[0].endswith(f" bytes free on the disk of {ckpt}/global_step_2/actor when the write failed); the "
                              f"partial checkpoint was removed, the last complete one is still {step1}"), errors[0]
    assert int(errors[0].split("No space left on device: ")[1].split(" ")[0]) < 1 << 20  # it was full
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("global_step")) == ["global_step_1"]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert digests() == before  # step 1, which the run loaded, is byte for byte what it was


# ---- unreachable Ray cluster -------------------------------------------------------------------------------------
def test_unreachable_ray_address_fails_fast_naming_it(tiny_model_dir, tmp_path):
    from rlhf_core.data import RemoteUnavailableError

    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    address = f"127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, f"ray_init.address={address}"), RemoteUnavailableError)
    assert time.monotonic() - start < 30  # ray.init itself would retry for minutes
    assert msg.startswith(f"ray_init.address={address!r} is unreachable (")
    assert "ray_init.address=null" in msg


def test_malformed_ray_address_is_named():
    from rlhf_core.distributed.ray_init import check_ray_address

    with pytest.raises(ValueError, match=r"ray_init.address='localhost': expected auto, host:port or ray://host:port"):
        check_ray_address("localhost")


# ---- MLflow server down ----------------------------------------------------------------------------------------
def test_mlflow_down_degrades_lineage_and_the_stage_still_records(tmp_path, monkeypatch, caplog):
    from infra import lineage
    from infra.results import ResultsStore
    from tasks.common import make_context, stage

    uri = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(lineage, "_PROBED", {})  # probe this URI afresh
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="infra.lineage"):
        with lineage.pipeline_run("exp", "flow-1", {"lr": 1e-3}) as parent:
            ctx = make_context(str(tmp_path), "exp", parent, "flow-1", str(tmp_path / "run"))
            with stage("ppo", {"trainer": {"total_epochs": 1}}, ctx) as rid:
                assert lineage.stage_env(rid) == {}  # the core is not pointed at a dead server
                ResultsStore(tmp_path).register_metrics([{"step": 1, "critic/score/mean": 0.5}], rid, "ppo")
                lineage.log_metrics(rid, {"x": 1.0})
                digest = lineage.log_dataset(rid, write_parquet(tmp_path / "d.parquet", good_rows(2)), "d", "training")
    assert time.monotonic() - start < 20  # one probe (3 s at most), then no MLflow call: no minutes of retries
    assert parent.startswith(lineage.OFFLINE_PREFIX) and rid.startswith(lineage.OFFLINE_PREFIX) and parent != rid
    assert len(digest) == 64  # the dataset's sha256 is still computed
    assert lineage.degraded().startswith(f"MLflow tracking server {uri} is unreachable (")
    warnings = [r.message for r in caplog.records if "lineage is degraded" in r.message]
    assert len(warnings) == 1 and uri in warnings[0]  # said once, naming the server
    _, rows = ResultsStore(tmp_path).sql(f"SELECT status FROM runs WHERE run_id = '{rid}'")
    assert rows == [("FINISHED",)]  # the DuckDB results are complete
    _, rows = ResultsStore(tmp_path).sql(f"SELECT value FROM metrics WHERE run_id = '{rid}'")
    assert rows == [(0.5,)]


# ---- DuckDB results database locked / corrupt --------------------------------------------------------------------
def test_duckdb_locked_by_another_process_names_it_and_loses_nothing(tmp_path):
    import duckdb

    from infra.results import ResultsStore

    store = ResultsStore(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True); "
         "time.sleep(120)", str(store.db_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        store.register_metrics([{"step": 1, "loss": 0.25}], "run1", "ppo")  # parquet: no database lock needed
        with pytest.raises(duckdb.IOException) as info:
            store.sql("SELECT count(*) FROM metrics")
        assert f'Could not set lock on file "{store.db_path}"' in str(info.value)
        assert f"(PID {holder.pid})" in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    _, rows = ResultsStore(tmp_path).sql("SELECT step, key, value FROM metrics")
    assert rows == [(1, "loss", 0.25)]  # nothing written during the lock was lost


def test_duckdb_corrupt_file_is_moved_aside_and_rebuilt(tmp_path, caplog):
    from infra.results import ResultsStore

    store = ResultsStore(tmp_path)
    store.register_metrics([{"step": 2, "loss": 0.5}], "run1", "ppo")
    store.db_path.write_bytes(b"not a database" * 100)
    with caplog.at_level(logging.WARNING, logger="infra.results"):
        _, rows = ResultsStore(tmp_path).sql("SELECT step, key, value FROM metrics")
    assert rows == [(2, "loss", 0.5)]  # the views are rebuilt over the parquet files
    aside = [p for p in os.listdir(tmp_path) if p.startswith("results.duckdb.corrupt-")]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_bytes() == b"not a database" * 100
    assert f"{store.db_path} is not a valid DuckDB database" in caplog.text and aside[0] in caplog.text
