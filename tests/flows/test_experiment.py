"""Experiment files (issue 33): the schema, the generator registry, settings from an experiment, and
``rlhf pipeline --experiment FILE --dry-run`` with each bad input of the issue refused in one line."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import fsspec
import pandas as pd
import pytest

from flows.experiment import ExperimentError, experiment_for_flow, load_experiment
from flows.settings import resolve_settings
from rlhf_core.config import ConfigError
from rlhf_core.data.generators import GENERATORS, Generator, register
from tests.paths import REPO


def _rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"what is {i}+1?"}], "data_source": "toy",
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}} for i in range(n)]


def test_unknown_fields_get_a_did_you_mean_naming_the_file_and_dotted_field(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("name: x\ndata: {generator: countdown}\nevaluation:\n  suites:\n    - {name: a, files: [a.parquet], "
                 "temprature: 0.5}\n")
    with pytest.raises(ExperimentError) as err:
        load_experiment(f)
    assert str(err.value).startswith(f"{f}: evaluation.suites[0].temprature: unknown field; did you mean "
                                     "'temperature'?")
    with pytest.raises(ExperimentError, match=r"<experiment text>: modle: unknown field; did you mean 'model'\?"):
        load_experiment("name: x\nmodle: {path: m}\n")


@pytest.mark.parametrize("text, message", [
    ("name: x\ndata: {generator: countdown}\nppo: {total_steps: '3'}\n", "ppo.total_steps: must be an integer, got str '3'"),
    ("name: x\ndata: {generator: countdown}\nsft: {enabled: 1}\n", "sft.enabled: must be true or false, got int 1"),
    ("name: x\ndata: {generator: countdown}\nppo: {overrides: a=1}\n", "ppo.overrides: must be a list of strings"),
    ("name: x\ndata: {generator: countdown}\nppo: {overrides: [1]}\n", "ppo.overrides[0]: must be a string, got int 1"),
    ("data: {generator: countdown}\n", "name: required"),
    ("name: x\ndata: {generator: countdwn}\n", "data.generator: unknown generator 'countdwn'; did you mean 'countdown'?"),
    ("name: x\ndata: {generator: countdown, generator_args: {max_numbr: 9}}\n", "data.generator_args: unknown argument"),
    ("name: x\n", "data.train_files: no files"),
    ("name: x\ndata: {generator: countdown}\nppo: {segment_steps: 0}\n", "ppo.segment_steps: must be >= 1, got 0"),
    ("name: x\ndata: {generator: countdown}\nreward: {path: r.txt}\n", "reward.path: must be a .py file"),
])
def test_wrong_values_are_one_line_naming_the_field(text, message):
    with pytest.raises(ExperimentError) as err:
        load_experiment(text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_relative_paths_resolve_against_the_files_folder_urls_stay_and_sha256_is_the_texts(tmp_path):
    text = ("name: mine\nmodel: {path: ../models/m}\ndata:\n  train_files: [data/t.parquet, s3://b/t.parquet]\n"
            "  val_files: [file:///abs/v.parquet]\nreward: {path: reward.py, name: score}\n")
    (tmp_path / "exp").mkdir()
    f = tmp_path / "exp" / "mine.yaml"
    f.write_text(text)
    e = load_experiment(f)
    assert e.model.path == str(tmp_path / "models" / "m")
    assert e.data.train_files == [str(tmp_path / "exp" / "data" / "t.parquet"), "s3://b/t.parquet"]
    assert e.data.val_files == ["file:///abs/v.parquet"] and e.reward.path == str(tmp_path / "exp" / "reward.py")
    assert e.sha256 == hashlib.sha256(text.encode()).hexdigest() and e.source == str(f)
    # the same text with another base_dir (what a deployment carries): paths follow base_dir
    assert load_experiment(text, base_dir="/srv/x").model.path == "/srv/models/m"
    assert e.ppo.total_steps == 20 and e.tasks.sft.retries == 1  # defaults from flows/experiment.py


def test_flow_content_wins_and_a_wrong_digest_is_refused(tmp_path):
    text = "name: a\ndata: {generator: countdown}\n"
    exp = experiment_for_flow("experiments/other.yaml", text, hashlib.sha256(text.encode()).hexdigest())
    assert exp.name == "a"
    with pytest.raises(ConfigError, match="content sha256 .* is not the expected experiment_sha256 0+"):
        experiment_for_flow(None, text, "0" * 64)
    assert experiment_for_flow(preset="tiny_cpu").sha256 == load_experiment(REPO / "experiments/gsm8k_tiny.yaml").sha256
    with pytest.raises(ConfigError, match="preset 'nope'"):
        experiment_for_flow(preset="nope")
    assert experiment_for_flow().source == str(REPO / "experiments" / "gsm8k_tiny.yaml")  # no file, no preset


def test_without_the_demo_folder_the_default_and_a_preset_say_to_pass_a_file(tmp_path, monkeypatch):
    # an installed wheel: flows/ in site-packages, no experiments/ beside it (tests/integration/test_wheel_install.py
    # runs the real one)
    import flows.experiment as fe
    monkeypatch.setattr(fe, "EXPERIMENTS_DIR", tmp_path / "experiments")
    monkeypatch.setattr(fe, "DEFAULT_EXPERIMENT", tmp_path / "experiments" / "gsm8k_tiny.yaml")
    with pytest.raises(ExperimentError, match="^the default experiment: no demo experiments at .*experiments "
                                              r"\(an installed package does not ship them.*: pass --experiment FILE"):
        experiment_for_flow()
    with pytest.raises(ExperimentError, match="^preset 'countdown': no demo experiments at "):
        experiment_for_flow(preset="countdown")


def test_a_partial_task_option_keeps_the_stages_own_defaults():
    # flows/experiment.py TasksSpec: ppo_segment defaults to (2 retries, 30 s, 43200 s), prepare_data to
    # (2, 10 s, 3600 s); a file that sets one field of a stage changes that field only (the generic
    # TaskOptions defaults, 1 retry and 30 s, are not what a stage gets)
    exp = load_experiment("name: x\ndata: {generator: countdown}\n"
                          "tasks: {ppo_segment: {timeout_seconds: 100}, prepare_data: {retries: 3}}\n")
    assert (exp.tasks.ppo_segment.retries, exp.tasks.ppo_segment.retry_delay_seconds,
            exp.tasks.ppo_segment.timeout_seconds) == (2, 30, 100)
    assert (exp.tasks.prepare_data.retries, exp.tasks.prepare_data.retry_delay_seconds,
            exp.tasks.prepare_data.timeout_seconds) == (3, 10, 3600)
    assert exp.tasks.sft.timeout_seconds == 21600  # a stage the file leaves out: all its own defaults


def test_generator_registry():
    assert set(GENERATORS) >= {"gsm8k", "gsm8k_tools", "countdown"}
    with pytest.raises(ValueError, match="already registered"):
        register("countdown", GENERATORS["countdown"])
    with pytest.raises(ValueError, match="max_number must be >= 2"):
        GENERATORS["countdown"].check_args({"max_number": 1})
    with pytest.raises(ValueError, match="min_numbers must be int"):
        GENERATORS["countdown"].check_args({"min_numbers": "2"})
    assert isinstance(GENERATORS["gsm8k"], Generator) and GENERATORS["countdown"].input_files({}) == []


def test_shipped_experiments_carry_todays_presets_and_parameters_still_win(monkeypatch):
    monkeypatch.setenv("GSM8K_DIR", "/data/gsm8k")
    s = resolve_settings({})
    assert (s.experiment, s.generator, s.train_prompts, s.val_prompts, s.ppo_steps, s.segment_steps) == (
        "rlhf", "gsm8k", 2048, 64, 20, 10)
    assert s.generator_args == {"source_dir": "/data/gsm8k"} and s.model_sizes["vocab_size"] == 2000
    assert s.experiment_ppo[-1] == "custom_reward_function.reward_kwargs={format_score:0.1}"
    # the PPO config filters overlong prompts: the filter_prompts task does it, the ppo stage reads them as they are
    assert s.prefilter and s.filter_cfg == {"max_prompt_length": 256, "workers": 1, "prompt_key": "prompt",
                                            "template_kwargs": {}}
    ppo = s.ppo_list(model_path="m", train_file="t", val_file="v", run_dir="/r", stop_after_step=10)
    assert ppo[-1] == "data.filter_overlong_prompts=False"
    c = resolve_settings({"preset": "countdown", "val_prompts": 600, "gsm8k_dir": "/ignored"})
    assert (c.generator_args, c.train_prompts, c.val_prompts, c.model_sizes["vocab_size"], c.prefilter) == (
        {"min_numbers": 2, "max_numbers": 2, "max_number": 99}, 20000, 600, 400, False)
    assert "trainer.total_training_seconds=480" in c.experiment_ppo


def test_layering_config_file_then_fields_then_overrides_then_run_time(tmp_path):
    """shipped -> the experiment's config file -> reward.path/name -> its overrides -> the flow's ppo_overrides."""
    (tmp_path / "ppo_trainer.yaml").write_text("data: {max_prompt_length: 100, max_response_length: 30}\n"
                                               "custom_reward_function: {name: from_config}\n")
    (tmp_path / "r.py").write_text("def score(**kw):\n    return 0.0\n")
    (tmp_path / "exp.yaml").write_text(
        "name: x\ndata: {generator: countdown}\nreward: {path: r.py, name: score}\n"
        "ppo: {config: ppo_trainer.yaml, overrides: [data.max_response_length=40, trainer.device=cpu]}\n")
    s = resolve_settings({"experiment_file": str(tmp_path / "exp.yaml"),
                          "ppo_overrides": ["data.max_response_length=50"]})
    from rlhf_core.config import load_config

    cfg = load_config("ppo_trainer", s.ppo_list(model_path="m", train_file="t", val_file="v", run_dir="/r",
                                                stop_after_step=1))
    assert cfg.data.max_prompt_length == 100  # the config file
    assert cfg.custom_reward_function.name == "score"  # reward.name beats the config file
    assert cfg.custom_reward_function.path == str(tmp_path / "r.py")
    assert cfg.data.max_response_length == 50  # run time beats the experiment's overrides (40) and file (30)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndata: {generator: countdown}\nppo: {config: ppo_trainer2.yaml}\n")
    (tmp_path / "ppo_trainer2.yaml").write_text("data: {max_promt_length: 1}\n")
    with pytest.raises(ConfigError, match=r"ppo.config: .*ppo_trainer2.yaml.*max_promt_length"):
        resolve_settings({"experiment_file": str(bad)})


# ---- rlhf pipeline --experiment FILE --dry-run ----------------------------------------------------------------

def _experiment(tmp_path: Path, extra: str = "", train: str = "memory://exp/train.parquet") -> Path:
    with fsspec.open("memory://exp/train.parquet", "wb") as fh:
        fh.write(pd.DataFrame(_rows(8)).to_parquet())
    pd.DataFrame(_rows(3)).to_parquet(tmp_path / "val.parquet")
    (tmp_path / "reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                        "    return float(solution_str.strip() == ground_truth)\n")
    f = tmp_path / "exp.yaml"
    f.write_text(f"name: mine\ndata:\n  train_files: [{train}]\n  val_files: [val.parquet]\n"
                 "reward: {path: reward.py}\nppo:\n  overrides: [trainer.device=cpu, actor_rollout_ref.rollout.name=hf]\n"
                 + extra)
    return f


def _dry_run(f: Path, capsys) -> tuple[int, list[str], str]:
    from flows.rlhf import main

    rc = main(["--experiment", str(f), "--dry-run"])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err.strip()


def test_dry_run_checks_every_input_and_trains_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "home"))
    f = _experiment(tmp_path, "evaluation:\n  suites:\n    - {name: easy, files: [val.parquet], n: 4}\n")
    rc, lines, err = _dry_run(f, capsys)
    assert rc == 0, err
    assert [line.split(":")[0] for line in lines[:-1]] == [
        "ok   stage configs", "ok   data.train_files[0]", "ok   data.val_files[0]",
        "ok   evaluation.suites[0].files[0]", "ok   model.path", "ok   reward.path", "ok   ppo rollout engine"]
    assert lines[1] == ("ok   data.train_files[0]: memory://exp/train.parquet: all 8 rows in verl's RL schema (chat "
                        "template and tokenising not run here: the data stage runs them)")
    assert lines[-2] == "ok   ppo rollout engine: hf (importable here)"
    assert lines[-1].startswith(f"dry run: 7 checks passed for {f}")
    assert not (tmp_path / "home" / "ray").exists() and not (tmp_path / "home" / "data").exists()


@pytest.mark.parametrize("case", ["unknown field", "missing url", "unexpanded variable", "no prompt column",
                                  "prompt string", "no reward function", "model unreachable", "empty suite", "engine not installed"])
def test_dry_run_refuses_each_bad_input_in_one_line_naming_file_and_field(tmp_path, capsys, case, monkeypatch):
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "home"))
    extra, train, field = "", "memory://exp/train.parquet", ""
    if case == "unknown field":
        extra, field = "evaluaton: {}\n", "evaluaton: unknown field; did you mean 'evaluation'?"
    elif case == "missing url":
        train, field = "memory://exp/nope.parquet", "data.train_files[0]: memory://exp/nope.parquet does not exist"
    elif case == "unexpanded variable":  # a verl script's $HOME, kept by rlhf experiment from-verl
        train = "$HOME/data/train.parquet"
        field = (f"data.train_files[0]: {tmp_path}/$HOME/data/train.parquet does not exist (it holds $HOME, a shell "
                 "variable nothing expands here: write the path, or convert the script again with --set HOME=VALUE)")
    elif case in ("no prompt column", "prompt string"):
        rows = _rows(2)
        rows = ([{k: v for k, v in r.items() if k != "prompt"} for r in rows] if case == "no prompt column"
                else [{**r, "prompt": "what is 1+1?"} for r in rows])
        with fsspec.open("memory://exp/bad.parquet", "wb") as fh:
            fh.write(pd.DataFrame(rows).to_parquet())
        train = "memory://exp/bad.parquet"
        field = ("data.train_files[0]: memory://exp/bad.parquet: missing column 'prompt'" if case == "no prompt column"
                 else "data.train_files[0]: memory://exp/bad.parquet row 0: column 'prompt' is a string where verl "
                      "has a list of chat messages")
    elif case == "no reward function":
        extra, field = "", "reward.path: "
    elif case == "model unreachable":
        extra, field = "model: {path: 'memory://nowhere/model'}\n", "model.path: memory://nowhere/model cannot be reached"
    elif case == "empty suite":
        pd.DataFrame(_rows(1)).iloc[:0].to_parquet(tmp_path / "empty.parquet")
        extra = "evaluation:\n  suites:\n    - {name: empty, files: [empty.parquet]}\n"
        field = f"evaluation.suites[0].files[0]: {tmp_path / 'empty.parquet'}: the file has no rows"
    elif case == "engine not installed":  # verl's default engine: the ppo stage would fail after data and SFT
        if importlib.util.find_spec("vllm") is not None:
            pytest.skip("vllm is installed here")
        extra, field = ("", "ppo rollout engine: ppo.overrides: actor_rollout_ref.rollout.name='vllm' needs the "
                            "'vllm' package")
    f = _experiment(tmp_path, extra, train)
    if case == "engine not installed":
        f.write_text(f.read_text().replace(", actor_rollout_ref.rollout.name=hf", ""))
    if case == "no reward function":
        (tmp_path / "reward.py").write_text("def score(**kw):\n    return 0.0\n")
        field = f"reward.path: {tmp_path / 'reward.py'} has no function 'compute_score' (reward.name); it defines ['score']"
    rc, lines, err = _dry_run(f, capsys)
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"rlhf pipeline: error: {f}: {field}"), err


def test_dry_run_without_a_reward_checks_the_data_sources_against_the_default_scorer(tmp_path, capsys, monkeypatch):
    # before, this passed the dry run and the flow ran data, model and SFT before the PPO stage refused 'toy'
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "home"))
    f = _experiment(tmp_path)
    f.write_text(f.read_text().replace("reward: {path: reward.py}\n", ""))
    rc, lines, err = _dry_run(f, capsys)
    assert rc == 1 and err.startswith(f"rlhf pipeline: error: {f}: reward: memory://exp/train.parquet row 0: no "
                                      "default reward function for data_source='toy'"), err
    # the same function given as a ppo override instead of the experiment's reward field: read as the reward
    f.write_text(f.read_text().replace("trainer.device=cpu,", f"trainer.device=cpu, custom_reward_function.path="
                                       f"{tmp_path / 'reward.py'},"))
    rc, lines, err = _dry_run(f, capsys)
    assert rc == 0 and any(line.startswith("ok   reward.path: ") for line in lines), err


def test_dry_run_checks_every_row_and_names_the_first_failing_one(tmp_path, capsys, monkeypatch):
    # the dry run read the first 5 rows of each file: a bad row 6 passed it and failed the data stage; now every row
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "home"))
    f = _experiment(tmp_path)
    rows = _rows(8)
    rows[6]["reward_model"] = {"style": "rule", "ground_truth": None}
    rows[7]["prompt"] = []
    with fsspec.open("memory://exp/train.parquet", "wb") as fh:
        fh.write(pd.DataFrame(rows).to_parquet())
    rc, lines, err = _dry_run(f, capsys)
    assert rc == 1 and err == (f"rlhf pipeline: error: {f}: data.train_files[0]: memory://exp/train.parquet row 6: "
                               "column 'reward_model.ground_truth' is empty"), err
    # without a reward: every row's data_source is known to the default scorer (row 6 is not)
    rows = [{**r, "data_source": "openai/gsm8k"} for r in _rows(8)]
    rows[6]["data_source"] = "mystery"
    with fsspec.open("memory://exp/train.parquet", "wb") as fh:
        fh.write(pd.DataFrame(rows).to_parquet())
    pd.DataFrame(rows[:3]).to_parquet(tmp_path / "val.parquet")
    f.write_text(f.read_text().replace("reward: {path: reward.py}\n", ""))
    rc, lines, err = _dry_run(f, capsys)
    assert rc == 1 and err.startswith(f"rlhf pipeline: error: {f}: reward: memory://exp/train.parquet row 6: no "
                                      "default reward function for data_source='mystery'"), err


def test_dry_run_prints_each_config_notice_once_as_a_note_line(tmp_path, capsys, monkeypatch):
    # issue 35's trial: a key that changes nothing here (a vLLM-only key with rollout.name=hf) came out as raw Python
    # warnings, once per load of the ppo config (the checks load it several times); now one "note" line
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "home"))
    f = _experiment(tmp_path)
    f.write_text(f.read_text().replace("actor_rollout_ref.rollout.name=hf]",
                                       "actor_rollout_ref.rollout.name=hf, actor_rollout_ref.rollout.enforce_eager=False]"))
    rc, lines, err = _dry_run(f, capsys)
    assert rc == 0, err
    notes = [line for line in lines if "enforce_eager" in line]
    assert notes == ["note actor_rollout_ref.rollout.enforce_eager=False has no effect here: it is read only by the "
                     "vllm rollout engine, and actor_rollout_ref.rollout.name='hf'."], lines
    assert "enforce_eager" not in err


def test_dry_run_refuses_gsm8k_from_a_hub_it_cannot_read(tmp_path, capsys, monkeypatch):
    # the default experiment (GSM8K, source_dir null) passed --dry-run offline, then its prepare_data stage failed on
    # the hub: the hub files are checked now (here a URL with no file, standing in for an unreachable hub)
    from rlhf_core.data import gsm8k

    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GSM8K_DIR", raising=False)
    monkeypatch.setattr(gsm8k, "HUB_URL", "memory://no-hub/{split}.parquet")
    rc, lines, err = _dry_run(REPO / "experiments" / "gsm8k_tiny.yaml", capsys)
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"rlhf pipeline: error: {REPO / 'experiments' / 'gsm8k_tiny.yaml'}: data.generator: GSM8K "
                          "is read from the Hugging Face hub (source_dir null, GSM8K_DIR unset), and "
                          "memory://no-hub/train.parquet does not exist; set data.generator_args.source_dir or "
                          "GSM8K_DIR to a folder with train.jsonl and test.jsonl"), err
    for split in ("train", "test"):  # both hub files there: the check passes (their rows are read by the stage)
        with fsspec.open(f"memory://no-hub/{split}.parquet", "wb") as fh:
            fh.write(b"x")
    rc, lines, err = _dry_run(REPO / "experiments" / "gsm8k_tiny.yaml", capsys)
    assert rc == 0 and "ok   data.generator: gsm8k {'source_dir': None}" in lines, err
