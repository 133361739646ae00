"""Untrusted checkpoint files are not code (issue 32): a pickle planted in a checkpoint folder never runs.

Each test plants a real payload (an object whose ``__reduce__`` is ``os.system("touch <marker>")``) in a file the
real load path reads: ``data.pt``, ``trainer_state.pt``, a worker's ``extra_state_*.pt``, a DCP ``.metadata``, a DCP
non-tensor item (an optimizer ``param_groups`` entry), a verl shard read by ``rlhf merge``. The load must be refused
with an error naming the file, and the marker must not exist. Each test first shows that the payload is live: an
unrestricted ``pickle``/``torch.load`` of the same bytes does create the marker.
"""
from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rlhf_core.safe_load import CheckpointError
from rlhf_core.trainer.checkpoint_manager import CheckpointManager
from rlhf_core.workers.checkpoint import FSDPCheckpointManager


class Payload:
    """Runs ``touch <marker>`` when unpickled by an unrestricted unpickler."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _assert_payload_is_live(raw: bytes, marker, loads) -> None:
    """The control: an unrestricted load of ``raw`` runs the payload (so its absence later means a refusal)."""
    loads(raw)
    assert marker.exists()
    marker.unlink()


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.mark.parametrize("name", ["data.pt", "trainer_state.pt"])
def test_a_pickle_as_driver_state_is_refused_naming_the_file(tmp_path, name):
    marker = tmp_path / "pwned"
    raw = _torch_bytes({"epoch": 0, "batches_done": Payload(str(marker))})
    _assert_payload_is_live(raw, marker, lambda b: torch.load(io.BytesIO(b), weights_only=False))
    step = tmp_path / "ckpt" / "global_step_2"
    step.mkdir(parents=True)
    (step / name).write_bytes(raw)
    load = {"data.pt": CheckpointManager.load_dataloader_state,
            "trainer_state.pt": CheckpointManager.load_trainer_state}[name]
    with pytest.raises(CheckpointError) as err:
        load(str(step))
    assert str(step / name) in str(err.value) and "posix.system" in str(err.value)
    assert not marker.exists()


def _manager(seed=3):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt, FSDPCheckpointManager(model, opt, None, None, None, ("model", "optimizer", "extra"), seed=seed)


def test_a_pickle_as_worker_extra_state_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    _, _, mgr = _manager()
    actor = tmp_path / "global_step_1" / "actor"
    mgr.save(str(actor))
    raw = _torch_bytes({"rng": Payload(str(marker)), "lr_scheduler": None, "counters": {}})
    _assert_payload_is_live(raw, marker, lambda b: torch.load(io.BytesIO(b), weights_only=False))
    (actor / "extra_state_world_size_1_rank_0.pt").write_bytes(raw)
    with pytest.raises(CheckpointError, match="extra_state_world_size_1_rank_0.pt: refused to load"):
        _manager()[2].load(str(actor))
    assert not marker.exists()


def test_a_pickle_as_dcp_metadata_is_refused_by_the_worker_and_before_resume(tmp_path):
    marker = tmp_path / "pwned"
    _, _, mgr = _manager()
    actor = tmp_path / "ckpt" / "global_step_1" / "actor"
    mgr.save(str(actor))
    raw = pickle.dumps(Payload(str(marker)))
    _assert_payload_is_live(raw, marker, pickle.loads)  # torch's own FileSystemReader uses pickle.load
    (actor / "model" / ".metadata").write_bytes(raw)
    with pytest.raises(CheckpointError, match=r"model/\.metadata: refused to load"):
        _manager()[2].load(str(actor))
    # the driver reads it first: resume_path (no manifest: an older checkpoint) is refused before any worker
    with pytest.raises(CheckpointError, match=r"model/\.metadata: refused to load"):
        CheckpointManager(str(tmp_path / "ckpt")).resolve_resume("resume_path", str(actor.parent))
    assert not marker.exists()


def test_a_pickle_as_a_dcp_item_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    model, opt, mgr = _manager()
    actor = tmp_path / "global_step_1" / "actor"
    mgr.save(str(actor))
    # rewrite optim/ with a param_groups entry that torch's DefaultLoadPlanner would read with weights_only=False
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, opt)
    osd["param_groups"][0]["lr"] = Payload(str(marker))
    dcp.save(osd, checkpoint_id=str(actor / "optim"))
    assert not marker.exists()  # saving pickles the payload, it does not run it
    with pytest.raises(CheckpointError, match=r"optim .*'param_groups\.0\.lr'.*refused to load"):
        _manager()[2].load(str(actor))
    assert not marker.exists()


@pytest.mark.slow
def test_rlhf_ppo_resume_refuses_a_worker_pickle_in_one_line(tiny_model_dir, tmp_path):
    """End to end: a real ``rlhf ppo`` saves step 1; a payload planted in the actor worker's extra state (the
    manifest updated to its size, as an attacker would) is refused by the worker on resume; Ray's colourful
    traceback is unwrapped to one line naming the file, exit 1, and the payload never ran."""
    import json

    from bad_input_fixtures import good_rows, rlhf_ppo, write_parquet

    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    ckpt = tmp_path / "ckpt"
    first = rlhf_ppo(tiny_model_dir, data, ckpt, "trainer.total_training_steps=1", "trainer.save_freq=1")
    assert first.returncode == 0, first.stderr[-3000:]
    marker = tmp_path / "pwned"
    raw = _torch_bytes({"rng": Payload(str(marker)), "lr_scheduler": None, "counters": {}})
    _assert_payload_is_live(raw, marker, lambda b: torch.load(io.BytesIO(b), weights_only=False))
    planted = ckpt / "global_step_1" / "actor" / "extra_state_world_size_1_rank_0.pt"
    planted.write_bytes(raw)
    manifest = ckpt / "global_step_1" / "checkpoint_manifest.json"
    listed = json.loads(manifest.read_text())
    listed["files"]["actor/extra_state_world_size_1_rank_0.pt"] = len(raw)  # the driver's size check passes
    manifest.write_text(json.dumps(listed))
    proc = rlhf_ppo(tiny_model_dir, data, ckpt, "trainer.total_training_steps=2", "trainer.save_freq=1",
                    "trainer.resume_mode=auto")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower() and "refused" in line]
    assert len(errors) == 1 and errors[0].startswith(f"rlhf ppo: error: {planted}: refused to load"), proc.stderr
    assert "\x1b" not in errors[0] and proc.stderr.endswith(errors[0] + "\n")  # no colour, nothing after it
    assert "posix.system" in errors[0]
    assert not marker.exists()  # the payload did not run, on the driver nor in the worker
    assert not (ckpt / "global_step_2").exists()


@pytest.mark.parametrize("layout", ["verl shard", "dcp metadata"])
def test_rlhf_merge_refuses_a_planted_pickle(tmp_path, capsys, layout):
    from rlhf_core.workers.merger import main as merge_main

    marker = tmp_path / "pwned"
    actor = tmp_path / "global_step_1" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "huggingface" / "config.json").write_text('{"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8, '
                                                       '"intermediate_size": 8, "num_hidden_layers": 1, '
                                                       '"num_attention_heads": 2, "num_key_value_heads": 1}')
    if layout == "verl shard":
        raw, name = _torch_bytes({"model.embed_tokens.weight": Payload(str(marker))}), "model_world_size_1_rank_0.pt"
        _assert_payload_is_live(raw, marker, lambda b: torch.load(io.BytesIO(b), weights_only=False))
    else:
        raw, name = pickle.dumps(Payload(str(marker))), "model/.metadata"
        _assert_payload_is_live(raw, marker, pickle.loads)
        (actor / "model").mkdir()
    (actor / name).write_bytes(raw)
    assert merge_main(["--local-dir", str(actor), "--target-dir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{name}: refused to load" in err[0], err
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_older_checkpoints_with_numpy_rng_arrays_still_load(tmp_path):
    """Checkpoints written before the RNG states were lists hold numpy arrays: numbers, allowed by name."""
    import numpy as np

    np.random.seed(5)
    expected = np.random.rand()
    np.random.seed(5)
    step = tmp_path / "global_step_1"
    step.mkdir()
    torch.save({"driver_rng": {"numpy": np.random.get_state()}}, step / "trainer_state.pt")
    from rlhf_core.workers.checkpoint import set_rng_state

    state = CheckpointManager.load_trainer_state(str(step))["driver_rng"]
    np.random.seed(0)
    set_rng_state({"cpu": torch.get_rng_state(), "numpy": state["numpy"], "random": __import__("random").getstate()})
    assert np.random.rand() == expected


def test_a_pickle_as_a_rollout_dump_is_refused(tmp_path):
    from rlhf_core.trainer.rollout_control import RolloutDump

    marker = tmp_path / "pwned"
    dump = RolloutDump(str(tmp_path / "dump"), "e", "p", 2, 2)
    os.makedirs(dump.folder)
    raw = _torch_bytes({"tensors": {}, "non_tensors": Payload(str(marker)), "meta": {}})
    _assert_payload_is_live(raw, marker, lambda b: torch.load(io.BytesIO(b), weights_only=False))
    Path(dump.path(1)).write_bytes(raw)
    with pytest.raises(CheckpointError, match=r"step_1\.pt: refused to load"):
        dump.load(1, rows=4)
    assert not marker.exists()


def test_no_source_loads_a_pickle_unrestricted():
    """Every file read in the product goes through rlhf_core.safe_load; only the reward pool unpickles, and only
    the scorer its own process pickled a moment before (never a file)."""
    root = Path(__file__).resolve().parents[2]
    unsafe = re.compile(r"weights_only\s*=\s*False|pickle\.loads?\(|dcp\.load\(|dcp_to_torch_save|"
                        r"torch\.load\((?!.*weights_only=True)")
    found = []
    for folder in ("rlhf_core", "infra", "tasks", "flows"):
        for path in sorted((root / folder).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if unsafe.search(line) and not line.lstrip().startswith("#"):
                    found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    # rlhf_core/safe_load.py is the one place that calls the loaders; the reward pool's scorer is in memory
    assert [f for f in found if not f.startswith("rlhf_core/safe_load.py:")
            and "pickle.loads(scorer_blob)" not in f] == []
    assert any(f.startswith("rlhf_core/reward/pool.py:") for f in found)  # the scan does see real calls
