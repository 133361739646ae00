"""Faults (issue 12): kill -9 of a training worker (a) during generation, (b) during the actor update, (c) during a
checkpoint write, and (d) of the PPO stage's driver; the Prefect retry of ``ppo_segment`` rebuilds what died and
resumes from the last complete checkpoint.

Each test runs the real ``ppo_segment`` task (its own retries and ``retry_condition_fn``; only the 30 s retry delay
is set to 0) in a Prefect flow against a temporary Prefect API, with embedded Ray, MLflow (SQLite) and DuckDB:
GRPO on the tiny model, 2 steps of 2 prompts × 2 samples, a checkpoint every step. The fault hook
(``rlhf_core.faults``: ``RLHF_FAULT=<point>:2``) makes the process at that point of step 2 write its pid into a
marker file and SIGKILL itself — no sleeping and hoping. The retry decision is observed as it is taken (a wrapper
around the task's own ``retry_condition_fn``): the tracker still names step 1 and nothing of step 2 is complete.

Each faulted run is compared with one uninterrupted run of the same stage (module fixture): the same per-step
metrics (every key but timings), the same final weights, every (step, metric) once in the metrics file (the retry
resumed at step 1; it did not redo it), no temporary file left, and no placement group or actor of either
attempt left alive (the dead attempt's are released, the retry built new ones).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.ray]

STEPS = 2  # step 1 completes and is checkpointed in every faulted run; the fault fires in step 2
TIMING_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/")  # wall-clock numbers differ between any two runs


def _overrides(model: str, train: Path, val: Path, run_dir: Path) -> list[str]:
    return [
        f"data.train_files={train}", f"data.val_files={val}", "data.train_batch_size=2",
        "data.max_prompt_length=64", "data.max_response_length=8", "data.truncation=left", "data.seed=1",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.val_kwargs.n=1", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "algorithm.adv_estimator=grpo", "trainer.nnodes=1", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
        "trainer.total_epochs=1", f"trainer.total_training_steps={STEPS}", "trainer.save_freq=1",
        f"trainer.test_freq={STEPS}", "trainer.val_before_train=false", "trainer.logger=[console]",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}", f"trainer.validation_data_dir={run_dir / 'val'}",
        "trainer.project_name=faults", "trainer.experiment_name=faults", "trainer.resume_mode=auto",
        f"custom_reward_function.path={train.parent / 'length_reward.py'}", "ray_init.num_cpus=2",
    ]


LENGTH_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # the untrained tiny model never answers correctly; a reward from the text's length makes the samples differ
    return (len(solution_str) % 5) / 4.0
"""


@dataclass
class Outcome:
    """What one run of the stage left: its result, Prefect attempts, metrics, weights and Ray resources."""

    result: dict[str, Any]
    run_count: int
    file_rows: list[dict[str, Any]]
    store_rows: dict[tuple[int, str], float]
    weights: dict[str, torch.Tensor]
    ckpt_root: Path
    marker: str | None
    pgs: dict[str, dict[str, Any]]  # the placement groups the run created: id -> placement_group_table entry
    actors: list[dict[str, Any]]  # the worker actors the run created (ray._private.state.actors entries)
    at_retry: list[dict[str, Any]] = field(default_factory=list)  # the checkpoint folder when a retry was decided


@dataclass
class World:
    home: Path
    model: str
    train: Path
    val: Path
    experiment: str = "faults"


def _retries(stage: str) -> int:
    """``stage``'s retries in the default experiment (``tasks.<stage>`` in flows/experiment.py, the one place the
    pipeline's retries are set; the ``@task`` decorators set none)."""
    from flows.experiment import TasksSpec

    return int(getattr(TasksSpec(), stage).retries)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def _run_stage(world: World, name: str, fault: str | None = None) -> Outcome:
    """Run ``ppo_segment`` (1 segment, STEPS steps) in a flow; ``fault``: ``RLHF_FAULT`` for this run."""
    import ray
    from prefect import flow
    from prefect.client.orchestration import get_client
    from ray.util.placement_group import placement_group_table
    from safetensors.torch import load_file

    from infra import lineage
    from infra.results import ResultsStore
    from infra.run_folders import read_jsonl
    from tasks.common import make_context, stage
    from tasks.stages import ppo_segment, retry_unless_bad_input

    run_dir = world.home / "runs" / name
    ckpt_root = run_dir / "checkpoints"
    marker = run_dir / "fault_fired"
    overrides = _overrides(world.model, world.train, world.val, run_dir)
    at_retry: list[dict[str, Any]] = []

    def observe_then_decide(task, task_run, state) -> bool:
        tracker = ckpt_root / "latest_checkpointed_iteration.txt"
        at_retry.append({"tracker": tracker.read_text() if tracker.exists() else None, "tree": _tree(ckpt_root),
                         "error": repr(state.data if isinstance(state.data, BaseException) else None)[:300]})
        return retry_unless_bad_input(task, task_run, state)

    @flow(name=f"faults-{name}")
    def one_segment(ctx: dict[str, Any], ppo_run_id: str) -> tuple[dict[str, Any], Any]:
        task = ppo_segment.with_options(retries=_retries("ppo_segment"), retry_delay_seconds=0,
                                        retry_condition_fn=observe_then_decide)
        state = task(overrides, 1, ppo_run_id, ctx, return_state=True)
        return state.result(), state.state_details.task_run_id

    before = set(placement_group_table())
    actors_before = set(ray._private.state.actors())
    saved = {k: os.environ.get(k) for k in ("RLHF_FAULT", "RLHF_FAULT_MARKER")}
    if fault:
        os.environ.update(RLHF_FAULT=fault, RLHF_FAULT_MARKER=str(marker))
    try:
        with lineage.pipeline_run(world.experiment, name, {}) as parent:
            ctx = make_context(str(world.home), world.experiment, parent, name, str(run_dir))
            with stage("ppo", {"faults.run": name}, ctx) as ppo_run_id:
                result, task_run_id = one_segment(ctx, ppo_run_id)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    with get_client(sync_client=True) as client:
        run_count = client.read_task_run(task_run_id).run_count
    _, rows = ResultsStore(world.home).sql(
        f"SELECT step, key, value FROM metrics WHERE run_id = '{ppo_run_id}' AND stage = 'ppo'")
    store_rows: dict[tuple[int, str], float] = {}
    for step, key, value in rows:
        assert (step, key) not in store_rows, f"{name}: ({step}, {key}) registered twice"
        store_rows[(step, key)] = value
    last = ckpt_root / f"global_step_{STEPS}" / "actor" / "huggingface" / "model.safetensors"
    pgs = {pg: info for pg, info in placement_group_table().items() if pg not in before}
    actors = [a for aid, a in ray._private.state.actors().items() if aid not in actors_before]
    return Outcome(result=result, run_count=run_count,
                   file_rows=read_jsonl(run_dir / "metrics" / "segment_1.jsonl"), store_rows=store_rows,
                   weights=load_file(str(last)), ckpt_root=ckpt_root,
                   marker=marker.read_text() if marker.exists() else None, pgs=pgs, actors=actors,
                   at_retry=at_retry)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir, gsm8k_dir, prefect_harness):  # the temporary Prefect API (tests/conftest.py)
    import pandas as pd

    from infra.home import configure_environment
    from infra.ray_cluster import connect_ray, shutdown_ray
    from rlhf_core.data.gsm8k import preprocess_gsm8k

    base = tmp_path_factory.mktemp("faults")
    files = preprocess_gsm8k(str(gsm8k_dir), str(base / "full"))
    pd.read_parquet(files["train"]).head(2 * STEPS).to_parquet(base / "train.parquet")
    pd.read_parquet(files["test"]).head(2).to_parquet(base / "test.parquet")
    (base / "length_reward.py").write_text(LENGTH_REWARD)
    managed = ("RLHF_HOME", "MLFLOW_TRACKING_URI", "RLHF_MLFLOW_ARTIFACT_ROOT", "MLFLOW_RUN_ID", "RLHF_METRICS_FILE")
    saved = dict(os.environ)  # all of it: configure_environment also sets PREFECT_HOME (and whatever it adds later)
    for k in managed:
        os.environ.pop(k, None)
    os.environ["RLHF_HOME"] = str(base / "home")
    try:
        configure_environment()
        connect_ray(None, num_cpus=2)
        yield World(home=base / "home", model=str(tiny_model_dir), train=base / "train.parquet",
                    val=base / "test.parquet")
    finally:
        shutdown_ray()
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def reference(world) -> Outcome:
    """The uninterrupted run every faulted run must match."""
    out = _run_stage(world, "reference")
    assert out.run_count == 1 and out.marker is None and out.at_retry == []
    assert out.result["global_step"] == STEPS
    return out


def _training_metrics(rows: dict[tuple[int, str], float]) -> dict[tuple[int, str], float]:
    return {k: v for k, v in rows.items() if not k[1].startswith(TIMING_PREFIXES)}


def _check_recovered(out: Outcome, ref: Outcome, point: str) -> None:
    # the fault fired once, in step 2, and killed the process that reached the point (it is gone)
    assert out.marker is not None and out.marker.startswith(f"{point}:{STEPS} pid=")
    pid = int(out.marker.split("pid=")[1])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # one failed attempt, one retry; when the retry was decided, the last complete checkpoint was step 1
    assert out.run_count == 2 and len(out.at_retry) == 1, out.at_retry
    seen = out.at_retry[0]
    assert seen["tracker"] == "1", seen
    assert "global_step_1/actor/model" in seen["tree"] and "global_step_1/data.pt" in seen["tree"], seen
    assert f"global_step_{STEPS}/data.pt" not in seen["tree"], seen  # step 2 was never complete
    # the flow completed with the uninterrupted run's results
    assert out.result["global_step"] == ref.result["global_step"] == STEPS
    assert out.result["checkpoint_dir"] == str(out.ckpt_root / f"global_step_{STEPS}")
    assert _training_metrics(out.store_rows) == _training_metrics(ref.store_rows)
    assert {k: v for k, v in out.result["metrics"].items() if not k.startswith(TIMING_PREFIXES)} == {
        k: v for k, v in ref.result["metrics"].items() if not k.startswith(TIMING_PREFIXES)}
    assert out.weights.keys() == ref.weights.keys()
    for key, ref_tensor in ref.weights.items():
        assert torch.equal(out.weights[key], ref_tensor), key
    # step 1 is logged once (the retry resumed from its checkpoint, it did not redo it); step 2 once
    logged = [(r["step"], r["name"]) for r in out.file_rows]
    assert len(logged) == len(set(logged)) and {s for s, _ in logged} == {1, 2}
    # nothing half-written: the tracker names the last step, both step folders are complete, no temporary entry
    tree = _tree(out.ckpt_root)
    assert (out.ckpt_root / "latest_checkpointed_iteration.txt").read_text() == str(STEPS)
    assert not [p for p in tree if p.endswith(".tmp") or "/.tmp" in p or ".tmp/" in p], tree
    for step in range(1, STEPS + 1):
        for part in ("actor/model", "actor/optim", "actor/extra_state_world_size_1_rank_0.pt", "data.pt"):
            assert f"global_step_{step}/{part}" in tree, (step, part)
    _check_released(out)


def _check_released(out: Outcome) -> None:
    """No placement group or worker actor of either attempt is alive; the retry built its own."""
    import ray

    names = sorted(info["name"] for info in out.pgs.values())
    assert len(names) == 2, out.pgs  # one actor group per attempt (GRPO: no critic), each freshly placed
    owners = {n.split(".")[0] for n in names}
    assert len(owners) == 2, names  # two dispatches of the driver, each with its own owner tag
    assert all(info["state"] == "REMOVED" for info in out.pgs.values()), out.pgs
    workers = [a for a in out.actors if str(a.get("Name", "")).split(".")[0] in owners]
    assert len(workers) == 2 and all(a["State"] == "DEAD" for a in workers), workers
    assert not [n for n in ray.util.list_named_actors() if n.split(".")[0] in owners]


def test_worker_killed_during_generation(world, reference):
    out = _run_stage(world, "generate", "generate:2")
    _check_recovered(out, reference, "generate")


def test_worker_killed_during_actor_update(world, reference):
    out = _run_stage(world, "update_actor", "update_actor:2")
    _check_recovered(out, reference, "update_actor")


def test_worker_killed_during_checkpoint_write(world, reference):
    out = _run_stage(world, "checkpoint_write", "checkpoint_write:2")
    _check_recovered(out, reference, "checkpoint_write")
    # the worker died with step 2's sharded model written and nothing else: a partial, never-tracked folder
    seen = out.at_retry[0]["tree"]
    assert "global_step_2/actor.tmp/model" in seen and "global_step_2/actor.tmp/optim" not in seen, seen
    assert "global_step_2/actor" not in seen, seen


def test_driver_killed_between_steps(world, reference, caplog):
    caplog.set_level(logging.WARNING, logger="infra.ray_cluster")
    out = _run_stage(world, "driver", "driver:2")
    _check_recovered(out, reference, "driver")
    # the killed driver could not shut its worker group down: the dispatcher removed its placement group
    released = [r.getMessage() for r in caplog.records if "released what a dead driver" in r.getMessage()]
    assert len(released) == 1 and "placement groups ['ppo_remote-" in released[0], released
    assert not any(p.startswith(f"global_step_{STEPS}") for p in out.at_retry[0]["tree"])  # step 2 never began


def test_validate_killed_is_retried_without_retraining(world, reference):
    """Issue 33: validation is its own task. A segment without in-segment validation (the pipeline's
    ``trainer.test_freq=-1``) checkpoints step 2; the ``validate`` task's first attempt is SIGKILLed at the start of
    its validation (``RLHF_FAULT=validate:2``); Prefect retries ``validate`` alone: the segment ran once, its
    checkpoint and metrics file are untouched, and the retry's val-core numbers at step 2 are the reference run's
    in-segment validation of the same weights (greedy: ``val_kwargs`` default). Then ``evaluate`` generates with the
    merged step-2 policy on two suites and scores each under its own name."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from infra import lineage
    from infra.results import ResultsStore
    from tasks import plan
    from infra.run_folders import read_jsonl
    from tasks.common import make_context, stage
    from tasks.stages import evaluate, ppo_segment, validate

    name = "validate"
    run_dir = world.home / "runs" / name
    marker = run_dir / "fault_fired"
    overrides = plan.merge_overrides(_overrides(world.model, world.train, world.val, run_dir),
                                     ["trainer.test_freq=-1"])
    suites = [{"name": "held_out", "files": [str(world.val)], "n": 2, "temperature": 1.0, "top_p": 1.0,
               "response_length": None},
              {"name": "train.greedy", "files": [str(world.train)], "n": 1, "temperature": 0.0, "top_p": 1.0,
               "response_length": 4}]

    @flow(name="faults-validate")
    def segment_then_validate(ctx: dict[str, Any], ppo_run_id: str) -> tuple:
        seg = ppo_segment.with_options(retries=_retries("ppo_segment"), retry_delay_seconds=0)(
            plan.segment_overrides(overrides), 1, ppo_run_id, ctx, return_state=True)
        result = seg.result()
        files = {p: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").rglob("*") if p.is_file()}
        seg_rows = read_jsonl(run_dir / "metrics" / "segment_1.jsonl")
        val = validate.with_options(retries=_retries("validate"), retry_delay_seconds=0)(
            overrides, result["checkpoint_dir"], result["global_step"], ppo_run_id, ctx, return_state=True)
        ev = evaluate(["ray_init.num_cpus=2"], ctx, checkpoint=result["checkpoint_dir"], val_file=str(world.val),
                      global_step=result["global_step"], suites=suites,
                      ppo_overrides=plan.merge_overrides(overrides, ["data.max_prompt_length=1024"]))
        return (seg.state_details.task_run_id, val.state_details.task_run_id, val.result(), files, seg_rows, ev)

    os.environ.update(RLHF_FAULT=f"validate:{STEPS}", RLHF_FAULT_MARKER=str(marker))
    try:
        with lineage.pipeline_run(world.experiment, name, {}) as parent:
            ctx = make_context(str(world.home), world.experiment, parent, name, str(run_dir))
            with stage("ppo", {"faults.run": name}, ctx) as ppo_run_id:
                seg_id, val_id, val, files, seg_rows, ev = segment_then_validate(ctx, ppo_run_id)
    finally:
        os.environ.pop("RLHF_FAULT", None)
        os.environ.pop("RLHF_FAULT_MARKER", None)
    # the fault fired once, in the validate task's first attempt; validate ran twice, the segment once
    assert marker.read_text().startswith(f"validate:{STEPS} pid=")
    with get_client(sync_client=True) as client:
        assert client.read_task_run(seg_id).run_count == 1
        val_run = client.read_task_run(val_id)
        assert val_run.run_count == 2 and val_run.name == f"validate · step {STEPS}"
    # nothing of the segment was redone: its checkpoint files and its metrics file are as it left them
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").rglob("*") if p.is_file()} == files
    assert read_jsonl(run_dir / "metrics" / "segment_1.jsonl") == seg_rows
    assert not [r for r in seg_rows if r["name"].startswith("val-")]  # test_freq=-1: no in-segment validation
    # the retry validated the step-2 weights: the same numbers as the reference's in-segment validation at step 2
    ref_val = {k: v for k, v in reference.result["metrics"].items() if k.startswith("val-core/")}
    assert ref_val and {k: v for k, v in val["metrics"].items() if k.startswith("val-core/")} == ref_val
    assert val["global_step"] == STEPS and val["checkpoint_dir"].endswith(f"global_step_{STEPS}")
    store = ResultsStore(world.home)
    _, rows = store.sql(f"SELECT DISTINCT step FROM metrics WHERE run_id = '{ppo_run_id}' AND key LIKE 'val-core/%'")
    assert rows == [(STEPS,)]
    _, rows = store.sql(f"SELECT step, count(*) FROM samples WHERE run_id = '{ppo_run_id}' GROUP BY step")
    assert rows == [(STEPS, 2)]  # 2 validation prompts x val_kwargs.n=1, registered once
    # evaluate: both suites under their names, in DuckDB (metrics and samples) and on the evaluate MLflow run
    assert {k for k in ev if k.startswith("test_score/")} == {"test_score/held_out/openai/gsm8k",
                                                               "test_score/train.greedy/openai/gsm8k"}
    assert ev["pass@2/num_prompts/held_out/openai/gsm8k"] == 2.0  # 2 prompts, 2 responses each
    assert ev["pass@1/num_prompts/train.greedy/openai/gsm8k"] == 2 * STEPS
    _, rows = store.sql("SELECT suite, data_source, count(*), count(DISTINCT prompt_id) FROM samples "
                        "WHERE stage = 'evaluate' GROUP BY ALL ORDER BY suite")
    assert rows == [("held_out", "held_out/openai/gsm8k", 4, 2),
                    ("train.greedy", "train.greedy/openai/gsm8k", 2 * STEPS, 2 * STEPS)]
    _, [(eval_run,)] = store.sql("SELECT DISTINCT run_id FROM metrics WHERE stage = 'evaluate'")
    logged = lineage.client().get_run(eval_run).data.metrics
    assert logged["test_score/held_out/openai/gsm8k"] == ev["test_score/held_out/openai/gsm8k"]
    assert (run_dir / "hf_policy" / "config.json").is_file()  # merged once, for register_model to reuse
