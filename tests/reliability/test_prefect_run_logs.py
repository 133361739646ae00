"""What a flow run shows in Prefect, below the full deployment run (tests/integration/test_prefect_server.py):
stage time limits enforced where the work runs (a real Ray job is cancelled and its worker killed), no Prefect
``timeout_seconds`` left on the pipeline's tasks (the source of one WARNING per task run), task-run names that say
what each stage did, and log lines that go to the run's logger."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import ray
import ray.cloudpickle

from conftest_services import *  # noqa: F401,F403
from tasks.deadline import StageDeadline, StageTimeoutError, split_task_options

pytestmark = pytest.mark.ray  # starts Ray: uses the fixture ray_local

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test functions run on Ray workers by value
REPO = Path(__file__).resolve().parents[2]


def _sleep_after_writing_pid(path: str, seconds: float) -> str:
    with open(path, "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(seconds)
    return "finished"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow  # Ray start-up and a worker's first start: about 40 s on 2 cores
def test_a_stage_past_its_timeout_is_cancelled_on_ray_and_named(ray_local, tmp_path):
    """A Ray job that would sleep 600 s under a 5 s limit: StageTimeoutError 5 s later, naming the stage, the limit
    and the key; the Ray worker that ran it is killed (force cancel), not left sleeping."""
    pid_file = tmp_path / "pid"
    # a job that finishes in time returns its result, with a limit or none (this also starts a worker for the
    # runtime environment, which the next call reuses: its 5 s are the job's, not a worker's start-up)
    assert StageDeadline("sft", 120).run_on_ray(_sleep_after_writing_pid, str(pid_file), 0) == "finished"
    assert StageDeadline("sft", None).run_on_ray(_sleep_after_writing_pid, str(pid_file), 0) == "finished"
    pid_file.unlink()
    started = time.monotonic()
    with pytest.raises(StageTimeoutError) as info:
        StageDeadline("sft", 5).run_on_ray(_sleep_after_writing_pid, str(pid_file), 600)
    took = time.monotonic() - started
    assert str(info.value) == ("stage sft: timed out after 5 s (the experiment's tasks.sft.timeout_seconds); "
                               "its Ray job was cancelled")
    assert 5 <= took < 20, took  # the limit, plus at most a few seconds of cancelling
    pid = int(pid_file.read_text())  # the job had started: it was running when the limit came
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid), f"the Ray worker {pid} still runs the cancelled job"


def test_a_deadline_that_passed_refuses_before_the_next_step():
    deadline = StageDeadline("prepare_data", 0.05)
    assert 0 < deadline.left() <= 0.05
    time.sleep(0.06)
    with pytest.raises(StageTimeoutError, match=r"^stage prepare_data: timed out after 0.05 s \(the experiment's "
                                                r"tasks.prepare_data.timeout_seconds\)$"):
        deadline.left()
    assert StageDeadline("evaluate", None).left() is None
    # a stage the flow context names no limit for (a task called outside the flow) has none
    assert StageDeadline.of("sft", {"timeouts": {"ppo_segment": 5.0}}).seconds is None
    assert StageDeadline.of("ppo_segment", {"timeouts": {"ppo_segment": 5.0}}).seconds == 5.0


def test_task_options_split_into_prefect_options_and_stage_limits():
    options, timeouts = split_task_options({"sft": {"retries": 1, "retry_delay_seconds": 30, "timeout_seconds": 60},
                                            "evaluate": {"retries": 2}})
    assert options == {"sft": {"retries": 1, "retry_delay_seconds": 30}, "evaluate": {"retries": 2}}
    assert timeouts == {"sft": 60.0}


def test_the_pipeline_tasks_carry_no_prefect_timeout_and_the_flow_context_carries_the_experiments_limits(tmp_path):
    """Prefect warns on every sync task run that has a ``timeout_seconds`` (it runs in a worker thread): none of the
    configured tasks has one; the experiment's ``tasks:`` limits (defaults in flows/experiment.py, or the file's)
    reach the tasks through the context, its retries the Prefect options."""
    from flows.pipeline_steps import configured_tasks
    from flows.settings import resolve_settings
    from tasks.common import make_context

    s = resolve_settings({})
    tasks = {t.name: t for t in configured_tasks(s)}
    assert set(tasks) == {"prepare_data", "build_model", "filter_prompts", "sft", "ppo_segment", "validate",
                          "evaluate", "register_model"}
    assert {name: t.timeout_seconds for name, t in tasks.items()} == dict.fromkeys(tasks)  # all None
    # the shipped defaults (flows/experiment.py TasksSpec), written out here
    assert {name: (t.retries, t.retry_delay_seconds) for name, t in tasks.items()} == {
        "prepare_data": (2, 10), "build_model": (1, 10), "filter_prompts": (2, 10), "sft": (1, 30),
        "ppo_segment": (2, 30), "validate": (1, 30), "evaluate": (1, 30), "register_model": (1, 30)}
    ctx = make_context("/h", "rlhf", None, None, "/h/run", timeouts=split_task_options(s.task_options)[1])
    assert ctx["timeouts"] == {"prepare_data": 3600.0, "build_model": 3600.0, "filter_prompts": 3600.0,
                               "sft": 21600.0, "ppo_segment": 43200.0, "validate": 7200.0, "evaluate": 7200.0,
                               "register_model": 3600.0}
    # an experiment file's own options: the fields it sets win, the others keep their defaults
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\ndata: {generator: countdown}\n"
                    "tasks:\n  sft: {retries: 4, timeout_seconds: 60}\n  evaluate: {timeout_seconds: null}\n")
    s = resolve_settings({"experiment_file": str(mine)})
    tasks = {t.name: t for t in configured_tasks(s)}
    assert (tasks["sft"].retries, tasks["sft"].retry_delay_seconds, tasks["ppo_segment"].retries) == (4, 30, 2)
    timeouts = split_task_options(s.task_options)[1]
    assert timeouts["sft"] == 60.0 and "evaluate" not in timeouts and timeouts["validate"] == 7200.0


def test_task_run_names_say_what_each_stage_did(tmp_path):
    from tasks import runlog

    train = tmp_path / "train_64.parquet"
    pd.DataFrame({"prompt": [f"q{i}" for i in range(64)]}).to_parquet(train)
    assert runlog.prepare_data_run_name({"data": {"generator": "gsm8k", "train_prompts": 64, "val_prompts": 8}}) == \
        "prepare_data · gsm8k · 64 train, 8 val prompts"
    assert runlog.prepare_data_run_name({"data": {"generator": "countdown", "train_prompts": 0,
                                                  "val_prompts": -1}}) == \
        "prepare_data · countdown · all train, all val prompts"  # <= 0 keeps every row
    assert runlog.prepare_data_run_name({"data": {"generator": None, "train_prompts": 5, "val_prompts": -1}}) == \
        "prepare_data · files · 5 train, all val prompts"  # the experiment's train_files/val_files
    assert runlog.build_model_run_name({"sizes": {"vocab_size": 2000, "hidden_size": 128, "num_layers": 4}}) == \
        "build_model · 4 layers × 128 hidden, vocab 2000"
    assert runlog.build_model_run_name({"sizes": {}}) == "build_model · default sizes"
    # the rows come from the parquet footer; the last trainer.total_epochs override wins
    sft = {"train_file": str(train), "overrides": ["trainer.total_epochs=3", "optim.lr=1e-3", "trainer.total_epochs=1"]}
    assert runlog.sft_run_name(sft) == "sft · 64 rows, 1 epoch"
    assert runlog.sft_run_name({**sft, "overrides": ["trainer.total_epochs=2"]}) == "sft · 64 rows, 2 epochs"
    assert runlog.sft_run_name({"train_file": str(tmp_path / "gone.parquet"), "overrides": []}) == \
        "sft · gone.parquet"  # an unreadable file never fails the task over its name
    assert runlog.ppo_segment_run_name(2, 2, 11, 20) == "ppo_segment 2/2 (steps 11-20)"
    assert runlog.evaluate_run_name({"global_step": 20}) == "evaluate · step 20"


def test_every_stage_task_names_its_runs_with_a_callable_prefect_calls_with_the_parameters():
    from prefect._internal.engine import resolve_custom_task_run_name

    from tasks.stages import build_model, evaluate, prepare_data, sft

    for task, params, name in [
        (prepare_data, {"data": {"generator": "gsm8k", "train_prompts": 16, "val_prompts": 4}},
         "prepare_data · gsm8k · 16 train, 4 val prompts"),
        (build_model, {"sizes": {"num_layers": 2}}, "build_model · 2 layers"),
        (evaluate, {"global_step": 1}, "evaluate · step 1"),
    ]:
        assert resolve_custom_task_run_name(task, params) == name
    assert sft.task_run_name is not None


def test_log_line_outside_a_run_prints(capsys):
    from tasks.runlog import log_line

    assert log_line("stage sft: FINISHED, 1.0 s", logging.INFO) == "stage sft: FINISHED, 1.0 s"
    assert capsys.readouterr().out == "stage sft: FINISHED, 1.0 s\n"


_FSDP_VIEW_SCRIPT = """
import os, warnings
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"], RANK="0", WORLD_SIZE="1",
                  RLHF_FP32_LINEAR="onednn")
import torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, Qwen2Config
from rlhf_core.workers.fsdp_utils import apply_fsdp2
from rlhf_core.kernels.onednn_linear import use_onednn_linears
from rlhf_core.distributed.worker_group import rendezvous_store
store = rendezvous_store(0, 1, "127.0.0.1", int(os.environ["PORT"]))  # 127.0.0.1 only; env:// listens on all
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, tie_word_embeddings=True)
model = AutoModelForCausalLM.from_config(cfg)
changed = use_onednn_linears(model)
apply_fsdp2(model, {}, single_rank=True)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    model(input_ids=torch.randint(0, 100, (2, 8))).logits.sum().backward()
print(changed, sum("returned a view tensor" in str(w.message) for w in seen))
dist.destroy_process_group()
"""


@pytest.mark.slow  # a fresh process importing torch and transformers: 20-60 s on 2 busy cores
def test_fsdp2_with_onednn_linears_returns_no_view_tensor(free_port):
    """The six "FSDP2-wrapped module (FSDPQwen2ForCausalLM) returned a view tensor" warnings of a run on a non-Intel
    CPU came from the oneDNN linear (its product reshaped with ``.view``: the LM head's logits, the root module's
    output, were a view). It now returns the product's buffer as matmul does (``_unsafe_view``): a real FSDP2 model
    with oneDNN linears (one gloo rank), forward and backward, warns nothing; the values are F.linear's."""
    import subprocess

    import torch

    from rlhf_core.kernels.onednn_linear import OneDNNLinear, onednn_available

    if not onednn_available():
        pytest.skip("this torch build has no oneDNN linear")
    x, w, b = torch.randn(2, 5, 8, requires_grad=True), torch.randn(6, 8), torch.randn(6)
    y = OneDNNLinear.apply(x, w, b)
    assert y._base is None and y.shape == (2, 5, 6)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    proc = subprocess.run([sys.executable, "-c", _FSDP_VIEW_SCRIPT], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PORT": str(free_port)}, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 15 linears of the 2-layer model became oneDNN ones (7 per layer + the LM head); no view-tensor warning
    assert proc.stdout.split() == ["15", "0"], proc.stdout + proc.stderr[-2000:]
