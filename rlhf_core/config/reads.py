"""Record which config keys a run reads, by full path, in every process (driver and Ray workers).

Set ``RLHF_CONFIG_READS=/path/file``: importing :mod:`rlhf_core.config` in a process (the driver, or a Ray
worker unpickling its config: the schema classes live in this package) wraps ``DictConfig.__getattr__`` and
``DictConfig.__getitem__``, and each process appends every full path it reads for the first time
(``actor_rollout_ref.actor.clip_ratio``) as one line to that file (append mode, one ``write`` per line, so
several processes can share the file). Presence checks (``"key" in cfg``), ``OmegaConf.select``,
``to_container`` / ``to_yaml`` (logging the whole config) and iteration are not reads: only code that asks
for a value by name counts. Embedded Ray workers inherit the variable from the driver;
``rlhf_core.distributed.ray_init.init_ray`` also passes it in the runtime environment.

tests/integration/test_config_reads_e2e.py runs each entry point with it and fails on a key marked
"supported" that no run reads and no per-key effect test covers.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig

ENV = "RLHF_CONFIG_READS"
_seen: dict[str, set[str]] = {}  # per recording file: paths this process already wrote
_installed = False


def _record(node: DictConfig, key: Any) -> None:
    path = os.environ.get(ENV)
    if not path or not isinstance(key, str):
        return
    try:
        full = node._get_full_key(key)
    except Exception:  # a node detached from its parent mid-construction: nothing to record
        return
    seen = _seen.setdefault(path, set())
    if full in seen:
        return
    seen.add(full)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(full + "\n")


def install() -> bool:
    """Wrap DictConfig's read methods once per process when ``RLHF_CONFIG_READS`` is set; returns whether active."""
    global _installed
    if _installed or not os.environ.get(ENV):
        return _installed
    get_attr, get_item = DictConfig.__getattr__, DictConfig.__getitem__

    def __getattr__(self: DictConfig, key: str) -> Any:
        value = get_attr(self, key)
        _record(self, key)
        return value

    def __getitem__(self: DictConfig, key: Any) -> Any:
        value = get_item(self, key)
        _record(self, key)
        return value

    DictConfig.__getattr__ = __getattr__  # type: ignore[method-assign]
    DictConfig.__getitem__ = __getitem__  # type: ignore[method-assign]
    _installed = True
    return True


def read_paths(path: str) -> set[str]:
    """Every full path recorded in the file ``path`` (all processes)."""
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as fh:
        return {line.strip() for line in fh if line.strip()}
