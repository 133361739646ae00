"""A ``kill -9`` of ``rlhf pipeline`` after its first PPO checkpoint, then the same command with ``--resume``
(flows/resume.py): the real CLI entry (``python -m flows.rlhf``), Prefect's ephemeral server, embedded Ray, MLflow
(SQLite) and DuckDB under a temporary ``RLHF_HOME``; a tiny Countdown experiment (no download)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.test_pipeline_interrupt import _session_members
from tests.paths import REPO

pytestmark = pytest.mark.ray

# 4 PPO steps in segments of 2 (a checkpoint at 2 and 4); one tiny layer, 4-token answers, no evaluation
EXPERIMENT = """\
name: resume-kill
model:
  tiny: {vocab_size: 300, hidden_size: 32, intermediate_size: 64, num_layers: 1, num_attention_heads: 2,
         num_key_value_heads: 1}
data:
  generator: countdown
  generator_args: {min_numbers: 2, max_numbers: 2, max_number: 20}
  train_max_samples: 64
  val_max_samples: 4
sft:
  epochs: 1
  overrides: [data.prompt_key=extra_info, data.response_key=extra_info, "data.prompt_dict_keys=[warmup_question]",
              "data.response_dict_keys=[warmup_answer]", data.train_batch_size=8, data.micro_batch_size_per_gpu=8,
              data.max_length=48, data.truncation=right, trainer.total_training_steps=2, trainer.n_gpus_per_node=1,
              trainer.device=cpu, "trainer.logger=[file]"]
ppo:
  total_steps: 4
  segment_steps: 2
  overrides: [data.max_prompt_length=48, data.max_response_length=4, data.train_batch_size=4,
              data.truncation=left, actor_rollout_ref.rollout.name=hf, actor_rollout_ref.rollout.n=2,
              actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8, actor_rollout_ref.rollout.val_kwargs.n=1,
              actor_rollout_ref.actor.ppo_mini_batch_size=4, actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8,
              actor_rollout_ref.actor.use_kl_loss=False, algorithm.use_kl_in_reward=False,
              trainer.n_gpus_per_node=1, trainer.device=cpu, trainer.val_before_train=False, trainer.total_epochs=100,
              "trainer.logger=[file]", ray_init.num_cpus=2]
evaluation: {enabled: false}
"""


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "RLHF_", "RAY_ADDRESS"))}
    return {**env, "RLHF_HOME": str(home), "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}


def _files(root: Path) -> dict[str, int]:
    """``{path below root: mtime_ns}`` of the files of every ``global_step_N`` folder."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.glob("global_step_*/**/*") if p.is_file()}


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return pid


def _rows(run_dir: Path) -> list[dict]:
    from infra.run_folders import read_jsonl

    return [r for f in sorted((run_dir / "metrics").glob("segment_*.jsonl")) for r in read_jsonl(f)]


@pytest.mark.slow
def test_a_killed_pipeline_resumes_from_its_checkpoint_reusing_finished_stages(tmp_path):
    from flows.resume import checkpoint_step
    from infra.results import ResultsStore

    home, experiment = tmp_path / "home", tmp_path / "resume.yaml"
    experiment.write_text(EXPERIMENT)
    cmd = [sys.executable, "-m", "flows.rlhf", "--experiment", str(experiment)]
    log = tmp_path / "first.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(home), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.time() + 400
    run_dir = None
    while True:  # the first PPO checkpoint (the tracker names it only once it is complete)
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-4000:]
        folders = list((home / "runs").glob("*/checkpoints")) if (home / "runs").exists() else []
        if folders and checkpoint_step(folders[0].parent) is not None:
            run_dir = folders[0].parent
            break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # kill -9 of `rlhf pipeline`
    proc.wait(timeout=60)
    killed_at = time.time()
    time.sleep(3)  # what the kernel's death signals stop (Ray's processes, the Prefect server) ends
    left = _session_members(proc.pid)
    print("left in the killed run's session:", [_cmdline(p) for p in left])
    for pid in left:  # swept, so that nothing of the first run could write into the run folder now
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    step = checkpoint_step(run_dir)
    assert step == 2, log.read_text()[-3000:]  # killed within 0.2 s of it: segment 2 had not ended
    ckpts = _files(run_dir / "checkpoints")
    first_id = run_dir.name

    second = subprocess.run(cmd + ["--resume"], cwd=REPO, env=_env(home), capture_output=True, text=True,
                            timeout=600)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-6000:]
    assert f"resuming flow run {first_id}" in out and f"checkpoint at step {step}" in out, out[-4000:]

    # one run folder: the resumed run trained in the first one's; no checkpoint file was removed or rewritten
    assert [p.name for p in (home / "runs").iterdir() if p.is_dir()] == [first_id]
    after = _files(run_dir / "checkpoints")
    assert {k: after.get(k) for k in ckpts} == ckpts
    assert sorted(int(p.name.split("_")[-1]) for p in (run_dir / "checkpoints").glob("global_step_*")) == \
        [2, 4]
    # the training steps: each once; the resumed run logged only the steps after its checkpoint
    rows = [r for r in _rows(run_dir) if r["name"] == "critic/score/mean"]
    assert sorted(r["step"] for r in rows) == [1, 2, 3, 4]
    new = sorted(r["step"] for r in rows if r["timestamp"] > killed_at)
    assert new == [3, 4], rows  # segment 1 was not started again (flows.pipeline_steps.trained_segment)
    keys = [(r["step"], r["name"]) for r in _rows(run_dir)]
    assert len(keys) == len(set(keys))
    # the stages before PPO came from Prefect's cache: the second flow run's own rows are the flow and its ppo stage
    store = ResultsStore(home)
    _, flows = store.sql("SELECT run_id, status FROM runs WHERE kind = 'flow' ORDER BY started_at")
    # the killed one: RESUMED, since the run that continued it finished (FAILED until then); not offered again
    assert [s for _, s in flows] == ["RESUMED", "FINISHED"] and flows[0][0] == first_id
    # the killed run's stages: none left RUNNING; its ppo stage, killed in the middle, FAILED (and KILLED in MLflow)
    _, killed = store.sql(f"SELECT run_id, stage, status FROM runs WHERE kind = 'stage' AND flow_run_id = '{first_id}'")
    assert "RUNNING" not in {s for _, _, s in killed} and ("FAILED" in {s for _, st, s in killed if st == "ppo"}), killed
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")  # infra.home: the run home's store
    ppo_run = next(r for r, st, _ in killed if st == "ppo")
    assert mlflow.MlflowClient().get_run(ppo_run).info.status == "KILLED"
    _, stages = store.sql(f"SELECT stage FROM runs WHERE flow_run_id = '{flows[1][0]}' ORDER BY stage")
    assert stages == [("flow",), ("ppo",)]
    _, ppo = store.sql(f"SELECT DISTINCT step FROM metrics WHERE key = 'critic/score/mean' AND run_id IN "
                       f"(SELECT run_id FROM runs WHERE flow_run_id = '{flows[1][0]}' AND stage = 'ppo') ORDER BY 1")
    assert ppo == [(s,) for s in range(1, 5)]  # the resumed ppo run holds every step (those before: from the files)
    params = json.loads(store.sql(f"SELECT params_json FROM runs WHERE run_id = '{flows[1][0]}'")[1][0][0])
    assert params["ppo_steps"] == 4
