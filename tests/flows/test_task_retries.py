"""A stage's retries are set in one place: the experiment's ``tasks.<stage>`` (defaults in flows/experiment.py
``TasksSpec``), applied by the flow. The ``@task`` decorators in tasks/ set none, so a default changed in the
experiment schema is the number Prefect uses, and no decorator value can disagree with it."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from flows.experiment import TasksSpec
from flows.pipeline_steps import configured_tasks
from flows.settings import resolve_settings
from tasks import register, stages

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())  # the repository root
STAGES = ("prepare_data", "build_model", "filter_prompts", "sft", "ppo_segment", "validate", "evaluate",
          "register_model")


def test_no_task_decorator_sets_retries():
    found = []
    for path in sorted((REPO / "tasks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "task":
                found += [f"{path.name}:{node.lineno} {kw.arg}" for kw in node.keywords
                          if kw.arg in ("retries", "retry_delay_seconds")]
    assert found == []
    # Prefect's own default (0 retries) is what an unconfigured task has
    bare = {t.name: t.retries for t in (stages.prepare_data, stages.build_model, stages.filter_prompts, stages.sft,
                                        stages.ppo_segment, stages.validate, stages.evaluate, register.register_model)}
    assert bare == dict.fromkeys(STAGES, 0)


def test_the_flow_applies_the_experiments_retries(tmp_path):
    # the schema's defaults, read from TasksSpec itself (not written out: that is test_prefect_run_logs' job)
    spec = TasksSpec()
    s = resolve_settings({})
    got = {t.name: (t.retries, t.retry_delay_seconds) for t in configured_tasks(s)}
    assert got == {f.name: (getattr(spec, f.name).retries, getattr(spec, f.name).retry_delay_seconds)
                   for f in dataclasses.fields(spec)}
    assert set(got) == set(STAGES) and got["ppo_segment"] == (2, 30)  # a failed segment is retried twice
    # an experiment file's value is the one Prefect uses, 0 included (no decorator value underneath)
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\ndata: {generator: countdown}\n"
                    "tasks:\n  ppo_segment: {retries: 0}\n  validate: {retries: 5, retry_delay_seconds: 1}\n")
    got = {t.name: (t.retries, t.retry_delay_seconds) for t in configured_tasks(resolve_settings(
        {"experiment_file": str(mine)}))}
    assert got["ppo_segment"] == (0, 30) and got["validate"] == (5, 1) and got["sft"] == (1, 30)
