"""The ``rlhf`` command: ``--help`` on every subcommand, and how errors are shown (one line for an input error,
a traceback for anything else), through the real entry point in a subprocess where the display matters."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import rlhf_cli
from tests.paths import REPO

pytestmark = pytest.mark.ray  # starts Ray through an entry point (the rlhf CLI, a trainer, the flow)


def rlhf(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``rlhf ARGS`` as the console script runs it, in a fresh interpreter."""
    # without RLHF_HOME (an earlier import of flows.rlhf sets it in this process): the plain core commands;
    # with it, ppo/eval run tracked (rlhf_cli.tracked, tested in test_infra_manual_runs)
    env = {k: v for k, v in os.environ.items() if k != "RLHF_HOME"} | {"PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", "import sys, rlhf_cli; sys.exit(rlhf_cli.main())", *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize("name", sorted(rlhf_cli.SUBCOMMANDS))
def test_every_subcommand_has_help(name, capsys):
    assert rlhf_cli.main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rlhf {name} ")  # the prog is the command a user types, not python -m ...
    assert "-h, --help" in out


@pytest.mark.parametrize("name,config_name", [("ppo", "ppo_trainer"), ("sft", "sft_trainer"),
                                              ("eval", "evaluation"), ("generate", "generation")])
def test_trainer_help_documents_overrides_and_where_keys_are(name, config_name, capsys):
    assert rlhf_cli.main([name, "-h"]) == 0
    out = capsys.readouterr().out
    assert "KEY=VALUE" in out and f"{config_name}.yaml" in out
    assert f"rlhf config show --config-name {config_name}" in out


def test_pipeline_help_documents_every_flow_parameter(capsys):
    from flows.rlhf import PIPELINE_OPTIONS, rlhf as flow

    params = list(inspect.signature(flow.fn).parameters)
    deployment_only = ["experiment_content", "experiment_sha256", "experiment_base_dir"]  # rlhf deploy sets them
    assert len(params) == 23 and list(PIPELINE_OPTIONS) == [p for p in params if p not in deployment_only]
    assert rlhf_cli.main(["pipeline", "--help"]) == 0
    out = capsys.readouterr().out
    assert "python -m flows.rlhf" not in out.splitlines()[0]
    for name in PIPELINE_OPTIONS:
        assert f"--{name.replace('_', '-')}" in out, name
        assert PIPELINE_OPTIONS[name][1].split()[0] in out, name  # its help text, not only the flag


def test_pipeline_experiment_option_is_a_file_when_it_looks_like_one_else_the_mlflow_name(tmp_path):
    from flows.rlhf import pipeline_params

    assert pipeline_params(["--experiment", "experiments/countdown.yaml"]) == {
        "experiment_file": "experiments/countdown.yaml"}
    assert pipeline_params(["--experiment", "learn"]) == {"experiment": "learn"}
    extensionless = tmp_path / "nightly"  # an existing file without .yaml is a file too
    extensionless.write_text("name: x\n")
    assert pipeline_params(["--experiment", str(extensionless)]) == {"experiment_file": str(extensionless)}
    assert pipeline_params(["--experiment-name", "x.yaml", "--experiment-file", "e.yaml"]) == {
        "experiment": "x.yaml", "experiment_file": "e.yaml"}  # --experiment-name is always the name
    assert pipeline_params(["--experiment", "e.yaml", "--experiment-name", "learn", "--dry-run"]) == {
        "experiment_file": "e.yaml", "experiment": "learn", "dry_run": True}


def test_pipeline_experiment_a_mistyped_path_is_a_usage_error_not_the_default_experiment(capsys):
    # a new user's trial: `--experiment experiments/countdwn` (no such file) dry-ran gsm8k_tiny.yaml under the MLflow
    # experiment 'experiments/countdwn'; a value with '/' that is no file is a usage error (exit 2) naming it
    from flows.rlhf import pipeline_params

    with pytest.raises(SystemExit) as info:
        pipeline_params(["--experiment", "experiments/countdwn", "--dry-run"])
    assert info.value.code == 2
    assert "--experiment experiments/countdwn: no such file" in capsys.readouterr().err
    assert pipeline_params(["--experiment-name", "team/nightly"]) == {"experiment": "team/nightly"}


def test_merge_accepts_verls_command_form(tmp_path, capsys):
    from rlhf_core.workers.merger import main

    # verl: python -m verl.model_merger merge --backend fsdp --local_dir … --target_dir …; the folder here is not
    # a checkpoint, so both forms get as far as reading it and report that in one line (exit 1, not 2 = usage)
    for argv in (["merge", "--backend", "fsdp", "--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "o")],
                 ["--local-dir", str(tmp_path), "--target-dir", str(tmp_path / "o")]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("rlhf merge: error: ") and "config.json not found" in err[0]
    assert main(["test", "--local_dir", str(tmp_path), "--target_dir", "o"]) == 2  # verl's other operation: usage


def test_input_errors_are_one_line_without_traceback(tmp_path):
    missing = tmp_path / "nope.parquet"
    r = rlhf("eval", f"data.path={missing}")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"rlhf eval: error: data.path {str(missing)!r} does not exist"]
    r = rlhf("config", "check", "data.train_batch_sise=4")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0].startswith("rlhf config: error: ") and "data.train_batch_size" in lines[0]  # did you mean
    r = rlhf("ppo", "--bogus-flag")  # a bad command line: argparse's usage, exit 2
    assert r.returncode == 2 and r.stderr.startswith("usage: rlhf ppo")


def test_internal_errors_show_the_traceback(tmp_path):
    # a user reward file with a bug (KeyError when it is imported) is not an input error: the traceback must reach
    # the user. (A scorer that raises while scoring is a per-sample failure: scored 0 and counted, see
    # tests/reliability/test_bad_reward.py.)
    data = tmp_path / "resp.parquet"
    pd.DataFrame({"data_source": ["openai/gsm8k"], "prompt": [[{"role": "user", "content": "q"}]],
                  "responses": [["#### 1"]], "reward_model": [{"style": "rule", "ground_truth": "1"}],
                  "extra_info": [{"index": 0}]}).to_parquet(data)
    fn = tmp_path / "score.py"
    fn.write_text("BONUS = {'acc': 1.0}['score']\n"
                  "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    return 1.0\n")
    r = rlhf("eval", f"data.path={data}", f"custom_reward_function.path={fn}")
    assert r.returncode == 1
    assert "Traceback (most recent call last)" in r.stderr and "KeyError: 'score'" in r.stderr
    assert f'File "{fn}"' in r.stderr  # down to the user's line


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    # `rlhf results sql ... | head -1`: head exits while the table is printed; the writer gets EPIPE. A shell tool
    # stops with 141 (128 + SIGPIPE) and no traceback; before, Python printed BrokenPipeError's traceback
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has already gone
    env = {k: v for k, v in os.environ.items() if k != "RLHF_HOME"} | {"PYTHONPATH": str(REPO),
                                                                       "RLHF_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-c", "import sys, rlhf_cli; sys.exit(rlhf_cli.main())", "results", "sql",
                        "select range from range(200000)"], stdout=write_end, stderr=subprocess.PIPE, text=True,
                       env=env, timeout=120)
    os.close(write_end)
    assert r.returncode == 141 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    # a BrokenPipeError that is not stdout's (a socket, a child's pipe) is a failure: it keeps its traceback
    from rlhf_core.cli import run_command

    def broken(argv):
        raise BrokenPipeError(32, "Broken pipe (a socket)")

    with pytest.raises(BrokenPipeError):
        run_command("rlhf x", broken, [])


def test_exit_now_runs_the_at_exit_handlers_and_skips_finalization():
    # what an interrupted `rlhf ppo` ends with (rlhf_cli.main): the at-exit handlers run (Ray's shutdown, logging's),
    # buffered output is flushed, exit code 130; the finalization (here a module global's __del__) does not run
    code = ("import atexit, rlhf_core.cli as cli\n"
            "class Late:\n    def __del__(self):\n        print('finalized', flush=True)\n"
            "late = Late()\n"
            "atexit.register(lambda: print('at-exit handler ran'))\n"
            "print('buffered line')\n"  # stdout to a pipe is block-buffered: only the flush writes it
            "cli.exit_now(130)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (proc.returncode, proc.stdout) == (130, "buffered line\nat-exit handler ran\n"), proc.stderr
    plain = subprocess.run([sys.executable, "-c", code.replace("cli.exit_now(130)", "pass")], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert plain.stdout.endswith("finalized\n")  # the check above can fail: a plain exit does finalize


def test_exit_now_ends_an_idle_thread_pool():
    # the reward stage's executor (reward_model.launch_reward_fn_async) keeps an idle non-daemon worker thread: a
    # plain join of it never returns (its exit hook wakes it); exit_now must end as a normal exit does
    code = ("import concurrent.futures, rlhf_core.cli as cli\n"
            "pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)\n"
            "assert pool.submit(lambda: 41 + 1).result() == 42\n"
            "print('task done')\n"
            "cli.exit_now(130)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (proc.returncode, proc.stdout) == (130, "task done\n"), proc.stderr


def test_unknown_command_names_the_nearest():
    r = rlhf("evl")
    assert r.returncode == 2 and "did you mean 'eval'?" in r.stderr


def test_pipeline_bad_override_value_names_the_key_and_the_reason():
    # the flow's up-front check used to keep only its message's first line ("... invalid overrides ...: Invalid
    # config:"), dropping the line that says which key and why
    from flows.rlhf import check_parameters

    countdown = str(REPO / "experiments" / "countdown.yaml")
    error = check_parameters({"experiment_file": countdown, "ppo_overrides": ["data.train_batch_size=abc"]})
    assert "ppo stage" in error and "data.train_batch_size='abc': expected int, got str" in error
    assert check_parameters({"experiment_file": countdown}) is None


def test_pipeline_gsm8k_dir_without_the_jsonl_files_is_refused_up_front(tmp_path):
    # a folder that exists but holds no GSM8K used to pass the check and fail in prepare_data, after the services
    # had started; the countdown generator makes its data and ignores gsm8k_dir
    from flows.rlhf import check_parameters

    countdown = str(REPO / "experiments" / "countdown.yaml")

    (tmp_path / "train.jsonl").write_text("")
    error = check_parameters({"gsm8k_dir": str(tmp_path)})
    assert error == f"gsm8k_dir: {tmp_path} has no test.jsonl (GSM8K's original question/answer jsonl files)"
    # a file:// URL is the same local folder (it used to skip the check and fail in prepare_data)
    assert check_parameters({"gsm8k_dir": f"file://{tmp_path}"}).startswith(f"gsm8k_dir: file://{tmp_path} has no")
    assert check_parameters({"experiment_file": countdown, "gsm8k_dir": str(tmp_path)}) is None
    # countdown does not read gsm8k_dir at all: a missing folder (the Makefile's default GSM8K_DIR in a clone without
    # ../shared) must not stop `make learn`
    assert check_parameters({"experiment_file": countdown, "gsm8k_dir": str(tmp_path / "absent")}) is None
    absent = tmp_path / "absent"
    assert check_parameters({"gsm8k_dir": str(absent)}) == f"gsm8k_dir: {absent} does not exist"
    (tmp_path / "test.jsonl").write_text("")
    assert check_parameters({"gsm8k_dir": str(tmp_path)}) is None


def test_progress_bars_are_off_when_stderr_is_redirected(monkeypatch):
    # transformers' "Loading weights" bar follows huggingface_hub's switch; a file or pipe gets no bar, a terminal
    # keeps it, and a user's own setting wins
    import io

    from rlhf_core.progress import quiet_progress_bars_when_redirected

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    assert not quiet_progress_bars_when_redirected(Tty()) and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    assert quiet_progress_bars_when_redirected(io.StringIO()) and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    assert not quiet_progress_bars_when_redirected(io.StringIO()) and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"



def test_the_flow_module_turns_the_bars_off_when_redirected():
    # `make demo` runs `python -m flows.rlhf` and a Prefect worker's flow run imports flows/rlhf.py, neither through
    # `rlhf`: their redirected logs still had 9 "Loading weights" / "Writing model shards" bars from the Ray workers
    # (new-user trial). Importing the module sets the switch when stderr is a pipe, keeps a user's own setting.
    code = "import os, flows.rlhf; print(os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'))"
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    for given, expected in ((None, "1"), ("0", "0")):
        run_env = {**env, "PYTHONPATH": str(REPO), **({"HF_HUB_DISABLE_PROGRESS_BARS": given} if given else {})}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=run_env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.splitlines()[-1] == expected


def test_usage_lists_every_command_in_one_column(capsys):
    # `rlhf --help` printed "experiment experiment files: ..." (the name ran into its help at a fixed width 9)
    assert rlhf_cli.main(["--help"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  ")]
    assert [r.split()[0] for r in rows] == list(rlhf_cli.SUBCOMMANDS)
    width = len("  experiment  ")  # the longest name and two spaces
    assert all(r[width - 2:width] == "  " and r[width] != " " for r in rows), rows
