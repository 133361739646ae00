"""trainer.checkpoint_callback_class (verl 0.9.1): ``<file>.py:<ClassName>``, loaded from that file only (sha256
logged, as the reward function's), or verl's dotted ``pkg.module.Class`` (its module's file and sha256 logged), built with the config; its on_save runs on the driver after each checkpoint
save completes (the fake-worker PPO loop of test_trainer_ppo.py)."""
from __future__ import annotations

import hashlib
import json
import logging

import pytest
from omegaconf import OmegaConf

from rlhf_core.config import ConfigError, load_config
from rlhf_core.trainer.checkpoint_callback import check_checkpoint_callback, load_checkpoint_callback_class
from tests.rlhf_core.trainer.test_trainer_ppo import make_config, run

KEY = "trainer.checkpoint_callback_class"
RECORDER = '''import json, os
from rlhf_core.trainer.checkpoint_callback import CheckpointCallback


class Recorder(CheckpointCallback):
    def on_save(self, trainer, global_step, checkpoint_dir, async_save=False, **kwargs):
        tracker = os.path.join(os.path.dirname(checkpoint_dir), "latest_checkpointed_iteration.txt")
        with open(tracker) as fh:  # the save (tracker included) is complete when the hook runs
            latest = int(fh.read())
        with open(os.path.join(os.path.dirname(__file__), "events.jsonl"), "a") as fh:
            fh.write(json.dumps([global_step, os.path.basename(checkpoint_dir), latest, async_save,
                                 self.config.trainer.experiment_name, trainer.global_steps]) + "\\n")
'''


def _load_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rlhf_core.user_code" and KEY in r.getMessage()]


def test_on_save_runs_after_each_save_from_the_file_whose_sha256_is_logged(tmp_path, caplog):
    source = tmp_path / "cb.py"
    source.write_text(RECORDER)
    cfg = make_config(tmp_path, total_training_steps=4, val_before_train=False,
                      checkpoint_callback_class=f"{source}:Recorder")
    with caplog.at_level(logging.INFO, logger="rlhf_core.user_code"):
        check_checkpoint_callback(cfg)  # run_ppo's check before Ray; the trainer then builds from the same load
        run(cfg)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    # save_freq 2 over 4 steps: saves at 2 and 4, each followed by its hook
    assert events == [[2, "global_step_2", 2, False, "e", 2], [4, "global_step_4", 4, False, "e", 4]]
    # one load in this process, logged with the absolute path and the sha256 of the bytes run
    assert _load_lines(caplog) == [f"{KEY}: loading {source} (sha256 {hashlib.sha256(RECORDER.encode()).hexdigest()})"]


def test_a_relative_path_resolves_against_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "rel.py").write_text("class Up:\n    def on_save(self, **kw):\n        pass\n")
    monkeypatch.chdir(tmp_path)
    cls = load_checkpoint_callback_class(OmegaConf.create({"trainer": {"checkpoint_callback_class":
                                                                           "hooks/rel.py:Up"}}))
    assert cls.__name__ == "Up" and cls.__module__.startswith("rlhf_checkpoint_callback_")


def test_verls_dotted_form_imports_the_module_and_logs_its_file(tmp_path, monkeypatch, caplog):
    """verl 0.9.1's form (load_class_from_fqn): pkg.module.Class imported from sys.path; its file and sha256 logged."""
    source = "class Up:\n    def on_save(self, **kw):\n        pass\n"
    (tmp_path / "cbpkg_rlhf_test").mkdir()
    (tmp_path / "cbpkg_rlhf_test" / "__init__.py").write_text("")
    (tmp_path / "cbpkg_rlhf_test" / "hooks.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    value = "cbpkg_rlhf_test.hooks.Up"
    load_config("ppo_trainer", [f"{KEY}={value}"])  # the form is accepted at config load
    with caplog.at_level(logging.INFO, logger="rlhf_core.user_code"):
        cls = load_checkpoint_callback_class(OmegaConf.create({"trainer": {"checkpoint_callback_class": value}}))
    assert cls.__name__ == "Up" and cls.__module__ == "cbpkg_rlhf_test.hooks"
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert _load_lines(caplog) == [f"{KEY}: loading module cbpkg_rlhf_test.hooks from "
                                   f"{tmp_path / 'cbpkg_rlhf_test' / 'hooks.py'} (sha256 {digest})"]
    # a module that is not there: named, with the file form that needs no package
    with pytest.raises(ConfigError) as info:
        load_checkpoint_callback_class(OmegaConf.create({"trainer": {"checkpoint_callback_class":
                                                                         "no_such_pkg_rlhf.cb.Upload"}}))
    assert str(info.value).startswith(f"{KEY}='no_such_pkg_rlhf.cb.Upload': no module 'no_such_pkg_rlhf.cb'")
    assert "no_such_pkg_rlhf/cb.py:Upload" in str(info.value)


@pytest.mark.parametrize("value, message", [
    ("cb:Upload", "'cb' is not a Python source file (.py)"),
    ("cb.txt:Upload", "'cb.txt' is not a Python source file (.py)"),
    ("cb.py:1st", "'1st' after the ':' is not a Python name")])
def test_the_form_is_refused_at_config_load_naming_key_and_value(value, message):
    with pytest.raises(ConfigError) as info:
        load_config("ppo_trainer", [f"{KEY}={value}"])
    assert f"{KEY}={value!r}: {message}" in str(info.value)


@pytest.mark.parametrize("source, value, message", [
    (None, "missing.py:Cb", "no such file 'missing.py'"),
    ("raise RuntimeError('boom')\n", "cb.py:Cb", "failed to import: RuntimeError('boom')"),
    ("class Other:\n    pass\n", "cb.py:Cb", "defines no class 'Cb'; classes found there: ['Other']"),
    ("class Cb:\n    pass\n", "cb.py:Cb", "Cb has no on_save(")])
def test_a_bad_file_or_class_names_the_key_and_value(tmp_path, monkeypatch, source, value, message):
    monkeypatch.chdir(tmp_path)
    if source is not None:
        (tmp_path / "cb.py").write_text(source)
    with pytest.raises(ConfigError) as info:
        load_checkpoint_callback_class(OmegaConf.create({"trainer": {"checkpoint_callback_class": value}}))
    assert str(info.value).startswith(f"{KEY}={value!r}: ") and message in str(info.value)
