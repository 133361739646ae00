"""Comparing runs and the regression gate, on a real DuckDB store with hand-made evaluations."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest

from conftest_services import *  # noqa: F401,F403
from flows import report
from infra.compare import RunNotFoundError, compare_runs, paired_bootstrap_ci, resolve_run
from infra.results import prompt_id
from infra.results_cli import main as results_main
from rlhf_core.metrics.samples import write_samples_parquet
from tests.paths import REPO

T0 = dt.datetime(2026, 11, 1, 2, 0, 0)


def _eval_run(store, tmp_path, flow_id, run_id, scores, day, status="FINISHED", source="openai/gsm8k"):
    """A flow run ``flow_id`` whose evaluate stage ``run_id`` scored prompt ``q<i>`` with ``scores[i]``
    (two samples per prompt, both with that score, so a prompt's mean is ``scores[i]``)."""
    rows = []
    for i, score in enumerate(scores):
        for j in range(2):
            rows.append({"step": 0, "data_source": source, "uid": str(i), "sample_idx": j,
                         "prompt": f"user: question {i}", "response": f"r{j}", "ground_truth": "1",
                         "score": float(score)})
    path = write_samples_parquet(rows, str(tmp_path / run_id), "eval_samples")
    start = T0 + dt.timedelta(days=day)
    store.index_run(flow_id, flow_id, "flow", status, start, start + dt.timedelta(hours=1), "{}",
                    name=f"night-{day}", kind="flow")
    store.index_run(run_id, flow_id, "evaluate", "FINISHED", start + dt.timedelta(minutes=50),
                    start + dt.timedelta(minutes=55), json.dumps({"data.path": "x"}), name="evaluate")
    store.register_samples([path], run_id, "evaluate", checkpoint=f"/ckpt/{run_id}",
                           questions={prompt_id(f"user: question {i}", source): f"raw {i}" for i in range(len(scores))})


def test_bootstrap_interval_by_hand():
    # diffs {0,0,0,1}: a resample's mean is K/4 with K ~ Binomial(4, 1/4):
    # P(K=0)=81/256=0.316, P(K<=2)=243/256=0.949, P(K<=3)=255/256=0.996.
    # So the 2.5% quantile is 0 and the 97.5% quantile is 3/4 (10000 resamples put the empirical
    # CDF within ~0.002 of these, far from 0.025/0.975).
    low, high = paired_bootstrap_ci(np.array([0.0, 0.0, 0.0, 1.0]), seed=0, n_boot=10000)
    assert (low, high) == (0.0, 0.75)
    # the same seed gives the same interval; a constant difference has a zero-width interval
    assert paired_bootstrap_ci(np.array([0.0, 0.0, 0.0, 1.0]), seed=0, n_boot=10000) == (low, high)
    assert paired_bootstrap_ci(np.array([-0.5] * 5), seed=3) == (-0.5, -0.5)


def test_store_keeps_one_row_per_run_and_sample_ids(results_store, tmp_path):
    _eval_run(results_store, tmp_path, "flowA", "evalA", [1, 0, 0, 0], day=0)
    # RUNNING then FINISHED for the same id: still one row
    assert results_store.sql("SELECT run_id, count(*) FROM runs GROUP BY 1 ORDER BY 1")[1] == [
        ("evalA", 1), ("flowA", 1)]
    _, rows = results_store.sql("SELECT DISTINCT prompt_id, question, checkpoint FROM samples ORDER BY question")
    assert rows[0] == (prompt_id("user: question 0", "openai/gsm8k"), "raw 0", "/ckpt/evalA")
    assert len(rows) == 4 and len({r[0] for r in rows}) == 4


def test_compare_cli_prints_hand_computed_interval(rlhf_env, results_store, tmp_path, capsys):
    # A scores prompts [1,0,0,0], B [1,0,0,1]: diffs {0,0,0,1} (interval [0, 0.75], see above);
    # mean A 0.25, mean B 0.5; q3 improved, none regressed, q0 still passes, q1 and q2 still fail.
    _eval_run(results_store, tmp_path, "flowA", "evalA", [1, 0, 0, 0], day=0)
    _eval_run(results_store, tmp_path, "flowB", "evalB", [1, 0, 0, 1], day=1)
    assert results_main(["compare", "previous", "latest", "--show", "improved"]) == 0
    out = capsys.readouterr().out
    assert "A: previous = run evalA (flow run flowA), evaluate step 0" in out
    line = next(x for x in out.splitlines() if x.startswith("openai/gsm8k"))
    assert line.split() == ["openai/gsm8k", "4", "0.2500", "0.5000", "+0.2500", "[+0.0000,", "+0.7500]",
                            "1", "0", "1", "2", "0", "0"]
    assert "0.000 -> 1.000  raw 3" in out
    # flow-run ids and stage run ids name the same comparison
    by_flow = compare_runs(results_store, "flowA", "flowB")
    by_run = compare_runs(results_store, "evalA", "evalB")
    assert by_flow.sources[0].ci_high == by_run.sources[0].ci_high == 0.75
    # the same pairs as a DuckDB view
    _, rows = results_store.sql("SELECT count(*), sum(diff) FROM compare_pairs WHERE run_a = 'evalA' AND run_b = 'evalB'")
    assert rows == [(4, 1.0)]
    assert results_main(["compare", "evalA", "nope"]) == 1
    assert "run 'nope'" in capsys.readouterr().err


def test_gate_passes_a_run_against_itself_and_fails_a_worse_run(results_store, tmp_path):
    _eval_run(results_store, tmp_path, "flowA", "evalA", [1] * 8, day=0)
    # B fails the first four prompts: diffs {-1 x4, 0 x4}; a resample's mean is -K/8 with
    # K ~ Binomial(8, 1/2): P(K=0)=1/256, P(K<=1)=9/256=0.035 > 0.025, so the upper end of
    # the interval is -1/8 = -0.125 (and the lower end -7/8 by symmetry).
    _eval_run(results_store, tmp_path, "flowB", "evalB", [0] * 4 + [1] * 4, day=1)
    base = resolve_run(results_store, "evalA")
    cmp, message = report.gate(results_store, base, "evalA", max_regression=0.0)
    assert message is None and (cmp.sources[0].ci_low, cmp.sources[0].ci_high) == (0.0, 0.0)
    cmp, message = report.gate(results_store, base, "evalB", max_regression=0.1)
    s = cmp.sources[0]
    assert (s.diff, s.ci_low, s.ci_high, s.regressed) == (-0.5, -0.875, -0.125, 4)
    assert message is not None and "openai/gsm8k" in message and "1.0000 -> 0.5000" in message
    assert "[-0.8750, -0.1250]" in message and "max_regression=0.1" in message
    # a tolerance wider than the interval's upper end lets it pass
    assert report.gate(results_store, base, "evalB", max_regression=0.2)[1] is None


def test_baseline_resolution(results_store, tmp_path):
    assert report.resolve_baseline(results_store, report.PREVIOUS_SUCCESSFUL, "flowC") is None
    _eval_run(results_store, tmp_path, "flowA", "evalA", [1, 1], day=0)
    _eval_run(results_store, tmp_path, "flowB", "evalB", [0, 1], day=1, status="FAILED")
    # the newest *successful* flow run, never the run in progress
    assert report.resolve_baseline(results_store, report.PREVIOUS_SUCCESSFUL, "flowC").run_id == "evalA"
    assert report.resolve_baseline(results_store, report.PREVIOUS_SUCCESSFUL, "flowA") is None
    assert report.resolve_baseline(results_store, "flowB", "flowC").run_id == "evalB"
    assert report.resolve_baseline(results_store, None, "flowC") is None
    with pytest.raises(RunNotFoundError, match="baseline: run 'no-such-run'"):
        report.resolve_baseline(results_store, "no-such-run", "flowC")


def test_readme_sql_examples_run_and_answer(results_store, tmp_path):
    import re

    readme = (REPO / "README.md").read_text()
    block = re.search(r"```sql\n(.*?)```", readme, re.S).group(1)
    queries = [q.strip() for q in block.split(";") if q.strip()]
    assert len(queries) == 4
    _eval_run(results_store, tmp_path, "flowA", "evalA", [1, 1, 0, 0], day=0)
    _eval_run(results_store, tmp_path, "flowB", "evalB", [1, 0, 0, 1], day=1)
    best, drift, worst, pairs = (results_store.sql(q.replace("FLOW_A", "flowA").replace("FLOW_B", "flowB"))[1]
                                 for q in queries)
    # both nights average 0.5: arg_max keeps one of them; drift lists both nights
    assert best[0][0] == "openai/gsm8k" and best[0][2] == 0.5
    assert [(str(r[0]), r[2], r[3]) for r in drift] == [("2026-11-01", 0.5, 4), ("2026-11-02", 0.5, 4)]
    # q2 failed both nights: the worst prompt
    assert worst[0][1:] == ("raw 2", 2, 0.0)
    # q1 went 1 -> 0
    assert pairs == [("openai/gsm8k", "raw 1", 1.0, 0.0)]
