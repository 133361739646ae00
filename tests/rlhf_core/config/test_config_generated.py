"""rlhf_core/configs/*.yaml and docs/CONFIG_KEYS.md are generated from the config classes and committed: they must be
current (as verl checks its ``_generated_ppo_trainer.yaml``), and the YAML must load to exactly the classes' defaults."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from rlhf_core.config import config_dir
from rlhf_core.config.gen_yaml import render, scalar
from rlhf_core.config.schema import CONFIG_NAMES
from rlhf_core.config.structured import shipped_defaults
from tests.paths import REPO

ROOT = REPO


def test_generated_files_are_current():
    # a fresh process: names other tests register in this one must not count as built-in
    out = subprocess.run([sys.executable, "-m", "rlhf_core.config.gen_yaml", "--check"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_the_yaml_loads_to_the_class_defaults(name):
    from_yaml = OmegaConf.to_container(OmegaConf.create(render(name)), resolve=False)
    assert from_yaml == OmegaConf.to_container(shipped_defaults(name), resolve=False)
    assert (OmegaConf.load(f"{config_dir()}/{name}.yaml") == OmegaConf.create(from_yaml))


@pytest.mark.parametrize("value, text", [(1e-6, "1e-6"), (0.0, "0.0"), (True, "True"), (None, "null"),
                                         ("true", "'true'"), (["model", "extra"], "[model, extra]"), ([], "[]"),
                                         ("${data.max_prompt_length}", "${data.max_prompt_length}"), (1e-4, "0.0001")])
def test_scalars_are_written_as_verl_writes_them(value, text):
    assert scalar(value) == text
    assert OmegaConf.to_container(OmegaConf.create(f"k: {text}"), resolve=False)["k"] == value


@pytest.mark.parametrize("field, message", [
    ("nu_a: int = key(None, 'a key whose default its annotation cannot hold')",
     "Incompatible value 'None' for field of type 'int' full_key: output.nu_a"),
    ("nu_b: str = key('zz', 'a default outside its own choices', choices=('a', 'b'))",
     "output.nu_b='zz' is not one of ['a', 'b']"),
])
def test_a_class_whose_defaults_do_not_load_is_named_and_nothing_is_written(tmp_path, field, message):
    for part in ("rlhf_core", "docs"):  # the YAML is package data: rlhf_core/configs/
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    module = tmp_path / "rlhf_core" / "config" / "schemas" / "evaluation.py"
    text = module.read_text()
    anchor = "    samples_dir: Optional[str] = key("
    module.write_text(text.replace(anchor, f"    {field}\n{anchor}", 1))
    before = (tmp_path / "rlhf_core" / "configs" / "evaluation.yaml").read_text()
    out = subprocess.run([sys.executable, "-m", "rlhf_core.config.gen_yaml"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 1
    assert "the config classes do not load as declared; nothing written" in out.stderr and message in out.stderr
    assert (tmp_path / "rlhf_core" / "configs" / "evaluation.yaml").read_text() == before
