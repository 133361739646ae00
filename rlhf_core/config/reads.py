"""Record which config keys a run reads, by full path, in every process (driver and Ray workers).

Set ``RLHF_CONFIG_READS=/path/file``: :func:`~rlhf_core.config.load_config` then returns a config whose every
``DictConfig`` node is a :class:`RecordingConfig` (:func:`record_reads`), and each process appends every full
path it reads for the first time (``actor_rollout_ref.actor.clip_ratio``) as one line to that file (append mode,
one ``write`` per line, so several processes can share the file). Without the variable nothing changes: the
loaded config is plain ``DictConfig`` and no library class is touched, in any process.

What counts as a read: asking for a value by name, ``cfg.key`` and ``cfg["key"]`` (also ``items()`` /
``values()``, which omegaconf implements with ``cfg[key]``). Presence checks (``"key" in cfg``),
``cfg.get(key)``, ``OmegaConf.select``, ``to_container`` / ``to_yaml`` (logging the whole config) and iteration
over the keys are not reads. Only reads made after ``load_config`` returns count: the loader's own validation
reads do not (the proof is about the code that runs, not about the checks before it).

Design: ``RecordingConfig`` subclasses ``DictConfig`` and overrides ``__getattr__`` / ``__getitem__`` (delegate,
then record) and ``__deepcopy__``; it adds no other attribute or method, since any name defined on the class would
shadow a config key of that name on attribute access. The nodes of the loaded config are switched to it by
assigning their ``__class__`` (``RecordingConfig`` adds no slots and no state: same layout, same ``__dict__``,
so every omegaconf operation sees the node it built). This touches only the objects of our config, never
``DictConfig`` itself. How recording survives what the code does with a config afterwards:

* pickling (a Ray worker receiving its config or a section of it): pickle stores each node's class by
  reference, ``rlhf_core.config.reads.RecordingConfig``, so the worker unpickles recording nodes; the worker
  writes to the file named by its own ``RLHF_CONFIG_READS`` (embedded workers inherit it,
  ``rlhf_core.distributed.ray_init.init_ray`` also passes it in the runtime environment);
* ``copy.deepcopy`` / ``cfg.copy()`` / ``OmegaConf.merge(cfg, ...)`` (which starts from a deep copy):
  omegaconf's ``__deepcopy__`` builds plain ``DictConfig`` nodes; ``RecordingConfig.__deepcopy__`` switches the
  copy to ``RecordingConfig`` (its children are copied by their own ``__deepcopy__``);
* nodes omegaconf creates later inside a recording config (``cfg.x = {...}``, ``cfg.merge_with(other)``): a
  plain ``DictConfig`` (or a ``ListConfig`` holding one) returned by a read of a recording node is switched
  (with its subtree) before it is returned, so it records from then on. One reached only through
  ``OmegaConf.select`` before any read by name stays plain;
* a new config built from plain data (``OmegaConf.create(OmegaConf.to_container(cfg))``) does not record: its
  paths would be relative to the new root anyway. rlhf_core/, tasks/ and flows/ do this only to print or log a
  whole config (``resolved_yaml``, ``tasks.stages``' evaluation parameters), and in
  ``rlhf_core.workers.profiler.union_profiler_configs``, which reads the role blocks (recorded) to build a merged
  block with its own top-level keys.

tests/integration/test_config_reads_e2e.py runs each entry point with it and fails on a key marked
"supported" that no run reads and no per-key effect test covers.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig
from omegaconf.base import Box, Node

ENV = "RLHF_CONFIG_READS"
_seen: dict[str, set[str]] = {}  # per recording file: paths this process already wrote


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


def _switch(node: Any) -> None:
    """Make every plain ``DictConfig`` in the tree under ``node`` (``node`` too) a ``RecordingConfig``."""
    stack = [node]
    while stack:
        item = stack.pop()
        if not isinstance(item, Box):  # a value node (or a plain value): no config below it
            continue
        if type(item) is DictConfig:
            object.__setattr__(item, "__class__", RecordingConfig)  # DictConfig.__setattr__ would set a key
        content = item.__dict__.get("_content")  # dict (DictConfig), list (ListConfig), tuple, Node (UnionNode)
        if isinstance(content, dict):
            stack.extend(content.values())
        elif isinstance(content, (list, tuple)):
            stack.extend(content)
        elif isinstance(content, Node):
            stack.append(content)


def _adopt(value: Any) -> Any:
    """``value`` (what a read of a recording node returns), a config below it switched to recording."""
    if isinstance(value, Box) and type(value) is not RecordingConfig:
        _switch(value)
    return value


class RecordingConfig(DictConfig):
    """A ``DictConfig`` node that records each key read from it by name (see the module docstring)."""

    __slots__ = ()

    def __getattr__(self, key: str) -> Any:
        value = super().__getattr__(key)
        _record(self, key)
        return _adopt(value)

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        _record(self, key)
        return _adopt(value)

    def __deepcopy__(self, memo: dict[int, Any]) -> DictConfig:
        res = super().__deepcopy__(memo)
        object.__setattr__(res, "__class__", RecordingConfig)
        return res


def record_reads(cfg: DictConfig) -> DictConfig:
    """``cfg`` with every ``DictConfig`` node recording its reads when ``RLHF_CONFIG_READS`` is set (else
    ``cfg`` untouched); returns ``cfg``. ``load_config`` calls it on the config it returns."""
    if os.environ.get(ENV):
        _switch(cfg)
    return cfg


def read_paths(path: str) -> set[str]:
    """Every full path recorded in the file ``path`` (all processes)."""
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as fh:
        return {line.strip() for line in fh if line.strip()}
