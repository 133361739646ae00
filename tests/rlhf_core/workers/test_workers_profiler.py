"""The real workers' torch profiler: which role blocks they read, which ranks record, where the traces go, what they
record (contents, schedule, step range, discrete stages), relocation and the finish hook."""
from __future__ import annotations

import json
import logging
import os
import re
import time

import pytest
import torch
from omegaconf import OmegaConf

from rlhf_core.config import ConfigError, load_config
from rlhf_core.trainer.profiling import StepProfiler
from rlhf_core.workers import torch_trace
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from rlhf_core.workers.profiler import ProfiledWorker, WorkerProfiler, profiled_stage, profiles_this_rank
from rlhf_core.workers.reward_model import RewardModelWorker

A = "actor_rollout_ref."


def _cfg(tmp_path, *overrides):
    return load_config("ppo_trainer", ["global_profiler.tool=torch", f"global_profiler.save_path={tmp_path}",
                                       "global_profiler.steps=[1]", *overrides])


def test_rollout_block_alone_enables_the_actor_rollout_worker(tmp_path):
    cfg = _cfg(tmp_path, "actor_rollout_ref.rollout.profiler.enable=True")
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout")
    assert worker.profiler_config().enable  # actor's block is off, the rollout's is on: union
    worker.start_profile(1)
    torch.randn(32, 32) @ torch.randn(32, 32)
    [path] = worker.stop_profile()
    assert path == str(tmp_path / "step_1" / "actor_rank_0.json")
    assert "aten::mm" in {e.get("name") for e in json.loads(open(path).read())["traceEvents"]}
    # a reference-only worker reads only the ref block (off): nothing is recorded
    ref = ActorRolloutRefWorker(cfg, role="ref")
    ref.start_profile(1)
    assert ref.stop_profile() == []


def test_critic_and_reward_model_read_their_own_blocks(tmp_path):
    cfg = _cfg(tmp_path, "critic.profiler.enable=True")
    assert CriticWorker(cfg).profiler_config().enable and not RewardModelWorker(cfg).profiler_config().enable
    critic = CriticWorker(cfg)
    critic.start_profile(4)
    assert critic.stop_profile() == [str(tmp_path / "step_4" / "critic_rank_0.json")]


def test_rank_selection():
    block = OmegaConf.create({"tool": "torch", "enable": True, "all_ranks": False, "ranks": [], "save_path": "x"})
    assert [profiles_this_rank(block, r) for r in range(3)] == [True, False, False]  # [] → rank 0
    block.ranks = [1, 2]
    assert [profiles_this_rank(block, r) for r in range(3)] == [False, True, True]
    block.all_ranks = True
    assert all(profiles_this_rank(block, r) for r in range(3))
    block.tool = None  # global_profiler.tool unset: nothing, whatever the block says
    assert not profiles_this_rank(block, 0) and not WorkerProfiler(block, 0, "actor").active


# ---- what a trace records: contents, schedule, step range, stages (a WorkerProfiler driven directly) ----------

def _block(tmp_path, **torch_keys):
    """A role's profiler block as the config has it (actor's keys), with ``torch_keys`` in ``tool_config.torch``."""
    cfg = _cfg(tmp_path, "actor_rollout_ref.actor.profiler.enable=True",
               *(f"actor_rollout_ref.actor.profiler.tool_config.torch.{k}={v}" for k, v in torch_keys.items()))
    return cfg.actor_rollout_ref.actor.profiler


def _events(path, name="aten::mm"):
    return [e for e in json.loads(open(path).read())["traceEvents"] if e.get("name") == name]


def _four_mini_batches(prof, step=1):
    """One profiled step whose update runs 4 mini-batches of one matmul each; returns the step's trace files."""
    prof.start(step)
    for _ in range(4):
        torch.randn(8, 8) @ torch.randn(8, 8)
        torch_trace.mini_batch_done()  # what run_update calls after each mini-batch
    return prof.stop()


def test_contents_shapes_records_input_shapes(tmp_path):
    [plain] = _four_mini_batches(WorkerProfiler(_block(tmp_path / "a"), 0, "actor"))
    [shaped] = _four_mini_batches(WorkerProfiler(_block(tmp_path / "b", contents="[shapes]"), 0, "actor"))
    # record_shapes adds each operator's input sizes to its event: two 8x8 operands
    assert {str(e["args"].get("Input Dims")) for e in _events(shaped)} == {"[[8, 8], [8, 8]]"}
    assert all("Input Dims" not in e["args"] for e in _events(plain))  # [] = cpu(+cuda) only


def test_schedule_and_step_range_keep_only_the_chosen_mini_batches(tmp_path):
    [full] = _four_mini_batches(WorkerProfiler(_block(tmp_path / "full"), 0, "actor"))
    assert len(_events(full)) == 4  # no schedule: every mini-batch
    # active=1 (repeat 0 = one window per whole-step trace): the first mini-batch only, saved when it ends
    [one] = _four_mini_batches(WorkerProfiler(_block(tmp_path / "one", **{"schedule.active": 1}), 0, "actor"))
    assert len(_events(one)) == 1
    # two cycles of (wait 1, active 1): mini-batches 2 and 4 (1-based), one window and one file each
    prof = WorkerProfiler(_block(tmp_path / "cyc", **{"schedule.wait": 1, "schedule.active": 1,
                                                      "schedule.repeat": 2}), 0, "actor")
    first, second = _four_mini_batches(prof)
    assert second == first.replace(".json", "_part1.json")
    assert len(_events(first)) == len(_events(second)) == 1
    # skip_first 3, active 1: the 4th only
    [skip] = _four_mini_batches(WorkerProfiler(_block(tmp_path / "skip", **{"schedule.skip_first": 3,
                                                                            "schedule.active": 1}), 0, "actor"))
    assert len(_events(skip)) == 1
    # verl 0.6's step_start/step_end: mini-batches [1, 3) (0-based) = 2 of the 4
    [ranged] = _four_mini_batches(WorkerProfiler(_block(tmp_path / "rng", step_start=1, step_end=3), 0, "actor"))
    assert len(_events(ranged)) == 2


def test_the_update_loop_advances_the_schedule(tmp_path):
    from rlhf_core.protocol import Batch
    from rlhf_core.workers.update_loop import UpdateSchedule, run_update

    model = torch.nn.Linear(4, 1)
    batch = Batch({"x": torch.randn(8, 4), "response_mask": torch.ones(8, 2)})

    def micro_loss(mb, n_tok, n_seq):
        return model(mb["x"]).pow(2).sum() / n_seq, {}

    counts = []
    for name, keys in (("all", {}), ("one", {"schedule.active": 1})):
        prof = WorkerProfiler(_block(tmp_path / name, **keys), 0, "actor")
        prof.start(1)
        run_update("actor", model, torch.optim.SGD(model.parameters(), lr=0.1), batch,
                   UpdateSchedule(ppo_epochs=1, mini_batch_size=2, micro_batch_size=2), micro_loss)
        [path] = prof.stop()
        counts.append(len(_events(path, "aten::addmm")))  # one Linear forward per mini-batch
    assert counts == [4, 1]  # 8 rows / 2 per mini-batch = 4 mini-batches; the schedule keeps the first


class _Stages(ProfiledWorker):
    profiler_role, profiler_key = "actor", "actor_rollout_ref.actor.profiler"

    def __init__(self, config):
        self.config = config

    @profiled_stage("compute_log_prob")
    def compute_log_prob(self):
        return torch.randn(8, 8) @ torch.randn(8, 8)

    @profiled_stage("update_actor", scheduled=True)
    def update_actor(self):
        self.compute_log_prob()  # a stage inside a stage (the actor's own old-log-prob pass)
        for _ in range(3):
            torch.randn(8, 8) @ torch.randn(8, 8)
            torch_trace.mini_batch_done()


def test_discrete_writes_one_trace_per_stage_and_schedules_only_the_update(tmp_path):
    cfg = _cfg(tmp_path, "actor_rollout_ref.actor.profiler.enable=True",
               "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True",
               "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=1")
    worker = _Stages(cfg)
    worker.start_profile(2)
    worker.compute_log_prob(), worker.compute_log_prob(), worker.update_actor()
    files = worker.stop_profile()
    step = tmp_path / "step_2"
    # repeat 0 in a discrete update trace: every window until the stage ends, here one per mini-batch (active 1);
    # the window opened by the last mini-batch's end holds none and is not written; the log-prob pass inside the
    # update is in the update's first window (2 matmuls there), not a trace of its own
    update = [str(step / f"actor_update_actor_rank_0{s}.json") for s in ("", "_part1", "_part2")]
    assert files == [str(step / "actor_compute_log_prob_rank_0.json"),
                     str(step / "actor_compute_log_prob_1_rank_0.json"), *update]
    assert [len(_events(f)) for f in files] == [1, 1, 2, 1, 1]
    assert _events(update[0], "compute_log_prob")
    # a whole-step trace instead labels each stage with a range named after it
    cfg.actor_rollout_ref.actor.profiler.tool_config.torch.discrete = False
    worker = _Stages(cfg)
    worker.start_profile(3)
    worker.compute_log_prob()
    [path] = worker.stop_profile()
    assert path == str(tmp_path / "step_3" / "actor_rank_0.json") and _events(path, "compute_log_prob")


def test_relocate_moves_the_traces_and_the_finish_hook_sees_them(tmp_path):
    out = tmp_path / "hook.txt"
    cfg = _cfg(tmp_path, "critic.profiler.enable=True", "global_profiler.relocate_results=True",
               f"global_profiler.finish_hook_cmd='echo $VERL_PROFILE_RANK $VERL_PROFILE_TRACES >> {out}'")
    critic = CriticWorker(cfg)
    critic.start_profile(1)
    assert critic.stop_profile(run_hook=False) == [str(tmp_path / "step_1_critic_rank_0.json")]
    assert sorted(os.listdir(tmp_path)) == ["step_1_critic_rank_0.json"]  # moved up; the empty step folder is gone
    assert not out.exists()  # not the last profiled step: no hook yet
    critic.start_profile(3)
    critic.stop_profile(run_hook=True)
    # once, after the last profiled step, with every trace this worker wrote
    assert out.read_text() == f"0 {tmp_path}/step_1_critic_rank_0.json {tmp_path}/step_3_critic_rank_0.json\n"


def test_finish_hook_ranks_and_a_failing_hook(tmp_path, caplog):
    block = _block(tmp_path, contents="[cpu]")
    block.finish_hook_cmd = f"touch {tmp_path}/ran_$VERL_PROFILE_RANK"
    block.finish_hook_ranks = [1]
    for r in range(3):  # rank 0 is profiled; the hook runs on rank 1 only, though rank 1 recorded nothing
        WorkerProfiler(block, r, "actor").stop(run_hook=True)
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("ran_")) == ["ran_1"]
    block.finish_hook_all_ranks = True
    WorkerProfiler(block, 2, "actor").stop(run_hook=True)
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("ran_")) == ["ran_1", "ran_2"]
    block.finish_hook_all_ranks = False
    block.finish_hook_cmd, block.finish_hook_ranks = "echo upload failed; exit 3", []
    prof = WorkerProfiler(block, 0, "actor")
    prof.start(1)
    with caplog.at_level(logging.WARNING, logger="rlhf_core.workers.torch_trace"):
        assert prof.stop(run_hook=True) == [str(tmp_path / "step_1" / "actor_rank_0.json")]  # no error: as verl
    assert re.search(r"finish_hook_cmd='echo upload failed; exit 3' exited with status 3 on rank 0 .*training goes "
                     r"on.*upload failed", caplog.text)
    assert os.path.isfile(tmp_path / "step_1" / "actor_rank_0.json")  # the trace is kept


def _state(pid: int) -> str:
    """The state letter of process ``pid`` (``Z`` zombie), or ``gone``."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_a_hanging_finish_hook_is_killed_with_its_children_and_training_goes_on(tmp_path, caplog):
    """A hook past its bound: the shell and the sleep it started (same process group) are SIGKILLed, a WARNING
    names the command and the bound, the call returns False, well before the sleep's 60 s."""
    pid_file = tmp_path / "child.pid"
    cmd = f"echo started; sleep 60 & echo $! > {pid_file}; wait"
    with caplog.at_level(logging.WARNING, logger="rlhf_core.workers.torch_trace"):
        t0 = time.monotonic()
        assert torch_trace.run_finish_hook(cmd, str(tmp_path), "torch", 0, "actor", [], timeout_s=1.0) is False
        took = time.monotonic() - t0
    assert 1.0 <= took < 10.0  # the 1 s bound, then the kill and reaping; never the 60 s of the sleep
    assert f"finish_hook_cmd={cmd!r} still ran after 1 s on rank 0: killed its process group" in caplog.text
    assert "started" in caplog.text  # the output read before the kill is in the warning
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _state(child) not in ("gone", "Z") and time.monotonic() < deadline:  # SIGKILL lands asynchronously
        time.sleep(0.05)
    assert _state(child) in ("gone", "Z")  # the grandchild sleep was killed too, not left running
    assert torch_trace.run_finish_hook("exit 0", str(tmp_path), "torch", 0, "actor", []) is True  # default bound


class _Group:
    def __init__(self):
        self.calls = []

    def execute_all(self, method, *args):
        self.calls.append((method, *args))


@pytest.mark.parametrize("steps, last_step, expected", [
    ([2, 3], 4, [("start_profile", 2), ("stop_profile", False), ("start_profile", 3), ("stop_profile", True)]),
    # the run ends (step 4) before listed step 10: the hook runs at the end
    ([2, 10], 4, [("start_profile", 2), ("stop_profile", False), ("stop_profile", True)]),
])
def test_the_driver_asks_for_the_finish_hook_once_after_the_last_profiled_step(steps, last_step, expected):
    group = _Group()
    prof = StepProfiler(OmegaConf.create({"tool": "torch", "steps": steps, "profile_continuous_steps": False}),
                        {"actor": group})
    for step in range(1, last_step + 1):
        prof.begin(step)
        prof.end(step, last=step == last_step)
    assert group.calls == expected


@pytest.mark.parametrize("override, message", [
    (A + "actor.profiler.tool_config.precision_debugger.stages=[actor_update]", "msprobe precision debugger"),
    ("global_profiler.global_tool_config.precision_debugger.strict=True", "msprobe precision debugger"),
    (A + "actor.profiler.tool_config.torch.contents=[flops]", "flops"),
    (A + "actor.profiler.tool_config.torch.step_end=0", "step_end must be > step_start"),
    ("critic.profiler.tool_config.torch.schedule.active=-1", "active must be >= 0"),
])
def test_bad_profiler_values_are_refused_when_the_config_loads(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("ppo_trainer", [override])


def test_a_torch_block_has_the_keys_of_its_schema_class(tmp_path):
    """The schedule and the mini-batch range are read only from the blocks whose schema declares them (actor, ref,
    critic; not the rollout's or the reward model's, which have no update mini-batches)."""
    t = "profiler.tool_config.torch"
    cfg = _cfg(tmp_path, f"{A}actor.{t}.schedule.active=2", f"{A}actor.{t}.step_start=1", f"{A}actor.{t}.step_end=3")
    actor = torch_trace.torch_block(OmegaConf.select(cfg, f"{A}actor.{t}"))
    assert actor == {"contents": [], "discrete": False, "step_start": 1, "step_end": 3,
                     "schedule": {"skip_first": 0, "wait": 0, "warmup": 0, "active": 2, "repeat": 0}}
    rollout_cfg = OmegaConf.select(cfg, f"{A}rollout.{t}")
    assert rollout_cfg.step_start == 1  # the rollout's block follows the actor's step_start (no effect there) ...
    rollout = torch_trace.torch_block(rollout_cfg)  # ... and has no schedule: neither is taken
    assert rollout == {"contents": [], "discrete": False, "schedule": None, "step_start": 0, "step_end": None}
    assert torch_trace.torch_block(OmegaConf.create(actor)) == actor  # a block made here is copied
    with pytest.raises(TypeError, match="is not a torch profiler block"):
        torch_trace.torch_block(OmegaConf.select(cfg, f"{A}actor.profiler"))
