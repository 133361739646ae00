"""The layer contract (pyproject.toml ``[tool.importlinter]``, docs/ARCHITECTURE.md "Layers") holds, and the check
fails when it is broken: an import from a lower layer to a higher one, a core room importing a higher room, the
core importing Prefect, and a circle of files inside a package (import-linter's ``acyclic_siblings``, on grimp's
graph) each break a copy of the tree with one injected line.

import-linter reads the source (it never imports it), so the copies need no working imports; it runs in a
subprocess with the tree under test first on ``sys.path``, so the installed (editable) packages are not read instead.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())  # the repository root
PACKAGES = ("rlhf_cli", "flows", "tasks", "infra", "rlhf_core")
_LINT = ("import sys; from importlinter.cli import lint_imports; "
         "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))")


def lint(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with ``root``'s pyproject.toml over ``root``'s packages; the report in ``stdout``."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-c", _LINT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the five packages and pyproject.toml (sources only)."""
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def inject(root: Path, module: str, line: str) -> None:
    """Append ``line`` (an import at module level) to ``module``'s file in the copy."""
    path = root / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}\n")


def broken(report: str) -> list[str]:
    """The names of the contracts the report lists as BROKEN (``<name> BROKEN (6 ignored imports)``)."""
    return sorted(m[1] for m in re.finditer(r"^(.*) BROKEN(?: \(\d+ ignored imports?\))?$", report, re.M))


def test_the_tree_keeps_every_contract():
    out = lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 4 kept, 0 broken." in out.stdout


def test_an_import_from_the_core_up_to_tasks_and_prefect_breaks_the_house(tree):
    inject(tree, "rlhf_core.protocol", "from tasks import plan")
    inject(tree, "rlhf_core.algos.kl", "import prefect")
    out = lint(tree)
    assert out.returncode == 1
    # the rooms' contract breaks too: protocol (the lowest room) now reaches, through tasks.plan, the rooms
    # tasks.plan imports (an upward chain by way of another package counts)
    assert broken(out.stdout) == ["rlhf_core knows nothing of Prefect or DuckDB (it runs alone, like verl)",
                                  "the core's rooms: trainer > workers > ... > config",
                                  "the house: rlhf_cli > flows > tasks > infra > rlhf_core"]
    assert "rlhf_core.protocol -> tasks.plan" in out.stdout
    assert "rlhf_core.algos.kl -> prefect" in out.stdout


def test_a_room_of_the_core_importing_a_higher_room_breaks_the_core_layers(tree):
    # config is the lowest room: a schema module reaching for the trainer is an upward arrow
    inject(tree, "rlhf_core.config.errors", "from rlhf_core.trainer import ppo_trainer")
    out = lint(tree)
    assert out.returncode == 1
    # the same line also closes a circle of rlhf_core's rooms (trainer -> config -> trainer)
    assert broken(out.stdout) == ["no circle of files or sub-packages inside a package",
                                  "the core's rooms: trainer > workers > ... > config"]
    assert "rlhf_core.config.errors -> rlhf_core.trainer.ppo_trainer" in out.stdout


def test_a_circle_of_two_files_breaks_the_no_circles_contract(tree):
    # the circle issue 37 broke: rl_dataset <- factory, and rl_dataset importing factory back at module level
    inject(tree, "rlhf_core.data.rl_dataset", "from rlhf_core.data.factory import create_rl_dataset")
    out = lint(tree)
    assert out.returncode == 1
    assert broken(out.stdout) == ["no circle of files or sub-packages inside a package"]
    assert "No cycles are allowed in rlhf_core.data." in out.stdout
    assert ".rl_dataset -> .factory" in out.stdout or ".factory -> .rl_dataset" in out.stdout


def test_an_import_inside_a_function_counts_too(tree):
    # a lazy import closes the circle when it runs; only the listed ones (with their reasons) are allowed
    inject(tree, "infra.compare", "def _late():\n    from infra.results_cli import main\n    return main")
    out = lint(tree)
    assert broken(out.stdout) == ["no circle of files or sub-packages inside a package"]
    assert "No cycles are allowed in infra." in out.stdout
