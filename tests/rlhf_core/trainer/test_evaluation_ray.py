"""evaluation.yaml's ray_init.*: responses are scored in parallel Ray tasks (verl's main_eval), same results."""
from __future__ import annotations

import json
import os
import textwrap

import pyarrow.parquet as pq
import pytest
from tests.rlhf_core.trainer.test_evaluation import _config, _write_parquet

from rlhf_core.trainer.evaluation import run_evaluation

pytestmark = pytest.mark.ray  # starts Ray through an entry point (the rlhf CLI, a trainer, the flow)

SCORER = textwrap.dedent('''
    import os
    from rlhf_core.reward.scorers import default_compute_score

    def compute_score(data_source, solution_str, ground_truth):
        out = default_compute_score(data_source, solution_str, ground_truth)  # MATH scorers return a dict
        return {"score": float(out["score"] if isinstance(out, dict) else out), "pid": os.getpid()}
''')


def test_ray_workers_score_in_parallel_with_the_same_results(tmp_path):
    data = _write_parquet(tmp_path / "resp.parquet")
    (tmp_path / "pid_score.py").write_text(SCORER)
    local = _config(data, samples_dir=str(tmp_path / "local"), custom_path=str(tmp_path / "pid_score.py"))
    on_ray = _config(data, samples_dir=str(tmp_path / "ray"), custom_path=str(tmp_path / "pid_score.py"))
    on_ray.ray_init.num_cpus = 2
    on_ray.ray_kwargs.timeline_json_file = str(tmp_path / "trace" / "timeline.json")  # folder made on write
    expected = run_evaluation(local)
    assert run_evaluation(on_ray) == pytest.approx(expected)
    a = pq.read_table(tmp_path / "local" / "eval_samples.parquet").to_pandas()
    b = pq.read_table(tmp_path / "ray" / "eval_samples.parquet").to_pandas()
    assert set(a["pid"]) == {os.getpid()}
    # 3 prompts over 2 CPUs: 2 chunks (rows 0 | 1-2), each scored in a Ray worker process, not the driver
    pids = set(b["pid"])
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert list(b["uid"]) == list(a["uid"]) and list(b["score"]) == list(a["score"])
    # ray_kwargs.timeline_json_file: Ray's chrome-trace event list, with the scoring tasks in it
    events = json.loads((tmp_path / "trace" / "timeline.json").read_text())
    assert isinstance(events, list) and any("_score_chunk" in str(e.get("name", "")) for e in events)
