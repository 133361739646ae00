"""``rlhf results compare``: every prompt is counted in exactly one category (issue 36).

It printed ``improved 1`` and ``still_failing 64`` for 64 prompts: a prompt whose mean score rose from 0 to a format
reward of 0.1 was counted as improved and as still failing. Two hand-made evaluations on a real DuckDB store,
two samples per prompt, with a known member in every category.
"""
from __future__ import annotations

import datetime as dt
import json
import math

from conftest_services import *  # noqa: F401,F403 - rlhf_env, results_store
from infra.compare import CATEGORIES, compare_runs, prompt_category
from infra.results import prompt_id
from infra.results_cli import main as results_main
from rlhf_core.metrics.samples import write_samples_parquet

T0 = dt.datetime(2026, 11, 1, 2, 0, 0)
GSM8K, COUNTDOWN = "openai/gsm8k", "countdown"

# prompt -> (run A's two sample scores, run B's); None: the run did not evaluate that prompt
GSM8K_SCORES = {
    "p0": ([1, 1], [1, 1]),      # 1.0 -> 1.0   still_passing
    "p1": ([0, 0], [0, 0.1]),    # 0 -> 0.05    improved (fails in both: counted once, as improved)
    "p2": ([1, 0], [0, 0]),      # 0.5 -> 0     regressed (0.5 is not a pass: fails in both)
    "p3": ([0, 0], [0, 0]),      # 0 -> 0       still_failing
    "p4": ([0, 1], [1, 0]),      # 0.5 -> 0.5   still_failing (the same mean, not above 0.5)
    "p5": ([0, 0], [1, 1]),      # 0 -> 1       improved
    "p6": ([1, 1], [0, 1]),      # 1 -> 0.5     regressed
    "p7": ([1, 1], None),        # only in A    missing
    "p8": (None, [0, 0]),        # only in B    new
}
COUNTDOWN_SCORES = {"c0": (None, [1, 1]), "c1": (None, [0, 0])}  # a data source only B evaluated


def _eval_run(store, tmp_path, flow_id: str, run_id: str, side: int, day: int) -> None:
    """Flow run ``flow_id`` whose evaluate stage ``run_id`` scored each prompt's two samples with side ``side``."""
    rows = []
    for source, table in ((GSM8K, GSM8K_SCORES), (COUNTDOWN, COUNTDOWN_SCORES)):
        for name, scores in table.items():
            for j, score in enumerate(scores[side] or []):
                rows.append({"step": 0, "data_source": source, "uid": name, "sample_idx": j,
                             "prompt": f"user: {name}", "response": f"r{j}", "ground_truth": "1",
                             "score": float(score)})
    path = write_samples_parquet(rows, str(tmp_path / run_id), "eval_samples")
    start = T0 + dt.timedelta(days=day)
    store.index_run(flow_id, flow_id, "flow", "FINISHED", start, start + dt.timedelta(hours=1), "{}",
                    name=f"night-{day}", kind="flow")
    store.index_run(run_id, flow_id, "evaluate", "FINISHED", start + dt.timedelta(minutes=50),
                    start + dt.timedelta(minutes=55), json.dumps({"data.path": "x"}), name="evaluate")
    questions = {prompt_id(f"user: {n}", src): f"question {n}"
                 for src, t in ((GSM8K, GSM8K_SCORES), (COUNTDOWN, COUNTDOWN_SCORES)) for n in t}
    store.register_samples([path], run_id, "evaluate", checkpoint=f"/ckpt/{run_id}", questions=questions)


def test_prompt_category_counts_a_change_first():
    assert prompt_category(0.0, 0.05) == "improved"       # rose, still below the pass threshold
    assert prompt_category(0.5, 0.0) == "regressed"
    assert prompt_category(1.0, 1.0) == "still_passing"
    assert prompt_category(0.5, 0.5) == "still_failing"   # a pass is a mean score above 0.5
    assert prompt_category(0.1 + 0.2, 0.3) == "still_failing"  # 0.30000000000000004 vs 0.3: the same score


def test_counts_partition_the_prompts_of_both_runs(results_store, tmp_path, capsys):
    _eval_run(results_store, tmp_path, "flowA", "evalA", side=0, day=0)
    _eval_run(results_store, tmp_path, "flowB", "evalB", side=1, day=1)
    cmp = compare_runs(results_store, "flowA", "flowB")
    by_source = {s.data_source: s for s in cmp.sources}
    assert sorted(by_source) == [COUNTDOWN, GSM8K]

    g = by_source[GSM8K]
    members = {c: sorted(g.pairs.loc[g.pairs["category"] == c, "question"]) for c in CATEGORIES}
    assert members == {"improved": ["question p1", "question p5"], "regressed": ["question p2", "question p6"],
                       "still_passing": ["question p0"], "still_failing": ["question p3", "question p4"]}
    assert (g.n_prompts, g.improved, g.regressed, g.still_passing, g.still_failing, g.new, g.missing) == (
        7, 2, 2, 1, 2, 1, 1)
    assert g.improved + g.regressed + g.still_passing + g.still_failing == g.n_prompts
    assert g.n_prompts + g.missing == 8 and g.n_prompts + g.new == 8  # A's prompts p0..p7, B's p0..p6 + p8
    # means over the 7 paired prompts: A (1+0+0.5+0+0.5+0+1)/7 = 3/7, B (1+0.05+0+0+0.5+1+0.5)/7 = 3.05/7
    assert math.isclose(g.mean_a, 3 / 7, abs_tol=1e-12) and math.isclose(g.mean_b, 3.05 / 7, abs_tol=1e-12)

    c = by_source[COUNTDOWN]  # nothing to pair: both of its prompts are new, no mean is invented
    assert (c.n_prompts, c.improved, c.regressed, c.still_passing, c.still_failing, c.new, c.missing) == (
        0, 0, 0, 0, 0, 2, 0)
    assert math.isnan(c.mean_a) and math.isnan(c.ci_high)

    assert results_main(["compare", "flowA", "flowB", "--show", "failing"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(x for x in lines if x.startswith("data_source"))
    assert header.split()[-6:] == ["improved", "regressed", "still_passing", "still_failing", "new", "missing"]
    assert next(x for x in lines if x.startswith(GSM8K)).split()[-6:] == ["2", "2", "1", "2", "1", "1"]
    assert next(x for x in lines if x.startswith(COUNTDOWN)).split()[-6:] == ["0", "0", "0", "0", "2", "0"]
    listed = out[out.index("failing prompts of openai/gsm8k (2):"):].splitlines()[1:3]
    assert sorted(x.split()[-1] for x in listed) == ["p3", "p4"]
