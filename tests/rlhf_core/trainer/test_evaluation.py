"""Offline evaluation end to end: a responses parquet built here, default scorer, custom functions, CLI."""
from __future__ import annotations

import json
import textwrap

import pandas as pd
import pyarrow.parquet as pq
import pytest

from rlhf_core.data import DataError
from omegaconf import OmegaConf

from rlhf_core.trainer.evaluation import run_evaluation

from tests.fixtures.config_fixtures import typed_config


def _write_parquet(path) -> str:
    df = pd.DataFrame({
        "data_source": ["openai/gsm8k", "openai/gsm8k", "lighteval/MATH"],
        "prompt": [[{"role": "user", "content": "q0"}], [{"role": "user", "content": "q1"}],
                   [{"role": "user", "content": "q2"}]],
        "responses": [
            ["#### 72", "#### 71", "72", "#### 72.00"],  # strict scores 1, 0, 0 (no marker), 1
            ["#### 1,000", "nope", "nope", "nope"],  # 1, 0, 0, 0
            [r"so \boxed{0.5}", r"\boxed{1}"],  # 0.5 == 1/2 → 1; 1 → 0
        ],
        "reward_model": [{"style": "rule", "ground_truth": g} for g in ("72", "1000", r"\frac{1}{2}")],
        "extra_info": [{"split": "test", "index": i} for i in range(3)],
    })
    df.to_parquet(path)
    return str(path)


def _config(data_path, samples_dir=None, custom_path=None, name="compute_score"):
    # ray_init.num_cpus=1: in-process scoring (tests/rlhf_core/trainer/test_evaluation_ray.py scores in Ray tasks)
    return typed_config("evaluation", f"data.path={data_path}", f"output.samples_dir={samples_dir or 'null'}",
                        f"custom_reward_function.path={custom_path or 'null'}", f"custom_reward_function.name={name}",
                        "ray_init.num_cpus=1")


def test_default_scorer_metrics_and_samples(tmp_path):
    data = _write_parquet(tmp_path / "resp.parquet")
    metrics = run_evaluation(_config(data, samples_dir=str(tmp_path / "samples")))
    # gsm8k: prompt means 2/4 = 0.5 and 1/4 = 0.25 → test_score = 0.375 (mean over prompts of response means)
    # pass@1 = (0.5 + 0.25)/2; pass@2 = (1 − C(2,2)/C(4,2) + 1 − C(3,2)/C(4,2))/2 = (5/6 + 1/2)/2 = 2/3
    # MATH: one prompt, scores 1 and 0 → test_score 0.5, pass@1 0.5, pass@2 1
    # every prompt has all of its data source's responses: each pass@k covers all prompts (2 gsm8k, 1 MATH)
    assert metrics == pytest.approx({
        "test_score/openai/gsm8k": 0.375, "pass@1/openai/gsm8k": 0.375, "pass@2/openai/gsm8k": 2 / 3,
        "pass@4/openai/gsm8k": 1.0, "reward/num_errors/openai/gsm8k": 0.0,
        "pass@1/num_prompts/openai/gsm8k": 2, "pass@2/num_prompts/openai/gsm8k": 2,
        "pass@4/num_prompts/openai/gsm8k": 2,
        "test_score/lighteval/MATH": 0.5, "pass@1/lighteval/MATH": 0.5, "pass@2/lighteval/MATH": 1.0,
        "reward/num_errors/lighteval/MATH": 0.0,
        "pass@1/num_prompts/lighteval/MATH": 1, "pass@2/num_prompts/lighteval/MATH": 1,
    })
    table = pq.read_table(tmp_path / "samples" / "eval_samples.parquet").to_pandas()
    assert len(table) == 10  # 4 + 4 + 2 responses
    assert list(table["uid"]) == ["0"] * 4 + ["1"] * 4 + ["2"] * 2
    assert list(table["sample_idx"]) == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert list(table["score"][:4]) == [1.0, 0.0, 0.0, 1.0]
    assert set(table["step"]) == {0}
    assert table["prompt"][0] == "user: q0" and table["ground_truth"][9] == r"\frac{1}{2}"


def test_custom_function_with_three_parameters_and_acc(tmp_path):
    # verl main_eval calls fn(data_source, response, ground_truth): a 3-parameter function must keep working.
    custom = tmp_path / "my_reward.py"
    custom.write_text(textwrap.dedent("""
        def judge(data_source, solution_str, ground_truth):
            hit = str(ground_truth) in solution_str
            return {"score": 0.8 if hit else 0.2, "acc": hit}
    """))
    data = _write_parquet(tmp_path / "resp.parquet")
    metrics = run_evaluation(_config(data, samples_dir=str(tmp_path / "s"), custom_path=str(custom), name="judge"))
    # gsm8k prompt 0: "72" is in responses 0, 2, 3 → scores .8,.2,.8,.8 (mean .65), 3 correct by acc;
    # prompt 1: "1000" is in none ("1,000" has a comma) → mean .2, 0 correct. test_score = (.65 + .2)/2 = .425
    assert metrics["test_score/openai/gsm8k"] == pytest.approx(0.425)
    # pass@ uses acc, not score (0.8 > 0.5 would agree here, 0.2 too): pass@1 = (3/4 + 0)/2
    assert metrics["pass@1/openai/gsm8k"] == pytest.approx(0.375)
    assert metrics["test_score/lighteval/MATH"] == pytest.approx(0.2) and metrics["pass@2/lighteval/MATH"] == 0.0
    table = pq.read_table(tmp_path / "s" / "eval_samples.parquet").to_pandas()
    assert list(table["acc"][:4]) == [1.0, 0.0, 1.0, 1.0]


def test_extra_info_passed_when_accepted_and_errors(tmp_path):
    custom = tmp_path / "r.py"
    custom.write_text(textwrap.dedent("""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return float(extra_info["index"])          # the row's extra_info reaches the scorer
        def broken(data_source, solution_str, ground_truth):
            raise ZeroDivisionError("oops")
    """))
    data = _write_parquet(tmp_path / "resp.parquet")
    metrics = run_evaluation(_config(data, custom_path=str(custom)))
    assert metrics["test_score/openai/gsm8k"] == 0.5 and metrics["test_score/lighteval/MATH"] == 2.0  # (0+1)/2, 2
    assert not list(tmp_path.glob("**/eval_samples.parquet"))  # no samples_dir → nothing written
    # a scorer that raises scores each response 0, counted per data source (4 + 4 gsm8k responses, 2 MATH)
    broken = run_evaluation(_config(data, custom_path=str(custom), name="broken"))
    assert broken["test_score/openai/gsm8k"] == 0.0 and broken["reward/num_errors/openai/gsm8k"] == 8.0
    assert broken["reward/num_errors/lighteval/MATH"] == 2.0
    with pytest.raises(DataError, match="resp.parquet: data.response_key='answers' is not a column"):
        cfg = _config(data)
        cfg.data.response_key = "answers"
        run_evaluation(cfg)
    with pytest.raises(DataError, match="data.prompt_key='nope' is not a column"):
        cfg = _config(data)
        cfg.data.prompt_key = "nope"
        run_evaluation(cfg)
    with pytest.raises(FileNotFoundError, match="data.path .*missing.parquet' does not exist"):
        run_evaluation(_config(str(tmp_path / "missing.parquet")))
    empty = tmp_path / "empty.parquet"
    pq.write_table(pq.read_table(data).slice(0, 0), empty)
    with pytest.raises(DataError, match="empty.parquet: no rows to evaluate"):
        run_evaluation(_config(str(empty)))


def test_unknown_data_source_is_refused_by_row_before_ray(tmp_path):
    import ray

    df = pd.read_parquet(_write_parquet(tmp_path / "resp.parquet"))
    df.loc[2, "data_source"] = "my_add"  # no default scorer: before, Ray started and a scoring task failed
    df.to_parquet(tmp_path / "mine.parquet")
    cfg = typed_config("evaluation", f"data.path={tmp_path / 'mine.parquet'}", "ray_init.num_cpus=2")
    with pytest.raises(DataError, match=r"mine.parquet row 2: no default reward function for data_source='my_add'"):
        run_evaluation(cfg)
    assert not ray.is_initialized()  # refused before the scoring tasks


def test_main_eval_prints_json(tmp_path, capsys):
    from rlhf_core.trainer.main_eval import main

    data = _write_parquet(tmp_path / "resp.parquet")
    rc = main([f"data.path={data}", f"output.samples_dir={tmp_path / 'out'}", "ray_init.num_cpus=1"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["test_score/openai/gsm8k"] == pytest.approx(0.375)
    assert (tmp_path / "out" / "eval_samples.parquet").exists()
    assert main([f"data.path={tmp_path / 'missing.parquet'}", "ray_init.num_cpus=1"]) == 1
    assert "missing.parquet" in capsys.readouterr().err
