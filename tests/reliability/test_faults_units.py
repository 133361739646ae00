"""The pieces of fault recovery that run in seconds: the fault hook (``rlhf_core.faults``), a retried segment's
metrics file, and a checkpoint folder left half-written by a killed attempt. The kills themselves, end to end
through the Prefect retry: ``tests/reliability/test_faults.py``."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
import ray.cloudpickle

from conftest_services import ray_local  # noqa: F401 - an embedded Ray (session fixture)
from infra.ray_cluster import OWNER_ENV, release_owned, run_on_ray
from infra.run_folders import last_per_step_and_key, read_jsonl
from rlhf_core.faults import fault_point, parse_fault
from rlhf_core.trainer.checkpoint_manager import CheckpointManager, find_latest_checkpoint, write_tracker

pytestmark = pytest.mark.ray  # starts Ray: uses the fixture ray_local

REPO = Path(__file__).resolve().parents[2]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test modules are not importable on Ray workers


def _hook_in_child(env: dict[str, str], call: str) -> subprocess.CompletedProcess:
    """Run ``rlhf_core.faults.<call>`` in a fresh interpreter with ``env`` (the hook kills that process)."""
    code = f"from rlhf_core.faults import fault_point\n{call}\nprint('survived')"
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("RLHF_FAULT")}, **env,
            "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60)


def test_unarmed_hook_does_nothing(monkeypatch):
    monkeypatch.delenv("RLHF_FAULT", raising=False)
    for point in ("generate", "update_actor", "checkpoint_write", "driver"):
        assert fault_point(point, 1) is None


@pytest.mark.parametrize("spec", ["generate", "generate:x", "gen:2", ":2", "driver:-1"])
def test_a_malformed_fault_names_the_variable(spec, monkeypatch):
    monkeypatch.setenv("RLHF_FAULT", spec)
    with pytest.raises(ValueError, match=r"\$RLHF_FAULT=.*expected <point>:<step>"):
        fault_point("driver", 1)


def test_an_armed_fault_needs_its_marker(monkeypatch):
    monkeypatch.setenv("RLHF_FAULT", "driver:3")
    monkeypatch.delenv("RLHF_FAULT_MARKER", raising=False)
    fault_point("driver", 2)  # another step: not due, the marker is not needed yet
    fault_point("generate", 3)  # another point
    with pytest.raises(ValueError, match="RLHF_FAULT_MARKER"):
        fault_point("driver", 3)


def test_the_hook_kills_its_process_once_and_records_the_pid(tmp_path):
    marker = tmp_path / "fired"
    env = {"RLHF_FAULT": "update_actor:2", "RLHF_FAULT_MARKER": str(marker)}
    not_due = _hook_in_child(env, "fault_point('update_actor', 1); fault_point('generate', 2)")
    assert not_due.returncode == 0 and "survived" in not_due.stdout and not marker.exists()
    first = _hook_in_child(env, "fault_point('update_actor', 2)")
    assert first.returncode == -signal.SIGKILL and "survived" not in first.stdout
    point, pid = marker.read_text().strip().split(" pid=")
    assert point == "update_actor:2" and int(pid) > 0
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)  # the process that wrote its pid is gone
    again = _hook_in_child(env, "fault_point('update_actor', 2)")  # the retry: the marker says it fired
    assert again.returncode == 0 and "survived" in again.stdout


def test_the_checkpoint_write_point_takes_its_step_from_the_folder(tmp_path):
    env = {"RLHF_FAULT": "checkpoint_write:3", "RLHF_FAULT_MARKER": str(tmp_path / "fired")}
    other = _hook_in_child(env, f"fault_point('checkpoint_write', checkpoint_path={str(tmp_path / 'global_step_2' / 'actor')!r})")
    assert other.returncode == 0
    due = _hook_in_child(env, f"fault_point('checkpoint_write', checkpoint_path={str(tmp_path / 'global_step_3' / 'actor')!r})")
    assert due.returncode == -signal.SIGKILL
    assert parse_fault("checkpoint_write:3") == ("checkpoint_write", 3)


def test_a_retried_segment_keeps_its_metrics_up_to_its_checkpoint_and_deletes_none(tmp_path, monkeypatch):
    # A retried PPO segment's trainer gets the segment's file through RLHF_METRICS_FILE (tasks.train_stages
    # .ppo_segment) and prepares it itself (rlhf_core.trainer.metrics_file.prepare_metrics_file).
    from rlhf_core.trainer.metrics_file import prepare_metrics_file

    path = tmp_path / "segment_1.jsonl"
    monkeypatch.setenv("RLHF_METRICS_FILE", str(path))
    config = SimpleNamespace(trainer=SimpleNamespace(logger=["console"], default_local_dir=str(tmp_path / "ckpt")))
    rows = [{"step": s, "name": "actor/pg_loss", "value": float(s)} for s in (1, 2, 3)]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "na'  # a torn last line
    path.write_text(text)
    # the dead attempt logged steps 1-3, the last complete checkpoint is step 2: step 3 is done again
    prepare_metrics_file(config, 2)
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    assert (tmp_path / "segment_1.jsonl.1").read_text() == text  # the dead attempt's whole file, kept aside
    # no checkpoint (the retry starts over): the file is moved aside, not deleted
    prepare_metrics_file(config, None)
    assert not path.exists() and [r["step"] for r in read_jsonl(tmp_path / "segment_1.jsonl.2")] == [1, 2]


def test_the_last_row_of_a_step_and_key_wins():
    rows = [{"step": 2, "name": "val-core/x", "value": 0.5}, {"step": 2, "name": "actor/lr", "value": 0.1},
            {"step": 2, "name": "val-core/x", "value": 0.5}, {"step": 3, "name": "val-core/x", "value": 0.7}]
    # the retry re-validates at its resume step 2: one row per (step, name), 3 of the 4
    assert last_per_step_and_key(rows) == [rows[2], rows[1], rows[3]]


def test_a_half_written_step_is_rewritten_whole_and_never_tracked(tmp_path):
    root = tmp_path / "ckpt"
    mgr = CheckpointManager(str(root))

    def write_actor(path: str) -> None:
        os.makedirs(path)
        Path(path, "model.bin").write_text("weights")

    mgr.save(1, {"actor": write_actor}, {"epoch": 0})
    # what a worker killed in the middle of step 2's write leaves: a temporary folder, a component without data.pt
    partial = root / "global_step_2"
    (partial / "actor.tmp" / "model").mkdir(parents=True)
    (partial / "critic").mkdir()
    assert find_latest_checkpoint(str(root)) == str(root / "global_step_1")  # the tracker never named step 2
    mgr.save(2, {"actor": write_actor}, {"epoch": 0})
    assert sorted(os.listdir(partial)) == ["actor", "checkpoint_manifest.json", "data.pt"]  # no leftovers
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "2"
    # the folder the tracker names is never removed by a save of its own step
    write_tracker(str(root), 2)
    (partial / "extra").mkdir()
    mgr.save(2, {"actor": lambda p: None}, None)
    assert (partial / "extra").is_dir()


def _place_and_die(name: str) -> None:
    """A driver that places a group named like a worker group's (``$RLHF_RAY_OWNER.<name>``), then is SIGKILLed."""
    from ray.util.placement_group import placement_group

    from rlhf_core.distributed.worker_group import owner_prefix

    pg = placement_group([{"CPU": 0.01}], name=f"{owner_prefix()}{name}")
    ray.get(pg.ready())
    os.kill(os.getpid(), signal.SIGKILL)


def _states(suffix: str) -> list[str]:
    from ray.util.placement_group import placement_group_table

    return [info["state"] for info in placement_group_table().values() if info["name"].endswith(suffix)]


def test_a_killed_driver_leaves_no_placement_group(ray_local):  # noqa: F811 - the fixture imported above
    # Ray itself keeps the placement group of a task that died (it lives until the job ends) ...
    bare = ray.remote(num_cpus=0, max_retries=0)(_place_and_die).options(
        runtime_env={"env_vars": {OWNER_ENV: "bare-owner"}})
    with pytest.raises(ray.exceptions.RayError):
        ray.get(bare.remote("bare_group"), timeout=120)
    assert _states("bare_group") == ["CREATED"]
    assert release_owned("bare-owner") == {"actors": [], "placement_groups": ["bare-owner.bare_group"]}
    assert _states("bare_group") == ["REMOVED"]
    # ... so the dispatcher releases what its dead driver left before the stage fails (and Prefect retries it)
    with pytest.raises(ray.exceptions.RayError):
        run_on_ray(_place_and_die, "dispatched_group")
    assert _states("dispatched_group") == ["REMOVED"]
