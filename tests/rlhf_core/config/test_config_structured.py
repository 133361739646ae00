"""The typed structured config backed by the config classes: complete, typed, struct mode, picklable, and a key
declared once in its class is in `config show`, `config check`, the generated YAML and the generated doc."""
from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, List, Optional

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ValidationError

from rlhf_core.config import ConfigError, config_dir, load_config
from rlhf_core.config.schema import flatten, specs
from rlhf_core.config.structured import schema_class, schema_paths
from tests.paths import REPO

ROOT = REPO


@pytest.mark.parametrize("name", ["ppo_trainer", "sft_trainer", "evaluation"])
def test_loaded_config_is_complete_typed_and_struct(name):
    cfg = load_config(name)
    assert OmegaConf.get_type(cfg) is schema_class(name)
    # every leaf of the YAML is present (free-form dicts count as one leaf)
    yaml_leaves = set(flatten(OmegaConf.load(Path(config_dir()) / f"{name}.yaml"), resolve=False))
    assert yaml_leaves == set(flatten(cfg, resolve=False)) == schema_paths(name)
    with pytest.raises(ConfigAttributeError):
        cfg.trainer.no_such_key  # struct mode: a typo in code fails at once


def _hint(name: str, path: str):
    cls = schema_class(name)
    *sections, leaf = path.split(".")
    for part in sections:
        cls = typing.get_type_hints(cls)[part]
    return typing.get_type_hints(cls)[leaf]


def test_field_types_are_the_declared_annotations():
    assert _hint("ppo_trainer", "trainer.total_epochs") is int
    assert _hint("ppo_trainer", "actor_rollout_ref.actor.optim.lr") is float
    assert _hint("ppo_trainer", "data.seed") == Optional[int]  # null allowed, default 42
    assert _hint("ppo_trainer", "data.val_batch_size") == Optional[int]  # null default, int values
    assert _hint("ppo_trainer", "trainer.logger") is Any  # a list or one string: types=(list, str)
    assert specs("ppo_trainer")["trainer.logger"].types == (list, str)
    assert _hint("ppo_trainer", "actor_rollout_ref.actor.checkpoint.save_contents") == List[str]
    # what the checks read: float keys take ints, null is allowed where the annotation is Optional
    seed, lr = specs("ppo_trainer")["data.seed"], specs("ppo_trainer")["actor_rollout_ref.actor.optim.lr"]
    assert (seed.types, seed.null_ok, lr.types, lr.null_ok) == ((int,), True, (int, float), False)
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


def _run(code: str, env: dict[str, str], cwd: Path = ROOT) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env}, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_pickled_config_loads_in_a_fresh_process_with_or_without_the_yaml(tmp_path):
    path = tmp_path / "cfg.pkl"
    path.write_bytes(pickle.dumps(load_config("ppo_trainer", ["data.seed=0"]).actor_rollout_ref))
    code = (f"import pickle; c = pickle.load(open({str(path)!r}, 'rb')); "
            "print(c.actor.clip_ratio, c._get_root().data.seed, type(c).__name__)")
    assert _run(code, {}) == "0.2 0 DictConfig"
    # a Ray worker without the YAML folder (RLHF_CONFIG_DIR names none): placeholder classes, values still read
    assert _run(code, {"RLHF_CONFIG_DIR": str(tmp_path / "missing")}) == "0.2 0 DictConfig"


def test_a_key_declared_once_is_in_show_check_the_generated_yaml_and_the_doc(tmp_path):
    # how a new key is added: one line in its class (default, type, help), then the generator
    for part in ("rlhf_core", "docs"):  # the YAML is package data: rlhf_core/configs/
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    module = tmp_path / "rlhf_core" / "config" / "schemas" / "evaluation.py"
    text = module.read_text()
    anchor = "class OutputConfig:\n"
    start = text.index(anchor)
    first_field = text.index("\n    ", text.index('"""', text.index('"""', start) + 3)) + 1
    module.write_text(text[:first_field] + "    throwaway_key: int = key(3, 'a throwaway key for a test')\n"
                      + text[first_field:])
    env = {"PYTHONPATH": str(tmp_path)}
    gen = "from rlhf_core.config.gen_yaml import main; raise SystemExit(main({}))"
    # the committed files are now stale, and the generator says which
    # (run from the copy: `python -c` puts the working directory first on sys.path)
    stale = subprocess.run([sys.executable, "-c", gen.format("['--check']")], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=120, cwd=tmp_path)
    assert stale.returncode == 1 and "stale: rlhf_core/configs/evaluation.yaml" in stale.stderr
    assert "stale: docs/CONFIG_KEYS.md" in stale.stderr
    assert _run(gen.format("[]"), env, tmp_path) == ""
    yaml_text = (tmp_path / "rlhf_core" / "configs" / "evaluation.yaml").read_text()
    assert "output:\n  # a throwaway key for a test\n  throwaway_key: 3\n" in yaml_text
    assert "| `output.throwaway_key` | `3` | supported | verl | a throwaway key for a test |" in (
        tmp_path / "docs" / "CONFIG_KEYS.md").read_text()
    show = ("from rlhf_core.config.cli import main; "
            "raise SystemExit(main(['show', '--config-name', 'evaluation', 'output.throwaway_key=5']))")
    assert "throwaway_key: 5" in _run(show, env, tmp_path)
    check = ("from rlhf_core.config.cli import main; "
             "raise SystemExit(main(['check', '--config-name', 'evaluation', 'output.throwaway_key=many']))")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env}, cwd=tmp_path)
    assert out.returncode == 1 and "output.throwaway_key='many': expected int" in out.stderr
