"""Whether a ``global_step_N`` checkpoint is complete, and the manifest that says so.

A step folder is **complete** for a set of components (``actor``, and ``critic`` when the run has one) when:

* it has ``checkpoint_manifest.json`` (written by :func:`write_manifest` once every component, ``data.pt`` and
  ``trainer_state.pt`` are on disk, before the tracker names the step): every file it lists under those
  components exists with the listed size, and every listed ``data.pt`` / ``trainer_state.pt`` that is present has
  its listed size (they may be absent: the data position then follows the global step, ``docs/RESUME.md``); or
* it has no manifest (written before manifests existed): each component folder exists; each of its DCP folders
  (``model/``, ``optim/``) has a ``.metadata`` (read without running code, :mod:`rlhf_core.safe_load`) whose
  every shard file exists and is long enough for the items it holds; and ``extra_state_world_size_W_rank_R.pt``
  exists for every rank ``R < W``.

:func:`step_problems` lists what is missing (``[]``: complete), each entry naming the file.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterable

from rlhf_core.atomic import atomic_write_text
from rlhf_core.safe_load import CheckpointError, SafeFileSystemReader

MANIFEST = "checkpoint_manifest.json"
OPTIONAL = ("data.pt", "trainer_state.pt")
_EXTRA = re.compile(r"^extra_state_world_size_(\d+)_rank_\d+\.pt$")


def _files_under(root: str) -> dict[str, int]:
    """``{path relative to root: size in bytes}`` of every file below ``root``."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = os.path.getsize(path)
    return out


def write_manifest(step_path: str, global_step: int, components: Iterable[str]) -> str:
    """Write ``<step_path>/checkpoint_manifest.json``: ``{"global_step", "components", "files": {relpath: bytes}}``
    over everything now in ``step_path`` (atomically, :func:`rlhf_core.atomic.atomic_write_text`). Returns its path."""
    files = {k: v for k, v in _files_under(step_path).items() if k != MANIFEST}
    path = os.path.join(step_path, MANIFEST)
    atomic_write_text(path, json.dumps({"global_step": int(global_step), "components": sorted(components),
                                        "files": dict(sorted(files.items()))}, indent=1))
    return path


def _read_manifest(step_path: str) -> dict | None:
    path = os.path.join(step_path, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as fh:
            manifest = json.load(fh)
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not a mapping")
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: not a checkpoint manifest ({exc})") from None
    return manifest


def _manifest_problems(step_path: str, files: dict[str, int], components: Iterable[str]) -> list[str]:
    problems = []
    for component in components:
        listed = {k: v for k, v in files.items() if k.startswith(component + os.sep)}
        if not listed:
            problems.append(f"{os.path.join(step_path, component)} (not in {MANIFEST})")
    for rel, size in files.items():
        top = rel.split(os.sep)[0]
        if top not in components and top not in OPTIONAL:
            continue
        path = os.path.join(step_path, rel)
        if not os.path.exists(path):
            if top not in OPTIONAL:
                problems.append(f"{path} (missing)")
        elif os.path.getsize(path) != int(size):
            problems.append(f"{path} ({os.path.getsize(path)} bytes, {MANIFEST} says {size})")
    return problems


def _dcp_problems(dcp_dir: str) -> list[str]:
    """Shard files that a DCP folder's ``.metadata`` names and that are missing or too short."""
    meta_path = os.path.join(dcp_dir, ".metadata")
    if not os.path.exists(meta_path):
        return [f"{meta_path} (missing)"]
    metadata = SafeFileSystemReader(dcp_dir).read_metadata()
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), int(info.offset) + int(info.length))
    problems = []
    for rel, size in sorted(needed.items()):
        path = os.path.join(dcp_dir, rel)
        if not os.path.exists(path):
            problems.append(f"{path} (missing)")
        elif os.path.getsize(path) < size:
            problems.append(f"{path} ({os.path.getsize(path)} bytes, its .metadata needs {size})")
    return problems


def _legacy_problems(component_dir: str) -> list[str]:
    if not os.path.isdir(component_dir):
        return [f"{component_dir} (missing)"]
    problems = []
    for sub in ("model", "optim"):
        if os.path.isdir(os.path.join(component_dir, sub)):
            problems += _dcp_problems(os.path.join(component_dir, sub))
    worlds = {int(m.group(1)) for m in map(_EXTRA.match, os.listdir(component_dir)) if m}
    for world in sorted(worlds):
        problems += [f"{component_dir}/extra_state_world_size_{world}_rank_{r}.pt (missing)" for r in range(world)
                     if not os.path.exists(os.path.join(component_dir, f"extra_state_world_size_{world}_rank_{r}.pt"))]
    return problems


def step_problems(step_path: str, components: Iterable[str]) -> list[str]:
    """What keeps ``step_path`` (a ``global_step_N`` folder) from being a complete checkpoint of ``components``
    (module docstring); ``[]`` when it is complete. Each entry names a file or folder and why.

    Raises:
        CheckpointError: an unreadable manifest, or a DCP ``.metadata`` that holds other Python objects.
    """
    components = list(components)
    if not os.path.isdir(step_path):
        return [f"{step_path} (missing)"]
    manifest = _read_manifest(step_path)
    if manifest is not None:
        return _manifest_problems(step_path, manifest["files"], components)
    return [p for c in components for p in _legacy_problems(os.path.join(step_path, c))]


def is_complete(step_path: str, components: Iterable[str]) -> bool:
    """``step_problems(step_path, components) == []``; a step whose metadata cannot be read is not complete."""
    try:
        return not step_problems(step_path, components)
    except CheckpointError:
        return False
