"""A resume never loses checkpoints; a checkpoint folder has one writer; a missing shard is refused early (issue 32).

* The issue's scenario, through the PPO driver (fake in-process worker groups, ``tests/rlhf_core/trainer/test_trainer_ppo``):
  steps 2 and 4 intact, the tracker says 6, ``global_step_6`` gone: ``resume_mode=auto`` resumes from 4 with a
  warning naming both, and after the run's next saves steps 2 and 4 are still there.
* A complete step the tracker does not name is moved aside by a save of the same step, never deleted.
* The tracker deleted: ``auto`` resumes from the newest complete step, with a warning naming the missing tracker.
* A damaged step the tracker named (resumed from before it) is moved aside whole when the retrain saves that step.
* Real sharded checkpoints (``FSDPCheckpointManager``, DCP): a missing or truncated shard, with or without the
  manifest, makes ``resume_path`` fail on the driver, before the worker factory is called, naming the file; with
  ``auto`` and nothing complete before it, the error names the tracker's step and the file.
* Two real processes: one holds ``default_local_dir`` through :class:`CheckpointDirLock`; a run on the same folder
  fails before its workers start, naming the holder's PID and host. Once the holder is SIGKILLed, the next run
  takes the lock over with a notice naming the dead PID.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch


from tests.rlhf_core.trainer.test_trainer_ppo import (  # noqa: E402
    DecodeTok, FakeActor, FakeGroup, make_config, make_dataset, reward_fn)

from rlhf_core.safe_load import CheckpointError  # noqa: E402
from rlhf_core.trainer.checkpoint_lock import LOCK_FILE  # noqa: E402
from rlhf_core.trainer.checkpoint_manager import CheckpointManager, write_tracker  # noqa: E402
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer  # noqa: E402
from rlhf_core.workers.checkpoint import FSDPCheckpointManager  # noqa: E402


def _trainer(cfg, started: list):
    """A PPO driver whose worker factory records that it ran (i.e. that workers were started)."""
    actor = FakeActor([])

    def factory(config):
        started.append(True)
        return {"actor_rollout": FakeGroup(actor)}

    return RayPPOTrainer(cfg, DecodeTok(), factory, reward_fn, reward_fn, make_dataset(), make_dataset(4))


def _fit(cfg) -> RayPPOTrainer:
    trainer = _trainer(cfg, [])
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return trainer


def _steps(root) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith("global_step_"))


def test_a_tracker_naming_a_missing_step_resumes_from_the_newest_complete_one(tmp_path, caplog):
    # 8 samples / batch 2 = 4 steps per epoch; save_freq 2: steps 2 and 4 are written
    _fit(make_config(tmp_path, total_training_steps=4, save_freq=2, test_freq=-1))
    root = tmp_path / "ckpt"
    assert _steps(root) == ["global_step_2", "global_step_4"]
    for step in (2, 4):  # a file of the user's in each intact step: a step folder removed and rewritten loses it
        (root / f"global_step_{step}" / "NOTE").write_text("mine")
    write_tracker(str(root), 6)  # the tracker says 6, whose folder is gone (the scenario)
    with caplog.at_level(logging.WARNING, logger="rlhf_core.trainer.checkpoint_manager"):
        resumed = _fit(make_config(tmp_path, total_training_steps=7, save_freq=2, test_freq=-1))
    assert "names global step 6, which is not a complete checkpoint" in caplog.text
    assert f"resuming from {root / 'global_step_4'}" in caplog.text
    # it resumed at 4 (a run from scratch would have rewritten steps 2 and 4): trained 5..7, saved 6 and 7 (last)
    assert resumed.global_steps == 7
    assert _steps(root) == ["global_step_2", "global_step_4", "global_step_6", "global_step_7"]
    assert all((root / f"global_step_{s}" / "NOTE").read_text() == "mine" for s in (2, 4))
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "7"


def _writer(text):
    """A component save function that writes ``text`` to ``<folder>/w.bin``."""
    def save(path):
        os.makedirs(path)
        Path(path, "w.bin").write_text(text)
    return save


def test_a_complete_untracked_step_is_moved_aside_never_deleted(tmp_path, caplog):
    root = tmp_path / "ckpt"
    mgr = CheckpointManager(str(root))

    for step in (2, 4, 6):
        mgr.save(step, {"actor": _writer(f"first run, step {step}")}, {"epoch": 0})
    write_tracker(str(root), 4)  # a run resumed from 4 (trainer.resume_from_path) writes step 6 again
    with caplog.at_level(logging.WARNING, logger="rlhf_core.trainer.checkpoint_manager"):
        mgr.save(6, {"actor": _writer("second run, step 6")}, {"epoch": 0})
    kept = [n for n in os.listdir(root) if n.startswith("global_step_6.kept-")]
    assert len(kept) == 1 and f"moved it to {root / kept[0]}" in caplog.text
    assert "holds a complete checkpoint;" in caplog.text  # its manifest lists every file, all present
    assert (root / kept[0] / "actor" / "w.bin").read_text() == "first run, step 6"
    assert (root / "global_step_6" / "actor" / "w.bin").read_text() == "second run, step 6"


def test_a_save_killed_before_its_manifest_is_moved_aside_and_not_called_complete(tmp_path, caplog):
    """kill -9 after the actor folder was written but before data.pt and the manifest: without a manifest only the
    component folders can be checked, so the warning says what was found (not 'a complete checkpoint')."""
    from rlhf_core.trainer.checkpoint_integrity import MANIFEST

    root = tmp_path / "ckpt"
    mgr = CheckpointManager(str(root))

    for step in (2, 4):
        mgr.save(step, {"actor": _writer(f"first run, step {step}")}, {"epoch": 0})
    mgr.save(6, {"actor": _writer("killed save, step 6")}, {"epoch": 0})
    os.remove(root / "global_step_6" / MANIFEST)  # what the kill left: the actor folder only
    os.remove(root / "global_step_6" / "data.pt")
    write_tracker(str(root), 4)
    with caplog.at_level(logging.WARNING, logger="rlhf_core.trainer.checkpoint_manager"):
        mgr.save(6, {"actor": _writer("resumed run, step 6")}, {"epoch": 0})
    kept = [n for n in os.listdir(root) if n.startswith("global_step_6.kept-")]
    assert len(kept) == 1 and (root / kept[0] / "actor" / "w.bin").read_text() == "killed save, step 6"
    assert "holds complete actor folder(s) without a manifest (a save killed before it finished" in caplog.text
    assert "holds a complete checkpoint" not in caplog.text
    assert (root / "global_step_6" / "actor" / "w.bin").read_text() == "resumed run, step 6"


def _sharded_step(root: Path, step: int, manifest: bool) -> Path:
    """A real ``global_step_<step>/actor`` (DCP model + optimizer + extra state) written by one rank."""
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    worker = FSDPCheckpointManager(model, opt, None, None, None, ("model", "optimizer", "extra"))
    if manifest:
        CheckpointManager(str(root)).save(step, {"actor": worker.save}, {"epoch": 0})
    else:  # a checkpoint written before manifests existed
        worker.save(str(root / f"global_step_{step}" / "actor"))
        write_tracker(str(root), step)
    return root / f"global_step_{step}"


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "older-checkpoint"])
@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_damaged_shard_is_refused_before_the_workers_start(tmp_path, manifest, damage):
    root = tmp_path / "ckpt"
    step = _sharded_step(root, 3, manifest)
    shard = step / "actor" / "optim" / "__0_0.distcp"
    if damage == "missing":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:100])
    started: list = []
    cfg = make_config(tmp_path, resume_mode="resume_path", resume_from_path=str(step))
    trainer = _trainer(cfg, started)
    with pytest.raises(CheckpointError) as err:
        trainer.fit()
    trainer.shutdown()
    assert "is not a complete checkpoint" in str(err.value) and str(shard) in str(err.value)
    assert ("(missing)" if damage == "missing" else "(100 bytes,") in str(err.value)
    assert started == []  # no worker group was built
    # auto, with nothing complete before the tracker's step: stops naming both, deletes nothing
    started.clear()
    trainer = _trainer(make_config(tmp_path, resume_mode="auto"), started)
    with pytest.raises(CheckpointError) as err:
        trainer.fit()
    trainer.shutdown()
    assert "names global step 3, which is not a complete checkpoint" in str(err.value)
    assert str(shard) in str(err.value) and "nothing was deleted" in str(err.value)
    assert started == [] and (step / "actor" / "model").is_dir()


def test_an_intact_sharded_step_resumes_with_and_without_manifest(tmp_path):
    for manifest in (True, False):
        root = tmp_path / str(manifest)
        step = _sharded_step(root, 3, manifest)
        assert CheckpointManager(str(root)).resolve_resume("auto") == str(step)
        assert (step / "checkpoint_manifest.json").exists() == manifest


def test_a_deleted_tracker_resumes_from_the_newest_complete_step(tmp_path, caplog):
    # steps 2 and 4 written, then the tracker is deleted: auto resumes from 4 (the newest complete), never from scratch
    _fit(make_config(tmp_path, total_training_steps=4, save_freq=2, test_freq=-1))
    root = tmp_path / "ckpt"
    for step in (2, 4):  # a step folder rewritten by a fresh start would lose this file
        (root / f"global_step_{step}" / "NOTE").write_text("mine")
    (root / "latest_checkpointed_iteration.txt").unlink()
    with caplog.at_level(logging.WARNING, logger="rlhf_core.trainer.checkpoint_manager"):
        resumed = _fit(make_config(tmp_path, total_training_steps=5, save_freq=2, test_freq=-1))
    assert (f"{root / 'latest_checkpointed_iteration.txt'} is missing, but {root} holds global_step_* folders: "
            f"resuming from {root / 'global_step_4'}, the newest complete one") in caplog.text
    assert resumed.global_steps == 5
    assert os.listdir(root / "global_step_4") and _steps(root) == ["global_step_2", "global_step_4", "global_step_5"]
    assert all((root / f"global_step_{s}" / "NOTE").read_text() == "mine" for s in (2, 4))  # none rewritten/moved
    # a damaged newest step is skipped; a folder without a manifest (a killed first save's) is none: a fresh start
    (root / "global_step_5" / "actor" / "state.json").unlink()
    (root / "latest_checkpointed_iteration.txt").unlink()
    assert CheckpointManager(str(root)).resolve_resume("auto") == str(root / "global_step_4")
    bare = tmp_path / "bare"
    (bare / "global_step_1" / "actor").mkdir(parents=True)
    assert CheckpointManager(str(bare)).resolve_resume("auto") is None


@pytest.mark.parametrize("next_save", [4, 3], ids=["tracker-still-names-it", "after-an-earlier-save"])
def test_a_damaged_tracked_step_is_moved_aside_when_its_step_is_saved_again(tmp_path, caplog, next_save):
    root = tmp_path / "ckpt"
    mgr = CheckpointManager(str(root))
    for step in (2, 4):
        mgr.save(step, {"actor": _writer(f"first run, step {step}")}, {"epoch": 0})
    (root / "global_step_4" / "NOTE").write_text("mine")
    (root / "global_step_4" / "actor" / "w.bin").unlink()  # the tracker's step 4 loses a file: damaged
    damaged = root / "global_step_4"
    with caplog.at_level(logging.WARNING, logger="rlhf_core.trainer.checkpoint_manager"):
        assert mgr.resolve_resume("auto", components=("actor",)) == str(root / "global_step_2")
    assert (f"resuming from {root / 'global_step_2'}, the newest complete one before it; {damaged} stays as it is "
            f"until this run saves step 4, which first moves it to {damaged}.kept-<time>") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlhf_core.trainer.checkpoint_manager"):
        for step in range(next_save, 5):  # the retrain saves 4 (save_freq 2) or 3 and then 4 (save_freq 1)
            mgr.save(step, {"actor": _writer(f"second run, step {step}")}, {"epoch": 0})
    kept = [n for n in os.listdir(root) if n.startswith("global_step_4.kept-")]
    assert len(kept) == 1 and f"{damaged} holds a damaged checkpoint" in caplog.text
    assert f"moved it to {root / kept[0]}" in caplog.text
    assert (root / kept[0] / "NOTE").read_text() == "mine"  # the damaged folder is whole, not overwritten
    assert (damaged / "actor" / "w.bin").read_text() == "second run, step 4" and not (damaged / "NOTE").exists()
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "4"


_HOLDER = """
import sys
from rlhf_core.trainer.checkpoint_lock import CheckpointDirLock
lock = CheckpointDirLock(sys.argv[1])  # kept referenced: the lock lives as long as its file object
lock.acquire()
print("locked", flush=True)
sys.stdin.read()  # hold until killed
"""


def test_a_second_run_on_a_locked_folder_fails_naming_the_holder_and_a_dead_holder_is_taken_over(tmp_path, caplog):
    root = tmp_path / "ckpt"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[2]))
    try:
        assert holder.stdout.readline().strip() == "locked"
        started: list = []
        trainer = _trainer(make_config(tmp_path), started)
        with pytest.raises(CheckpointError) as err:
            trainer.fit()
        trainer.shutdown()
        assert f"PID {holder.pid} on host {socket.gethostname()}" in str(err.value)
        assert str(root / LOCK_FILE) in str(err.value) and started == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (root / LOCK_FILE).exists()  # a SIGKILLed holder leaves its file, but the kernel dropped its flock
    with caplog.at_level(logging.WARNING, logger="rlhf_core.trainer.checkpoint_lock"):
        trainer = _fit(make_config(tmp_path, total_training_steps=2, save_freq=2, test_freq=-1))
    assert f"its holder PID {holder.pid} on host {socket.gethostname()}" in caplog.text
    assert trainer.global_steps == 2 and not (root / LOCK_FILE).exists()  # released at shutdown
