"""What the ``rlhf`` command line answers, and how fast (issue 36, "The command line").

Through the real console script in a fresh interpreter wherever time or output is the promise: ``--help`` and a
bad flag before the trainer's imports, an offline hub id in one line, Ctrl-C (a real SIGINT to a real ``rlhf ppo``)
in one line with the checkpoint to resume from, a plain run that ``rlhf results register`` accepts, and a refused
``register`` that creates nothing.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

RLHF = str(Path(sys.executable).parent / "rlhf")
REPO = Path(__file__).resolve().parents[2]


def plain_env(**extra: str) -> dict[str, str]:
    """The environment of a plain ``rlhf`` command: no ``RLHF_HOME`` (an earlier import of flows.rlhf sets it),
    no metrics file chosen by a caller, no bars."""
    env = {k: v for k, v in os.environ.items() if k not in ("RLHF_HOME", "RLHF_METRICS_FILE")}
    return {**env, "CI": "true", **extra}


def timed(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([RLHF, *args], capture_output=True, text=True, cwd=cwd, env=env or plain_env(), timeout=120)
    return proc, time.monotonic() - start


def best_of_3(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, list[float]]:
    """``rlhf ARGS`` up to three times, stopping at the first run under 2 s: (the last run, each run's seconds)."""
    tries: list[float] = []
    for _ in range(3):
        proc, seconds = timed(args, cwd)
        tries.append(seconds)
        if seconds < 2.0:
            break
    return proc, tries


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released): a connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ help and argument errors, before heavy imports
@pytest.mark.parametrize("name", ["ppo", "sft", "eval", "generate"])
def test_trainer_help_returns_within_2_s(name, tmp_path):
    """`rlhf ppo --help` took 15 s (sft 16 s, eval 7 s): torch, Ray and transformers were imported first.
    The parser is now built from an import-light module: about 0.35 s on an idle 2-core machine. The best of up to
    three tries counts (a neighbour's load can stretch one try: 2.1 s was seen at load average 14 on 2 cores);
    the old 7-16 s cannot pass that way."""
    proc, tries = best_of_3([name, "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: rlhf {name} ") and "KEY=VALUE" in proc.stdout
    assert min(tries) < 2.0, f"rlhf {name} --help took {', '.join(f'{t:.1f}' for t in tries)} s"


def test_bad_flag_exits_2_quickly(tmp_path):
    proc, tries = best_of_3(["ppo", "--bogus-flag"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == "rlhf ppo: error: unrecognized arguments: --bogus-flag"
    assert min(tries) < 2.0, f"took {', '.join(f'{t:.1f}' for t in tries)} s"
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("args", [["ppo", "--help"], ["sft", "--help"], ["eval", "--help"], ["ppo", "--bogus"],
                                  ["ppo", "no.such_key=1"], ["sft", "no.such_key=1"], ["generate", "--help"],
                                  ["generate", "no.such_key=1"]])
def test_help_and_argument_errors_import_no_torch_ray_or_transformers(args, tmp_path):
    """The cause of the slow help, checked directly (timing on a loaded machine varies): after `rlhf ARGS`
    answers, none of the heavy packages is in ``sys.modules``; with RLHF_HOME (the tracked runner) too."""
    code = ("import sys, rlhf_cli\ncode = rlhf_cli.main(sys.argv[1:])\n"
            "print(sorted(m for m in ('torch', 'ray', 'transformers', 'duckdb', 'mlflow') if m in sys.modules))\n"
            "sys.exit(code)")
    for env in (plain_env(PYTHONPATH=str(REPO)), plain_env(PYTHONPATH=str(REPO), RLHF_HOME=str(tmp_path / "home"))):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode in (0, 1, 2), proc.stderr
        assert proc.stdout.splitlines()[-1] == "[]", (args, proc.stdout[-500:])


@pytest.mark.parametrize("name", ["ppo", "sft"])
def test_a_missing_data_file_is_refused_before_torch_is_imported(name, tmp_path):
    """A new user's `rlhf ppo data.train_files=<typo>` answered after 26-58 s at load 13 (torch, peft, transformers
    imported and Ray started first); the file is now looked up before those imports: one line, no heavy module."""
    code = ("import sys, rlhf_cli\ncode = rlhf_cli.main(sys.argv[1:])\n"
            "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))\nsys.exit(code)")
    missing = tmp_path / "typo.parquet"
    proc = subprocess.run([sys.executable, "-c", code, name, f"data.train_files={missing}"], capture_output=True,
                          text=True, env=plain_env(PYTHONPATH=str(REPO)), cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == f"rlhf {name}: error: data.train_files: data file {missing} does not exist"
    assert proc.stdout.splitlines()[-1] == "[]"


# ------------------------------------------------------------------ a hub id that cannot load here
def fake_hub_cache(hub_cache: Path, repo_id: str, model_dir: str) -> None:
    """``repo_id`` in a Hugging Face hub cache, laid out as ``huggingface_hub`` writes it (refs/main → a
    snapshot folder holding the files)."""
    import shutil

    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, repo / "snapshots" / commit)


def test_unreachable_hub_id_is_one_line_in_seconds(tmp_path):
    """Today: 122 lines and two tracebacks after 57 s of retries. The hub endpoint here is a real closed
    loopback port (connection refused), so the test means the same with or without a network."""
    from bad_input_fixtures import good_rows, ppo_overrides, write_parquet

    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    endpoint = f"http://127.0.0.1:{closed_port()}"
    env = plain_env(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HTTPS_PROXY", "https_proxy",
                "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(var, None)
    proc, seconds = timed(["ppo", *ppo_overrides("Qwen/Qwen2.5-0.5B", data)], tmp_path, env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"rlhf ppo: error: actor_rollout_ref.model.path='Qwen/Qwen2.5-0.5B' is a Hugging Face "
                           f"hub id, {endpoint} cannot be reached (ConnectionRefusedError: ")
    assert f"not in the local cache ({tmp_path / 'hf' / 'hub'}): give a local model folder" in line
    assert "HF_HUB_OFFLINE=1" in line
    # about 2 s idle; huggingface_hub's back-off alone is 1+2+4+8+8 = 23 s per file, so 20 s still tells them apart
    assert seconds < 20, f"took {seconds:.1f} s"

    # offline, not cached: says so, without trying the network
    env["HF_HUB_OFFLINE"] = "1"
    proc, seconds = timed(["ppo", *ppo_overrides("Qwen/Qwen2.5-0.5B", data)], tmp_path, env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"rlhf ppo: error: actor_rollout_ref.model.path='Qwen/Qwen2.5-0.5B' is a Hugging Face hub id, HF_HUB_OFFLINE "
        f"is set and it is not in the local cache ({tmp_path / 'hf' / 'hub'}): give a local model folder instead, or "
        "download it where there is network (`hf download Qwen/Qwen2.5-0.5B`, huggingface_hub's CLI) and run with "
        "HF_HUB_OFFLINE=1"]


def test_cached_hub_id_points_at_hf_hub_offline_and_passes_offline(tmp_path, monkeypatch, tiny_model_dir):
    from rlhf_core.config.errors import ConfigError
    from rlhf_core.models.hub import check_hub_model, is_hub_id

    fake_hub_cache(tmp_path / "hub", "org/tiny", tiny_model_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError) as info:
        check_hub_model("critic.model.path", "org/tiny")
    assert "a copy is in the local cache: run with HF_HUB_OFFLINE=1 to use it" in str(info.value)
    assert str(info.value).startswith("critic.model.path='org/tiny' is a Hugging Face hub id and http://127.0.0.1:")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_hub_model("critic.model.path", "org/tiny")  # cached and offline: transformers loads it from the cache
    # not hub ids: a local folder (relative, without ./), a path, a URL
    monkeypatch.chdir(Path(tiny_model_dir).parent)
    assert not is_hub_id(Path(tiny_model_dir).name)
    assert not is_hub_id("/no/such/model") and not is_hub_id("s3://bucket/model") and is_hub_id("gpt2")


# ------------------------------------------------------------------ rlhf results register: a refusal creates nothing
@pytest.mark.parametrize("what", ["missing", "empty"])
def test_refused_register_creates_nothing(tmp_path, what):
    """It used to leave an empty `.rlhf` home (and a store) in the current folder before refusing."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run = tmp_path / "run"
    if what == "empty":
        run.mkdir()
        (run / "notes.txt").write_text("not a sample file")
    proc, _ = timed(["results", "register", str(run)], cwd)
    assert proc.returncode == 1
    expected = f"run folder {run} does not exist" if what == "missing" else \
        f"{run}: no sample parquet files"
    assert proc.stderr.splitlines()[-1].startswith(f"rlhf results: error: {expected}"), proc.stderr
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == (["cwd"] if what == "missing" else ["cwd", "run"])


def test_register_keeps_the_resumed_values_of_a_metrics_file(tmp_path):
    """A plain run appends to <default_local_dir>/metrics.jsonl; resumed at step 1 it logs step 2 again: the
    folder registers each (step, name) once, with the value of the run that continued."""
    from infra.run_folders import check_run_folder

    rows = [(1, 0.5), (2, 0.25), (2, 0.75), (3, 1.0)]  # step 2 logged by the interrupted run, then by the resumed
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "name": "critic/score/mean", "value": v, "timestamp": 0}) + "\n" for s, v in rows))
    _, files, got = check_run_folder(tmp_path)
    assert files == []
    assert [(r["step"], r["value"]) for r in got] == [(1, 0.5), (2, 0.75), (3, 1.0)]


# ------------------------------------------------------------------ Ctrl-C: one line with the checkpoint
def test_resume_hint_names_the_tracked_checkpoint(tmp_path):
    from rlhf_core.config import load_config
    from rlhf_core.trainer import checkpoint_manager
    from rlhf_core.trainer.commands import TRACKER_FILE, resume_hint

    assert TRACKER_FILE == checkpoint_manager.TRACKER_FILE
    root = tmp_path / "ckpt"
    cfg = load_config("ppo_trainer", [f"trainer.default_local_dir={root}", "trainer.save_freq=5",
                                      "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.name=hf"])
    assert resume_hint(cfg) == (f"no checkpoint in trainer.default_local_dir={root} yet (the first is written at "
                                "step 5 (trainer.save_freq)): a rerun starts from the beginning")
    root.mkdir()
    (root / TRACKER_FILE).write_text("10")
    assert resume_hint(cfg) == (f"last checkpoint: {root / 'global_step_10'}; to resume from it, run the same command "
                                f"again (same trainer.default_local_dir={root})")


def _session_processes(sid: int, grace_s: float) -> list[str]:
    """``ps`` lines of the processes still in session ``sid`` after up to ``grace_s`` seconds (none: ``[]``)."""
    deadline = time.monotonic() + grace_s
    while True:
        rows = subprocess.run(["ps", "-eo", "pid,sid,args"], capture_output=True, text=True).stdout.splitlines()[1:]
        left = [row for row in rows if row.split()[1] == str(sid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.slow
def test_ctrl_c_during_rlhf_ppo_is_one_line_and_the_run_registers(tiny_model_dir, tmp_path):
    """A real `rlhf ppo` (tiny model, GRPO, a checkpoint every step) gets a real SIGINT, sent to its process group
    as a terminal's Ctrl-C is, once its first checkpoint is complete: exit 130, no traceback, one line naming that
    checkpoint (or a later one) and how to resume. Its output folder then holds metrics.jsonl, which a plain
    `rlhf results register` accepts (a plain run without RLHF_HOME used to leave nothing it accepts)."""
    from bad_input_fixtures import good_rows, ppo_overrides, write_parquet

    data = write_parquet(tmp_path / "train.parquet", good_rows(8))
    ckpt = tmp_path / "ckpt"
    args = ppo_overrides(tiny_model_dir, data, "trainer.total_training_steps=200", "trainer.save_freq=1",
                         "trainer.test_freq=-1", "trainer.total_epochs=100", "ray_init.num_cpus=2")
    proc = subprocess.Popen([RLHF, "ppo", *args], cwd=tmp_path, env=plain_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    tracker, metrics = ckpt / "latest_checkpointed_iteration.txt", ckpt / "metrics.jsonl"

    def step_1_done() -> bool:  # checkpointed, and its metrics logged (the tracker comes first, within the step)
        return tracker.exists() and metrics.exists() and metrics.stat().st_size > 0

    deadline = time.monotonic() + 300
    while not step_1_done() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None and step_1_done(), "no checkpoint within 300 s"
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - sent
    assert proc.returncode == 130, err[-3000:]
    # Ctrl-C ends the command promptly: 0.7-0.9 s measured on 2 cores at load 14-17 (before: 8.6-9.2 s, Ray's at-exit
    # pause, its 1 s wait on the autoscaler monitor and the interpreter's finalization); no Ray process of the run
    # is left (the processes of this session: the run's own Ray instance and its workers)
    assert took < 5, f"{took:.1f} s from SIGINT to exit"
    assert _session_processes(proc.pid, grace_s=2.0) == [], "Ray processes left after the interrupted run"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    last = err.splitlines()[-1]
    step = int(tracker.read_text())
    assert step >= 1
    assert last == (f"rlhf ppo: interrupted; last checkpoint: {ckpt / f'global_step_{step}'}; to resume from it, run "
                    f"the same command again (same trainer.default_local_dir={ckpt})"), err[-2000:]
    assert [line for line in err.splitlines() if line.startswith("rlhf ppo:")] == [last]

    logged = {json.loads(line)["step"] for line in metrics.read_text().splitlines()}
    assert 1 in logged and max(logged) <= step + 1
    home = tmp_path / "home"
    reg, _ = timed(["results", "register", str(ckpt)], tmp_path, plain_env(RLHF_HOME=str(home)))
    assert reg.returncode == 0, reg.stderr
    assert " metric values of " in reg.stdout and reg.stdout.startswith("registered 0 samples and ")
    assert int(reg.stdout.split(" and ")[1].split()[0]) > 0


# ------------------------------------------------------------------ progress under a wall-clock budget
def test_budget_progress_shows_seconds_not_a_step_goal(tmp_path, monkeypatch):
    """Under trainer.total_training_seconds=480 the pipeline set total_training_steps=100000 and printed
    `ppo step 32/100000`; the seconds spent are the sum of the steps' timing_s/step (4.5 + 5.0 = 9.5 → `10`)."""
    from tasks.progress import StepProgress, step_line

    assert step_line(3, 20, {"timing_s/step": 4.1}) == "ppo step 3/20: 4.1 s"
    assert step_line(32, 100000, {}, budget_s=480, elapsed_s=210.4) == "ppo: 32 steps, 210/480 s:"
    f = tmp_path / "metrics.jsonl"
    f.write_text("".join(json.dumps({"step": s, "name": n, "value": v}) + "\n" for s, n, v in
                         [(1, "timing_s/step", 4.5), (1, "critic/score/mean", 0.25), (2, "timing_s/step", 5.0)]))
    progress = StepProgress(f, 100000, None, budget_s=480)
    lines: list[str] = []
    monkeypatch.setattr("tasks.progress.log_line", lines.append)
    progress.finish()
    assert lines == ["ppo: 1 steps, 4/480 s: score 0.250, 4.5 s", "ppo: 2 steps, 10/480 s: 5.0 s"]


# ------------------------------------------------------------------ no-effect settings under the chosen engine
def test_a_vllm_only_key_named_at_its_default_gets_the_notice(capsys):
    """rollout.tensor_model_parallel_size ships as 2; written as 2 on the command line with the HF engine it used
    to pass in silence (only keys set away from their default were named)."""
    from rlhf_core.cli import load_config_with_notices
    from rlhf_core.config import load_config
    from rlhf_core.config.notices import ConfigNotice

    base = ["actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=2"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config("ppo_trainer", base + ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
        load_config("ppo_trainer", base)  # not named: the default is no setting of the user's
    notices = [str(w.message) for w in caught if issubclass(w.category, ConfigNotice)]
    assert notices == ["actor_rollout_ref.rollout.tensor_model_parallel_size=2 has no effect here: it is read only by "
                       "the vllm rollout engine, and actor_rollout_ref.rollout.name='hf'."]
    # `rlhf ppo|sft|eval` print it as `rlhf config check` does: one line
    load_config_with_notices("ppo_trainer", base + ["actor_rollout_ref.rollout.gpu_memory_utilization=0.5"])
    assert capsys.readouterr().err.splitlines() == [
        "Notice: actor_rollout_ref.rollout.gpu_memory_utilization=0.5 has no effect here: it is read only by the vllm "
        "rollout engine, and actor_rollout_ref.rollout.name='hf'."]
