"""The typed structured config built from configs/*.yaml: complete, typed, struct mode, picklable, and a key
added to the YAML is in the schema with nothing to regenerate."""
from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Optional

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ValidationError

from rlhf_core.config import ConfigError, config_dir, load_config
from rlhf_core.config.schema import flatten
from rlhf_core.config.structured import field_type, schema_class, schema_paths

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["ppo_trainer", "sft_trainer", "evaluation"])
def test_loaded_config_is_complete_typed_and_struct(name):
    cfg = load_config(name)
    assert OmegaConf.get_type(cfg) is schema_class(name)
    # every leaf of the YAML is present (free-form dicts count as one leaf)
    yaml_leaves = set(flatten(OmegaConf.load(Path(config_dir()) / f"{name}.yaml"), resolve=False))
    assert yaml_leaves == set(flatten(cfg, resolve=False)) == schema_paths(name)
    with pytest.raises(ConfigAttributeError):
        cfg.trainer.no_such_key  # struct mode: a typo in code fails at once


def test_field_types_come_from_the_yaml_defaults_and_the_types_table():
    assert field_type("trainer.total_epochs", 30) is int
    assert field_type("actor_rollout_ref.actor.optim.lr", 1e-6) is float
    assert field_type("data.seed", 42) == Optional[int]  # NULL_OK: null allowed, default 42
    assert field_type("data.val_batch_size", None) == Optional[int]  # TYPES: null default, int values
    assert field_type("trainer.logger", ["console"]) is Any  # TYPES: a list or one string
    assert field_type("actor_rollout_ref.actor.checkpoint.save_contents", ["model"]) == List[str]
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.actor.optim.lr=1"])
    assert cfg.actor_rollout_ref.actor.optim.lr == 1.0 and isinstance(cfg.actor_rollout_ref.actor.optim.lr, float)
    with pytest.raises(ValidationError):
        cfg.trainer.total_epochs = "many"  # typed: an int key refuses a word


def test_type_errors_name_the_key_before_typing():
    with pytest.raises(ConfigError, match="trainer.total_epochs='many': expected int"):
        load_config("ppo_trainer", ["trainer.total_epochs=many"])


def test_dataclass_defaults_are_the_yaml_as_written():
    actor = schema_class("ppo_trainer")().actor_rollout_ref.rollout
    assert actor.prompt_length == "${data.max_prompt_length}"  # interpolations kept, resolved at load
    assert dataclasses.is_dataclass(actor)


def _run(code: str, env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_pickled_config_loads_in_a_fresh_process_with_or_without_the_yaml(tmp_path):
    path = tmp_path / "cfg.pkl"
    path.write_bytes(pickle.dumps(load_config("ppo_trainer", ["data.seed=0"]).actor_rollout_ref))
    code = (f"import pickle; c = pickle.load(open({str(path)!r}, 'rb')); "
            "print(c.actor.clip_ratio, c._get_root().data.seed, type(c).__name__)")
    assert _run(code, {}) == "0.2 0 DictConfig"
    # a Ray worker without configs/ (only the package): placeholder classes, values still read
    assert _run(code, {"RLHF_CONFIG_DIR": str(tmp_path / "missing")}) == "0.2 0 DictConfig"


def test_a_key_added_to_the_yaml_is_in_the_schema_with_nothing_to_regenerate(tmp_path):
    # how a new key is added: one line in configs/<name>.yaml (its default written there, once)
    conf = tmp_path / "configs"
    shutil.copytree(config_dir(), conf)
    text = (conf / "evaluation.yaml").read_text()
    (conf / "evaluation.yaml").write_text(text.replace("output:\n", "output:\n  # new\n  new_key: 3\n", 1))
    code = ("from rlhf_core.config import load_config; c = load_config('evaluation', ['output.new_key=5']); "
            "print(c.output.new_key, type(c.output.new_key).__name__)")
    assert _run(code, {"RLHF_CONFIG_DIR": str(conf)}) == "5 int"
