"""A non-editable install works (issue 37): the wheel built from this working tree, installed into a fresh venv, runs
``rlhf config show``, ``rlhf config check`` and ``rlhf ppo --help`` from a folder outside the repository with no
PYTHONPATH, importing the five packages and reading the configs (package data, ``rlhf_core/configs/``) from the venv.

To stay fast and offline the fresh venv has no pip and borrows this environment's installed dependencies through a
``.pth`` line (a plain path: the ``.pth`` files there, such as an editable install's finder, are not run), and the
wheel is installed with ``--no-deps --no-index``; the import paths printed by the fresh interpreter prove the
checkout is not what runs. The build happens in a copy of the tree, so no build/ or *.egg-info lands in the repository.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("rlhf_core", "rlhf_cli", "tasks", "flows", "infra")  # pyproject's [tool.setuptools.packages.find]

PROBE = """
import json, rlhf_core, rlhf_cli, tasks, flows, infra
from flows.experiment import ExperimentError, demo_experiment
from rlhf_core.config import config_dir, shipped_config_dir
try:
    demo_experiment(None)
    demo = None
except ExperimentError as exc:
    demo = str(exc)
print(json.dumps({"files": [m.__file__ for m in (rlhf_core, rlhf_cli, tasks, flows, infra)],
                  "shipped": str(shipped_config_dir()), "config_dir": config_dir(), "demo": demo}))
"""


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


@pytest.mark.slow
def test_the_wheel_in_a_fresh_venv_runs_rlhf_from_outside_the_repository(tmp_path):
    # 1. the wheel, built from a copy of the working tree (what `pip wheel .` would read, without writing into it)
    src = tmp_path / "src"
    for name in PACKAGES:
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
          str(dist), str(src)], src, dict(os.environ), timeout=300)
    wheels = list(dist.glob("rlhf_pipeline-*.whl"))
    assert len(wheels) == 1, wheels

    # 2. a fresh venv that sees this environment's dependencies but not its rlhf packages, then the wheel in it
    venv = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, dict(os.environ))
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path,
                     dict(os.environ)).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_borrowed_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
          str(wheels[0])], tmp_path, dict(os.environ), timeout=300)

    # 3. from a folder outside the repository, no PYTHONPATH, no RLHF_CONFIG_DIR
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RLHF_CONFIG_DIR", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    probe = json.loads(_run([str(python), "-c", PROBE], work, env).stdout)
    for file in probe["files"]:  # each package imported from the venv's site-packages, none from the checkout
        assert Path(file).is_relative_to(site), (file, site)
    shipped = Path(probe["shipped"])
    assert shipped == site / "rlhf_core" / "configs" and probe["config_dir"] == str(shipped)
    # the package data is the generated YAML of this tree, byte for byte, tools included
    expected = sorted(p.relative_to(REPO / "rlhf_core" / "configs") for p in (REPO / "rlhf_core" / "configs").rglob(
        "*.yaml"))
    assert sorted(p.relative_to(shipped) for p in shipped.rglob("*.yaml")) == expected and len(expected) == 6
    for rel in expected:
        assert (shipped / rel).read_bytes() == (REPO / "rlhf_core" / "configs" / rel).read_bytes(), rel
    # the demo experiments stay in the repository: the default experiment names the fix
    assert probe["demo"].startswith(f"the default experiment: no demo experiments at {site / 'experiments'} ")
    assert probe["demo"].endswith("pass --experiment FILE.yaml")

    # 4. the commands a wheel user runs first (started together: two cores, each mostly import time)
    rlhf = str(venv / "bin" / "rlhf")
    (work / "my_ppo.yaml").write_text("actor_rollout_ref:\n  rollout: {name: hf}\n  actor: {optim: {lr: 3.0e-6}}\n")
    commands = {
        "show": [rlhf, "config", "show", "algorithm.adv_estimator=grpo"],
        "show_yaml": [rlhf, "config", "show", "--config-dir", str(shipped), "algorithm.adv_estimator=grpo"],
        "check": [rlhf, "config", "check", "--config-name", "my_ppo.yaml", "trainer.n_gpus_per_node=2"],
        "bad": [rlhf, "config", "check", "--config-name", "my_ppo.yaml", "actor_rollout_ref.actor.clip_ratio=x"],
        "help": [rlhf, "ppo", "--help"],
    }
    procs = {k: subprocess.Popen(c, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k, c in commands.items()}
    done = {k: (*p.communicate(timeout=240), p.returncode) for k, p in procs.items()}  # (stdout, stderr, rc)
    for key in ("show", "show_yaml", "check", "help"):
        assert done[key][2] == 0, (key, done[key][1][-3000:])
    show = done["show"][0]
    # verl's defaults with the override applied: clip_ratio 0.2, lr 1e-6 (ppo_trainer.yaml), adv_estimator grpo
    assert "  adv_estimator: grpo\n" in show and "    clip_ratio: 0.2\n" in show and "      lr: 1.0e-06\n" in show
    assert done["show_yaml"][0] == show  # the wheel's YAML loads to exactly the classes' defaults
    assert "OK: my_ppo.yaml is valid" in done["check"][1]
    assert done["bad"][2] == 1 and "actor_rollout_ref.actor.clip_ratio='x': expected int or float" in done["bad"][1]
    assert done["help"][0].startswith("usage: rlhf ppo ")
