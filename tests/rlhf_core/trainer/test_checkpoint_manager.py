"""Checkpoint layout, tracker atomicity, resume resolution and retention (never deleting the last good one)."""
from __future__ import annotations

import os

import pytest
import torch

from rlhf_core.trainer import checkpoint_manager as cm
from rlhf_core.trainer.checkpoint_manager import CheckpointManager, find_latest_checkpoint, parse_global_step


def _writer(name):
    def save(path):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "weights.bin"), "w") as fh:
            fh.write(name)
    return save


def _save(mgr, step, critic=True):
    fns = {"actor": _writer("a")}
    if critic:
        fns["critic"] = _writer("c")
    return mgr.save(step, fns, {"epoch": 0, "batches_done": step})


def test_layout_tracker_and_dataloader_state(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    path = _save(mgr, 3)
    assert path == str(tmp_path / "global_step_3")
    assert sorted(os.listdir(path)) == ["actor", "checkpoint_manifest.json", "critic", "data.pt"]  # no trainer_state
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert find_latest_checkpoint(str(tmp_path)) == path
    assert CheckpointManager.load_dataloader_state(path) == {"epoch": 0, "batches_done": 3}
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp") or ".tmp." in f]


def test_tracker_written_after_components_and_not_on_failure(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    _save(mgr, 1)

    def crash(path):
        os.makedirs(path)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        mgr.save(2, {"actor": crash}, {})
    # the tracker still names the last complete checkpoint
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_1")


def test_tracker_replace_is_atomic(tmp_path, monkeypatch):
    cm.write_tracker(str(tmp_path), 5)
    seen = []
    real_replace = os.replace

    def spy(src, dst):  # at the moment of the swap the old tracker is still complete
        seen.append((tmp_path / "latest_checkpointed_iteration.txt").read_text())
        real_replace(src, dst)

    monkeypatch.setattr(cm.os, "replace", spy)
    cm.write_tracker(str(tmp_path), 6)
    assert seen == ["5"] and (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "6"


def test_retention_keeps_newest_and_holds_after_resume(tmp_path):
    mgr = CheckpointManager(str(tmp_path), max_actor_ckpt_to_keep=2, max_critic_ckpt_to_keep=1)
    for step in (1, 2, 3):
        _save(mgr, step)
    assert sorted(os.listdir(tmp_path)) == ["global_step_2", "global_step_3", "latest_checkpointed_iteration.txt"]
    assert sorted(os.listdir(tmp_path / "global_step_2")) == ["actor", "checkpoint_manifest.json", "data.pt"]  # critic: 1
    # a new manager (a resumed run) still prunes what an earlier process wrote
    mgr2 = CheckpointManager(str(tmp_path), max_actor_ckpt_to_keep=2, max_critic_ckpt_to_keep=1)
    _save(mgr2, 4)
    assert sorted(d for d in os.listdir(tmp_path) if d.startswith("global")) == ["global_step_3", "global_step_4"]


def test_remove_previous_keeps_only_new_and_never_newer_steps(tmp_path):
    mgr = CheckpointManager(str(tmp_path), remove_previous_ckpt_in_save=True)
    _save(mgr, 5, critic=False)
    _save(mgr, 2, critic=False)  # resumed from an earlier step: the abandoned step 5 is not ours to delete
    _save(mgr, 3, critic=False)
    assert sorted(d for d in os.listdir(tmp_path) if d.startswith("global")) == ["global_step_3", "global_step_5"]


def test_resolve_resume_modes(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    assert mgr.resolve_resume("auto") is None and mgr.resolve_resume("disable") is None
    _save(mgr, 4)
    assert mgr.resolve_resume("auto") == str(tmp_path / "global_step_4")
    assert mgr.resolve_resume("disable") is None
    assert mgr.resolve_resume("resume_path", str(tmp_path / "global_step_4")) == str(tmp_path / "global_step_4")
    with pytest.raises(ValueError, match="global_step_<N>"):
        mgr.resolve_resume("resume_path", str(tmp_path / "global_step_4" / "actor"))
    with pytest.raises(ValueError, match="does not exist"):
        mgr.resolve_resume("resume_path", str(tmp_path / "global_step_9"))
    with pytest.raises(ValueError, match="resume_mode"):
        mgr.resolve_resume("latest")
    assert parse_global_step("/x/global_step_12/") == 12


def test_upload_to_default_hdfs_dir_and_delete_after_load(tmp_path):
    remote = tmp_path / "remote"
    mgr = CheckpointManager(str(tmp_path / "local"), default_hdfs_dir=f"file://{remote}", del_local_ckpt_after_load=True)
    path = _save(mgr, 7)
    assert (remote / "global_step_7" / "actor" / "weights.bin").read_text() == "a"
    assert (remote / "latest_checkpointed_iteration.txt").read_text() == "7"
    assert torch.load(remote / "global_step_7" / "data.pt", weights_only=False)["batches_done"] == 7
    mgr.after_load(path)
    assert not os.path.exists(path)
