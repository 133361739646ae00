"""Which flow run ``rlhf pipeline --resume [RUN]`` continues (flows/resume.py), against a real DuckDB store: the
newest unfinished run with the same settings, or the one named; a finished run, other settings, a missing folder or
a live holder of the run folder are refused in one line naming the run and why."""
from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap

import pytest

from flows import report
from flows.resume import LAST, ResumeError, checkpoint_step, find_run, lock_run_dir, run_dir, unfinished_note
from infra.results import ResultsStore

PARAMS = {"experiment": "e", "ppo_steps": 4, "experiment_sha256": "ab" * 32}


def _flow(home, rid, name, status, minute, params=PARAMS, folder=True):
    started = dt.datetime(2026, 1, 1, 10, minute)
    report.index_flow(ResultsStore(home), rid, name, params, status, started,
                      None if status == "RUNNING" else started + dt.timedelta(minutes=1))
    if folder:
        (run_dir(home, rid) / "checkpoints").mkdir(parents=True)


def test_last_is_the_newest_unfinished_run_with_the_same_settings(tmp_path):
    assert find_run(tmp_path, LAST, PARAMS) is None  # an empty home: a new run
    _flow(tmp_path, "r1", "old-fox", "FAILED", 1)
    _flow(tmp_path, "r2", "done-owl", "FINISHED", 2)
    _flow(tmp_path, "r3", "other-cat", "RUNNING", 3, params={**PARAMS, "ppo_steps": 8})
    _flow(tmp_path, "r4", "gone-elk", "RUNNING", 4, folder=False)
    assert find_run(tmp_path, LAST, PARAMS) == "r1"  # r2 finished, r3 other settings, r4 has no folder
    _flow(tmp_path, "r5", "killed-yak", "RUNNING", 5)  # a kill -9 leaves its row RUNNING
    assert find_run(tmp_path, LAST, PARAMS) == "r5"
    assert find_run(tmp_path, "old-fox", PARAMS) == "r1" and find_run(tmp_path, "r1", PARAMS) == "r1"
    (run_dir(tmp_path, "r5") / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    assert checkpoint_step(run_dir(tmp_path, "r5")) == 2 and checkpoint_step(run_dir(tmp_path, "r1")) is None
    note = unfinished_note(tmp_path, PARAMS, "new")
    assert "flow run r5" in note and "checkpoint at step 2" in note and "--resume r5" in note
    assert unfinished_note(tmp_path, PARAMS, "r5") is None  # the run itself
    report.index_flow(ResultsStore(tmp_path), "r5", "killed-yak", PARAMS, "FINISHED", dt.datetime(2026, 1, 1))
    assert unfinished_note(tmp_path, PARAMS, "new") is None  # r1 has no checkpoint: nothing to say


def test_a_run_continued_by_a_finished_resume_is_not_offered_again(tmp_path):
    from flows.resume import mark_resumed

    _flow(tmp_path, "r1", "killed-fox", "FAILED", 1)
    (run_dir(tmp_path, "r1") / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("4")
    assert find_run(tmp_path, LAST, PARAMS) == "r1" and "--resume r1" in unfinished_note(tmp_path, PARAMS, "new")
    mark_resumed(ResultsStore(tmp_path), "r1")  # what the flow does when the run resuming r1 finishes
    _, rows = ResultsStore(tmp_path).sql("SELECT status, ended_at IS NOT NULL FROM runs WHERE run_id = 'r1'")
    assert rows == [("RESUMED", True)]
    assert find_run(tmp_path, LAST, PARAMS) is None and unfinished_note(tmp_path, PARAMS, "new") is None
    with pytest.raises(ResumeError, match=r"flow run r1 \(killed-fox\) was continued by a resumed run that finished"):
        find_run(tmp_path, "r1", PARAMS)


def test_a_named_run_that_cannot_be_resumed_is_refused_naming_why(tmp_path):
    _flow(tmp_path, "r1", "old-fox", "FAILED", 1)
    _flow(tmp_path, "r2", "done-owl", "FINISHED", 2)
    _flow(tmp_path, "r4", "gone-elk", "RUNNING", 4, folder=False)
    with pytest.raises(ResumeError, match=r"--resume nope: no flow run with that id or name in .*runs that did not "
                                          r"finish: r4 \(gone-elk, RUNNING\), r1 \(old-fox, FAILED\)"):
        find_run(tmp_path, "nope", PARAMS)
    with pytest.raises(ResumeError, match=r"flow run r2 \(done-owl\) finished; nothing to resume"):
        find_run(tmp_path, "done-owl", PARAMS)
    with pytest.raises(ResumeError, match=r"flow run r1 was made with other settings \(experiment_sha256, "
                                          r"ppo_steps\)"):
        find_run(tmp_path, "r1", {**PARAMS, "ppo_steps": 8, "experiment_sha256": "cd" * 32})
    with pytest.raises(ResumeError, match="flow run r4 has no run folder"):
        find_run(tmp_path, "r4", PARAMS)


def test_a_run_whose_folder_a_live_process_holds_is_not_resumed(tmp_path):
    _flow(tmp_path, "r1", "old-fox", "RUNNING", 1)
    folder = run_dir(tmp_path, "r1")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from flows.resume import lock_run_dir
        lock = lock_run_dir({str(folder)!r}); print("held", flush=True); time.sleep(60)""")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ResumeError, match=rf"flow run r1 is still running \(PID {holder.pid} on host"):
            find_run(tmp_path, "r1", PARAMS)
        assert find_run(tmp_path, LAST, PARAMS) is None
        with pytest.raises(ResumeError, match=rf"in use by another flow run: PID {holder.pid} on host") as err:
            lock_run_dir(folder)
        assert "trainer.default_local_dir" not in str(err.value)  # the checkpoint lock's advice is not this lock's
    finally:
        holder.kill()
        holder.wait()
    # its holder was killed (the kernel dropped the lock): now it can be resumed, and its lock taken
    assert find_run(tmp_path, "r1", PARAMS) == "r1"
    lock = lock_run_dir(folder)
    lock.release()
