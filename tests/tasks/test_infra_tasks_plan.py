"""Pipeline decision logic (tasks.plan, flows.settings) as plain functions, no Prefect engine."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from flows.settings import resolve_settings
from tasks import plan
from tests.paths import REPO


@pytest.mark.parametrize("total,seg,expected", [
    (4, 2, [2, 4]), (5, 2, [2, 4, 5]), (1, 3, [1]), (3, 1, [1, 2, 3]), (6, 6, [6])])
def test_segment_boundaries(total, seg, expected):
    assert plan.segment_boundaries(total, seg) == expected


def test_segment_boundaries_refuses_zero():
    with pytest.raises(ValueError, match="segment_steps"):
        plan.segment_boundaries(4, 0)
    with pytest.raises(ValueError, match="total_steps"):
        plan.segment_boundaries(0, 2)


def test_merge_overrides_last_wins_and_keeps_order():
    merged = plan.merge_overrides(["a=1", "b=2"], ["+c=3", "a=9"], ["b=7"])
    assert merged == ["+c=3", "a=9", "b=7"]


def test_ppo_overrides_segment_and_user_precedence(tmp_path):
    o = plan.ppo_overrides(
        ["trainer.save_freq=100", "data.train_batch_size=8"], ["data.train_batch_size=16",
                                                                "trainer.stop_after_step=99"],
        model_path="/m", train_file="/t.parquet", val_file="/v.parquet", run_dir=str(tmp_path),
        total_steps=5, segment_steps=2, stop_after_step=4, adv_estimator="grpo", experiment="e")
    d = dict(x.split("=", 1) for x in o)
    assert d["trainer.stop_after_step"] == "4"  # the segment boundary beats any user value
    assert d["trainer.resume_mode"] == "auto"
    assert d["trainer.save_freq"] == "2"  # pipeline beats the experiment: boundaries are checkpoints
    assert d["data.train_batch_size"] == "16"  # user beats the experiment
    assert d["trainer.total_training_steps"] == "5"
    assert d["algorithm.adv_estimator"] == "grpo"
    assert d["trainer.default_local_dir"] == str(tmp_path / "checkpoints")
    assert d["actor_rollout_ref.model.path"] == d["critic.model.path"] == "/m"  # GAE's critic: the same model
    assert d["trainer.validation_data_dir"] == str(tmp_path / "val_samples")


def test_override_value_rendering():
    assert plan.as_overrides({"a": None, "b": [1, "x"], "c": True}) == ["a=null", "b=[1,x]", "c=True"]


def test_sft_overrides_epochs_optional():
    with_epochs = plan.sft_overrides([], [], model_path="/m", train_file="/t", val_file="/v",
                                     out_dir="/o", experiment="e", epochs=3)
    assert "trainer.total_epochs=3" in with_epochs
    without = plan.sft_overrides(["trainer.total_epochs=2"], [], model_path="/m", train_file="/t",
                                 val_file="/v", out_dir="/o", experiment="e")
    assert "trainer.total_epochs=2" in without and "model.partial_pretrain=/m" in without


def test_files_digest_and_inputs_key(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"abc")
    d = tmp_path / "dir"
    d.mkdir()
    (d / "x").write_bytes(b"1")
    h1 = plan.files_digest([f, d])
    assert h1 == plan.files_digest([d, f])  # order-independent
    (d / "x").write_bytes(b"2")
    assert plan.files_digest([f, d]) != h1  # content-sensitive
    # a single file's digest covers its name and bytes
    expected = hashlib.sha256(b"a.bin" + b"abc").hexdigest()
    assert plan.files_digest([f]) == expected
    assert plan.inputs_key("s", [f], n=1) != plan.inputs_key("s", [f], n=2)


def test_resolve_settings_defaults_and_params(monkeypatch):
    monkeypatch.setenv("GSM8K_DIR", "/data/gsm8k")
    s = resolve_settings({})
    assert s.adv_estimator == "grpo" and s.generator_args["source_dir"] == "/data/gsm8k"
    assert "actor_rollout_ref.rollout.name=hf" in s.experiment_ppo
    assert s.model_sizes["hidden_size"] == 128  # experiments/gsm8k_tiny.yaml
    s = resolve_settings({"ppo_steps": 3, "segment_steps": 1, "preset": None, "skip_sft": True,
                          "ppo_overrides": ["a=1"]})
    assert (s.ppo_steps, s.segment_steps, s.sft_enabled, s.ppo_overrides) == (3, 1, False, ["a=1"])
    assert s.experiment_file.endswith("experiments/gsm8k_tiny.yaml")  # None means "not given": the default
    assert s.task_options["ppo_segment"]["retries"] >= 1  # a failed segment is retried (resumes)
    with pytest.raises(ValueError, match="segment_steps"):
        resolve_settings({"segment_steps": 0})
    with pytest.raises(ValueError, match="no_such_preset"):
        resolve_settings({"preset": "no_such_preset"})




PRESET_PPO = ["data.train_batch_size=8", "custom_reward_function.reward_kwargs={format_score:0.1}",
              "custom_reward_function.reward_kwargs.extra=1"]


@pytest.mark.parametrize("user,dropped", [
    (["custom_reward_function.path=/my/reward.py"], True),
    (["+custom_reward_function.path=/my/reward.py"], True),
    (["custom_reward_function.path=/my/reward.py", "custom_reward_function.path=null"], False),
    (["~custom_reward_function.path"], False),
    (["custom_reward_function.name=score"], False),
    ([], False),
])
def test_drop_preset_reward_kwargs(user, dropped):
    out = plan.drop_preset_reward_kwargs(PRESET_PPO, user)
    assert out == (["data.train_batch_size=8"] if dropped else PRESET_PPO)


def test_user_reward_path_drops_preset_kwargs_but_keeps_users_own():
    s = resolve_settings({"ppo_overrides": ["custom_reward_function.path=/my/reward.py"]})
    assert not [o for o in s.experiment_ppo if "reward_kwargs" in o]
    assert "actor_rollout_ref.rollout.name=hf" in s.experiment_ppo  # the rest of the experiment's overrides stays
    final = s.ppo_list(model_path="/m", train_file="/t", val_file="/v", run_dir="/r", stop_after_step=1)
    assert not [o for o in final if "reward_kwargs" in o]
    assert resolve_settings({}).experiment_ppo[-1] == "custom_reward_function.reward_kwargs={format_score:0.1}"
    own = ["custom_reward_function.path=/my/reward.py", "custom_reward_function.reward_kwargs={scale:2}"]
    s = resolve_settings({"ppo_overrides": own})
    final = s.ppo_list(model_path="/m", train_file="/t", val_file="/v", run_dir="/r", stop_after_step=1)
    assert [o for o in final if "reward_kwargs" in o] == ["custom_reward_function.reward_kwargs={scale:2}"]


def test_is_retriable_plain_errors():
    from rlhf_core.config.errors import ConfigError
    from rlhf_core.data import DataError

    for exc in (ConfigError("bad key"), DataError("bad row"), FileNotFoundError("x.parquet")):
        assert not plan.is_retriable(exc), exc
    for exc in (RuntimeError("worker died"), TimeoutError(), ConnectionError("blip"), MemoryError(), None):
        assert plan.is_retriable(exc), exc


def _ray_task_error(cause):
    from ray.exceptions import RayTaskError

    try:
        raise cause
    except BaseException as exc:  # noqa: BLE001
        import traceback

        return RayTaskError("ppo_remote", traceback.format_exc(), exc)


def test_is_retriable_unwraps_ray_task_errors():
    from ray.exceptions import RayTaskError

    from rlhf_core.config.errors import ConfigError
    from rlhf_core.data import DataError

    wrapped = _ray_task_error(ConfigError("unknown key"))
    assert isinstance(wrapped, RayTaskError) and not isinstance(wrapped, ConfigError)
    assert not plan.is_retriable(wrapped)
    assert not plan.is_retriable(wrapped.as_instanceof_cause())  # what ray.get raises
    assert not plan.is_retriable(_ray_task_error(FileNotFoundError("ckpt")))
    # a driver on Ray whose worker failed: RayTaskError around RayTaskError around DataError
    assert not plan.is_retriable(_ray_task_error(_ray_task_error(DataError("bad row"))))
    assert plan.is_retriable(_ray_task_error(RuntimeError("nccl timeout")))


def test_retry_condition_fn_reads_the_failed_state():
    from prefect.states import Failed

    from rlhf_core.config.errors import ConfigError
    from tasks import stages

    assert stages.retry_unless_bad_input(None, None, Failed(data=ConfigError("x"))) is False
    assert stages.retry_unless_bad_input(None, None, Failed(data=RuntimeError("x"))) is True
    for t in (stages.prepare_data, stages.build_model, stages.sft, stages.ppo_segment, stages.evaluate):
        assert t.retry_condition_fn is stages.retry_unless_bad_input
        assert t.with_options(retries=5).retry_condition_fn is stages.retry_unless_bad_input


def test_validate_overrides_fails_fast_on_a_typo():
    from flows.settings import validate_overrides
    from rlhf_core.config.errors import ConfigError

    validate_overrides(resolve_settings({}))  # the default experiment + pipeline choices are valid
    validate_overrides(resolve_settings({"ppo_overrides": ["custom_reward_function.path=/my/reward.py"]}))
    with pytest.raises(ConfigError, match=r"ppo stage.*actor_rollout_ref\.rollout\.nn"):
        validate_overrides(resolve_settings({"ppo_overrides": ["actor_rollout_ref.rollout.nn=4"]}))
    with pytest.raises(ConfigError, match=r"sft stage.*optim\.lrr"):
        validate_overrides(resolve_settings({"sft_overrides": ["optim.lrr=1"]}))
    validate_overrides(resolve_settings({"sft_overrides": ["optim.lrr=1"], "skip_sft": True}))  # not run
    with pytest.raises(ConfigError, match=r"eval stage.*data\.pathh"):
        validate_overrides(resolve_settings({"eval_overrides": ["data.pathh=x"]}))
    with pytest.raises(ConfigError, match="ppo stage"):  # impossible batch sizes, not just key names
        validate_overrides(resolve_settings({"ppo_overrides": ["actor_rollout_ref.actor.ppo_mini_batch_size=7"]}))


def test_cli_has_skip_flags_and_names_the_rlhf_command(monkeypatch, capsys, tmp_path, gsm8k_dir):
    from infra.home import embedded_defaults

    for key, value in embedded_defaults(tmp_path).items():  # importing the flow sets these; keep them private
        monkeypatch.setenv(key, value)
    import flows.rlhf as flow_mod
    from flows import local_run

    seen = {}

    def fake_flow(**kwargs):
        seen.update(kwargs)
        return {"home": "/h", "parent_run_id": "p", "flow_run_id": "f-1"}

    monkeypatch.setattr(flow_mod, "rlhf", fake_flow)
    monkeypatch.setenv("GSM8K_DIR", str(gsm8k_dir))  # the default experiment's data: the hub is checked when unset
    started = []  # the ephemeral Prefect server the real flow would use
    monkeypatch.setattr(flow_mod, "start_ephemeral_prefect", lambda: started.append(True))
    monkeypatch.setattr(local_run.shutil, "which", lambda name: None)
    assert flow_mod.main(["--skip-sft", "--skip-evaluate", "--ppo-steps", "2"]) == 0
    assert seen == {"skip_sft": True, "skip_evaluate": True, "ppo_steps": 2} and started == [True]
    out = capsys.readouterr().out
    assert "Try:    rlhf results" not in out and "bin/rlhf results sql" in out
    assert "flow_run_id = 'f-1'" in out  # the example query is about the run that just finished
    seen.clear()
    monkeypatch.setattr(local_run.shutil, "which", lambda name: "/usr/bin/rlhf")
    assert flow_mod.main([]) == 0
    assert seen == {} and "Try:    rlhf results sql" in capsys.readouterr().out
    assert flow_mod.main(["--help"]) == 0  # every rlhf subcommand's main returns its exit code
    help_text = capsys.readouterr().out
    assert "--skip-sft" in help_text and "--skip-evaluate" in help_text


def test_ephemeral_prefect_starts_under_the_home_lock(monkeypatch, tmp_path):
    """Flow runs starting at once on a fresh home take turns migrating Prefect's SQLite database: while
    another process holds ``$PREFECT_HOME/prefect.db.lock`` no server starts; with a Prefect server
    configured nothing starts at all."""
    import filelock
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from infra.home import embedded_defaults

    for key, value in embedded_defaults(tmp_path).items():
        monkeypatch.setenv(key, value)
    import flows.rlhf as flow_mod

    (tmp_path / "prefect").mkdir(exist_ok=True)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # an earlier test's server must not count as configured
    with filelock.FileLock(str(tmp_path / "prefect" / "prefect.db.lock")):
        with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(filelock.Timeout):
            flow_mod.start_ephemeral_prefect(timeout_s=0.5)  # waits for the other process, starts nothing
        with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
            flow_mod.start_ephemeral_prefect(timeout_s=0.5)  # a real server is configured: no lock, no start


def test_cli_checks_parameters_before_any_service(monkeypatch, capsys, tmp_path, gsm8k_dir):
    from infra.home import embedded_defaults

    for key, value in embedded_defaults(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GSM8K_DIR", str(gsm8k_dir))  # the default experiment's data: the hub is checked when unset
    import flows.rlhf as flow_mod

    def no_flow(**kwargs):
        raise AssertionError("the flow (and Prefect's server) must not start")

    monkeypatch.setattr(flow_mod, "rlhf", no_flow)
    cases = [(["--ppo-steps", "0"], "ppo_steps (0)"),
             (["--model-path", str(tmp_path / "nope")], "model_path: "),
             (["--max-regression", "-1"], "regression_gate.max_regression (or --max-regression) must be >= 0"),
             (["--baseline", "no-such-run"], "baseline: run 'no-such-run'"),
             (["--ppo-overrides", "actor_rollout_ref.rollout.nn=4"], "ppo stage")]
    for argv, expected in cases:
        assert flow_mod.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, (argv, err)
    # --dry-run resolves the same settings: the gate's errors are one line there too (was a ValueError traceback)
    for argv, expected in [(["--max-regression", "-1"], "must be >= 0"),
                           (["--baseline", "previous-successful", "--skip-evaluate"], "needs the evaluate stage")]:
        assert flow_mod.main([*argv, "--dry-run"]) == 1
        out = capsys.readouterr()
        assert len(out.err.strip().splitlines()) == 1 and expected in out.err and "Traceback" not in out.err, out


def test_questions_by_prompt_id_pairs_validation_order_and_checks_text(tmp_path):
    from infra.results import prompt_id

    val = tmp_path / "val.parquet"
    pd.DataFrame({"extra_info": [{"question": "How many apples?"}, {"question": "What is 2+2?"},
                                 {"question": "Unseen"}]}).to_parquet(val)
    # two samples per prompt in dataset order; the second prompt's decoded text lost its question
    samples = tmp_path / "val_step_1.parquet"
    pd.DataFrame({"uid": ["a", "a", "b", "b"], "data_source": ["gsm8k"] * 4,
                  "prompt": ["user: How many  apples? Let's think", "user: How many  apples? Let's think",
                             "user: garbled", "user: garbled"]}).to_parquet(samples)
    got = plan.questions_by_prompt_id([str(samples)], str(val))
    assert got == {prompt_id("user: How many  apples? Let's think", "gsm8k"): "How many apples?"}
    assert plan.questions_by_prompt_id([str(samples)], None) == {}


def test_gsm8k_dir_recorded_under_the_home_is_the_last_fallback(monkeypatch, tmp_path):
    from infra.home import remember, remembered

    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GSM8K_DIR", raising=False)
    assert remembered("gsm8k_dir") is None and resolve_settings({}).generator_args["source_dir"] is None
    remember("gsm8k_dir", "/data/gsm8k")  # what prepare_data records after `make demo`
    assert resolve_settings({}).generator_args["source_dir"] == "/data/gsm8k"
    monkeypatch.setenv("GSM8K_DIR", "/env/gsm8k")  # anything the user gives wins
    assert resolve_settings({}).generator_args["source_dir"] == "/env/gsm8k"
    assert resolve_settings({"gsm8k_dir": "/param"}).generator_args["source_dir"] == "/param"


@pytest.mark.parametrize("value", ["~/data/train.parquet", "a,b", "#1", "it's", "end\\", "q\\'x", "x=y",
                                   "/tmp/x y", "  sp  ", "", "plain", "${data.max_prompt_length}"])
def test_override_value_reads_back_through_hydras_grammar(value):
    # the flow's overrides go through the same Hydra parser as a user's: any string comes back unchanged
    from rlhf_core.config import parse_value

    assert parse_value(plan.override_value(value)) == value
    assert plan.override_value("plain") == "plain" and plan.override_value("~/x") == "'~/x'"


def test_countdown_experiment_sets_generator_and_sizes_params_still_win():
    from flows.settings import validate_overrides

    s = resolve_settings({"experiment_file": str(REPO / "experiments" / "countdown.yaml")})
    assert (s.generator, s.train_prompts, s.val_prompts, s.ppo_steps, s.segment_steps) == (
        "countdown", 20000, 500, 100000, 100000)
    assert s.generator_args == {"min_numbers": 2, "max_numbers": 2, "max_number": 99}
    assert "trainer.total_training_seconds=480" in s.experiment_ppo
    validate_overrides(s)  # the shipped countdown experiment is valid for every stage
    assert resolve_settings({"experiment_file": str(REPO / "experiments" / "countdown.yaml"),
                             "val_prompts": 600}).val_prompts == 600
    # preset=countdown (the name before experiment files) is the same file
    assert resolve_settings({"preset": "countdown"}).experiment_sha256 == s.experiment_sha256
    assert resolve_settings({}).generator == "gsm8k"  # the default experiment keeps GSM8K


@pytest.mark.parametrize("name", ["countdown", "gsm8k_tiny", "gsm8k_tools"])
def test_shipped_experiments_print_one_line_per_ppo_step(name):
    # the flow logs one short line per PPO step (tasks/progress.py); a `console` sink in the PPO stage added verl's
    # ~1.5 kB metrics line per step beside it: 164 of them in a new user's `make demo` log (320 kB in all)
    s = resolve_settings({"experiment_file": str(REPO / "experiments" / f"{name}.yaml")})
    [logger] = [o.partition("=")[2] for o in s.experiment_ppo if o.startswith("trainer.logger=")]
    assert "console" not in logger and "mlflow" in logger, logger


def test_tools_experiment_is_valid_and_its_tool_config_loads_from_the_checkout():
    from flows.settings import validate_overrides
    from rlhf_core.config import load_config
    from rlhf_core.tools import load_tools

    s = resolve_settings({"experiment_file": str(REPO / "experiments" / "gsm8k_tools.yaml")})
    assert (s.experiment, s.generator) == ("gsm8k_tools", "gsm8k_tools")
    assert resolve_settings({"preset": "tiny_cpu_tools"}).experiment_sha256 == s.experiment_sha256  # the old name
    validate_overrides(s)  # every stage's list is valid, the multi-turn SFT and async tool-agent PPO included
    rollout = load_config("ppo_trainer", s.experiment_ppo).actor_rollout_ref.rollout
    assert (rollout.mode, rollout.multi_turn.enable) == ("async", True)
    # the path is relative to the checkout, which Ray ships as every stage's working directory
    assert list(load_tools(REPO / rollout.multi_turn.tool_config_path)) == ["calc_gsm8k_reward"]






def test_validation_before_after_prefers_acc_and_spans_segments():
    rows = [
        {"step": 0, "name": "val-core/countdown/acc/mean@1", "value": 0.1},
        {"step": 0, "name": "val-core/countdown/reward/mean@1", "value": 0.1},
        {"step": 3, "name": "critic/score/mean", "value": 0.9},  # not a validation metric
        {"step": 5, "name": "val-core/countdown/acc/mean@1", "value": 0.25},  # segment 1 ends
        {"step": 9, "name": "val-core/countdown/acc/mean@1", "value": 0.35},  # segment 2 ends
    ]
    out = plan.validation_before_after(rows)
    assert out["name"] == "val-core/countdown/acc/mean@1"
    assert (out["before_step"], out["after_step"]) == (0, 9)
    assert out["gain"] == pytest.approx(0.35 - 0.1)
    only_reward = [{"step": 2, "name": "val-core/openai/gsm8k/reward/mean@2", "value": 0.5}]
    assert plan.validation_before_after(only_reward)["gain"] is None  # no step 0: nothing to compare with
    assert plan.validation_before_after([{"step": 1, "name": "actor/lr", "value": 1.0}]) is None


def test_prepare_data_cache_key_follows_the_generator_arguments_and_the_input_bytes(tmp_path):
    from tasks.data_stages import _prepare_key

    def key(data: dict, home: str = "/h") -> str | None:
        return _prepare_key(None, {"data": data, "ctx": {"home": home}})

    countdown = resolve_settings({"experiment_file": str(REPO / "experiments" / "countdown.yaml")}).data_spec()
    plain = key(countdown)
    assert plain == key(dict(countdown)) and plain != key(countdown, home="/other")
    two = key({**countdown, "generator_args": {"min_numbers": 2, "max_numbers": 3, "max_number": 99}})
    assert two != plain and two != key({**countdown, "generator_args": {"min_numbers": 3, "max_numbers": 3,
                                                                         "max_number": 99}})
    assert key({**countdown, "train_prompts": 100}) != plain
    # files: the key is the bytes' digest, not the name or the time (an unchanged nightly input is not prepared again)
    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    train.write_bytes(b"one"), val.write_bytes(b"two")
    files = {**countdown, "generator": None, "generator_args": {}, "train_files": [str(train)],
             "val_files": [str(val)]}
    first = key(files)
    train.write_bytes(b"one")  # rewritten, same bytes
    assert key(files) == first
    train.write_bytes(b"One")
    assert key(files) != first


def test_a_users_critic_model_beats_the_pipelines(tmp_path):
    o = plan.ppo_overrides([], ["critic.model.path=/critic"], model_path="/m", train_file="/t.parquet",
                           val_file="/v.parquet", run_dir=str(tmp_path), total_steps=2, segment_steps=2,
                           stop_after_step=2, adv_estimator="gae", experiment="e")
    d = dict(x.split("=", 1) for x in o)
    assert (d["actor_rollout_ref.model.path"], d["critic.model.path"]) == ("/m", "/critic")
