"""Runs started by hand land in the same store: `rlhf eval` with RLHF_HOME set, `rlhf results register`."""

from __future__ import annotations

import json
import os

import pandas as pd
from mlflow import MlflowClient

from conftest_services import *  # noqa: F401,F403
from infra.results import prompt_id
from infra.results_cli import main as results_main
from rlhf_cli import main as rlhf_main
from rlhf_core.metrics.samples import write_samples_parquet
import pytest

pytestmark = pytest.mark.ray  # starts Ray through an entry point (the rlhf CLI, a trainer, the flow)


def _responses(path) -> str:
    pd.DataFrame({
        "data_source": ["openai/gsm8k", "openai/gsm8k"],
        "prompt": [[{"role": "user", "content": "q0"}], [{"role": "user", "content": "q1"}]],
        "responses": [["#### 72", "#### 71"], ["#### 5", "#### 5"]],  # scores 1, 0 and 1, 1
        "reward_model": [{"style": "rule", "ground_truth": g} for g in ("72", "5")],
    }).to_parquet(path)
    return str(path)


def test_rlhf_eval_with_rlhf_home_is_tracked_and_registered(rlhf_env, results_store, tmp_path, capsys,
                                                            monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # the home's store must be picked, not ./mlflow.db
    monkeypatch.chdir(tmp_path)
    assert rlhf_main(["eval", f"data.path={_responses(tmp_path / 'r.parquet')}"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[: out.rindex("}") + 1])["test_score/openai/gsm8k"] == 0.75  # (0.5 + 1) / 2
    assert not (tmp_path / "mlflow.db").exists() and (rlhf_env / "mlflow.db").exists()
    _, [(run_id, stage, status, kind)] = results_store.sql("SELECT run_id, stage, status, kind FROM runs")
    assert (stage, status, kind) == ("evaluate", "FINISHED", "stage")
    _, rows = results_store.sql(f"SELECT key, value FROM metrics WHERE run_id = '{run_id}' ORDER BY key")
    assert ("test_score/openai/gsm8k", 0.75) in rows
    _, ids = results_store.sql("SELECT DISTINCT prompt_id FROM samples ORDER BY 1")
    assert ids == sorted([(prompt_id("user: q0", "openai/gsm8k"),), (prompt_id("user: q1", "openai/gsm8k"),)])
    run = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["test_score/openai/gsm8k"] == 0.75


def test_register_an_existing_run_folder(rlhf_env, results_store, tmp_path, capsys):
    folder = tmp_path / "my_ppo_run"
    rows = [{"step": 3, "data_source": "gsm8k", "uid": "u", "sample_idx": 0, "prompt": "p", "response": "r",
             "ground_truth": "1", "score": 1.0}]
    write_samples_parquet(rows, str(folder / "val"), "val_step_3")
    (folder / "ckpt" / "global_step_3").mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"step": 3, "name": "critic/score/mean", "value": 0.5}\n')
    assert results_main(["register", str(folder)]) == 0
    assert "registered 1 samples and 1 metric values" in capsys.readouterr().out
    _, [(stage, checkpoint)] = results_store.sql("SELECT stage, checkpoint FROM samples")
    assert stage == "ppo" and checkpoint == str((folder / "ckpt" / "global_step_3").resolve())
    assert results_store.sql("SELECT key, value FROM metrics")[1] == [("critic/score/mean", 0.5)]
    assert results_store.sql("SELECT name FROM runs")[1] == [("my_ppo_run",)]
    assert results_main(["register", str(tmp_path / "missing")]) == 1


def test_a_refused_rlhf_ppo_leaves_no_run_behind(rlhf_env, results_store, tmp_path, capsys, monkeypatch):
    # a model path that does not exist: refused before torch is imported; it used to be registered as a FAILED run
    # (a runs row and an MLflow run) though nothing ran
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)
    for name in ("train.parquet", "val.parquet"):  # present (a missing data file is refused first: rlhf_core.data.fs)
        (tmp_path / name).touch()
    code = rlhf_main(["ppo", "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1",
                      f"data.train_files={tmp_path / 'train.parquet'}", f"data.val_files={tmp_path / 'val.parquet'}",
                      f"actor_rollout_ref.model.path={tmp_path / 'no_model'}"])
    out, err = capsys.readouterr()
    assert code == 1 and f"rlhf ppo: error: actor_rollout_ref.model.path='{tmp_path / 'no_model'}'" in err
    assert "nothing registered: the run was refused before it started" in out
    assert results_store.sql("SELECT count(*) FROM runs")[1] == [(0,)]
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    assert [r.info.run_id for e in client.search_experiments() for r in client.search_runs([e.experiment_id])] == []


def test_a_run_stopped_by_a_full_disk_stays_failed(rlhf_env, results_store, tmp_path, capsys, monkeypatch):
    # exit 1 with nothing written, as a refusal, but for a storage error (ENOSPC): the FAILED record is kept, not
    # forgotten (a fault never deletes what a user might need); the core's own error display (run_command) is used
    import errno

    from rlhf_cli.tracked import _tracked
    from rlhf_core.cli import run_command

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)

    def full_disk(_argv):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "ckpt"))

    code = _tracked("ppo_trainer", ["actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1",
                                    f"actor_rollout_ref.model.path={tmp_path / 'm'}"],
                    "trainer.validation_data_dir", "trainer.project_name",
                    lambda argv: run_command("rlhf ppo", full_disk, argv))
    out, err = capsys.readouterr()
    assert code == 1 and "No space left on device" in err and "registered run" in out
    assert results_store.sql("SELECT stage, status FROM runs")[1] == [("ppo", "FAILED")]


def test_an_rlhf_home_that_cannot_be_created_is_one_line_naming_rlhf_home(tmp_path, monkeypatch):
    """A user's trial: RLHF_HOME on a read-only disk failed as a bare "[Errno 30] Read-only file system: PATH".
    A regular file in the way (ENOTDIR, no mount needed) takes the same path through :func:`infra.home.rlhf_home`."""
    import errno

    from infra.home import rlhf_home

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "afile" / "home"))
    with pytest.raises(OSError) as info:
        rlhf_home()
    assert info.value.errno == errno.ENOTDIR
    assert str(info.value) == (f"[Errno {errno.ENOTDIR}] RLHF_HOME: cannot create {tmp_path / 'afile' / 'home'} "
                               "(Not a directory); set RLHF_HOME to a writable folder or run from one")
