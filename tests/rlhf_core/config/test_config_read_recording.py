"""The config-read recorder (rlhf_core/config/reads.py): ``load_config`` with ``RLHF_CONFIG_READS`` set returns a
config of ``RecordingConfig`` nodes that record reads by name; no library class is patched, and the usual
omegaconf operations keep working on (and keep recording through) such a config."""
from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import ConfigAttributeError, ReadonlyConfigError

from rlhf_core.config import load_config, reads
from rlhf_core.config.reads import RecordingConfig
from tests.paths import REPO

ROOT = REPO


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """(the reads file, a function returning the paths recorded so far), RLHF_CONFIG_READS set to the file."""
    target = tmp_path / "reads.txt"
    monkeypatch.setenv(reads.ENV, str(target))
    return target, lambda: reads.read_paths(str(target))


def _nodes(cfg):
    """Every DictConfig node of ``cfg`` (itself included), through dicts and lists."""
    out, stack = [], [cfg]
    while stack:
        node = stack.pop()
        if isinstance(node, DictConfig):
            out.append(node)
            stack.extend(node._get_node(k) for k in node.keys())
        elif isinstance(node, ListConfig):
            stack.extend(node._get_node(i) for i in range(len(node)))
    return out


def test_without_the_variable_the_config_is_plain(monkeypatch):
    monkeypatch.delenv(reads.ENV, raising=False)
    cfg = load_config("ppo_trainer")
    assert all(type(n) is DictConfig for n in _nodes(cfg))


def test_with_the_variable_every_node_records(recorded):
    cfg = load_config("ppo_trainer")
    nodes = _nodes(cfg)
    assert len(nodes) > 20 and all(type(n) is RecordingConfig for n in nodes)


def test_recording_sees_attribute_and_item_reads_only(recorded):
    _, paths = recorded
    cfg = load_config("evaluation")
    assert paths() == set()  # the loader's own reads are not recorded
    OmegaConf.to_container(cfg, resolve=True)
    OmegaConf.to_yaml(cfg)
    OmegaConf.select(cfg, "data.path")
    assert "prompt_key" in cfg.data
    list(cfg.data), list(cfg.data.keys()), len(cfg.data)
    cfg.data.get("path")
    assert not {p for p in paths() if "." in p}  # only top-level section names at most
    cfg.data.path, cfg.output["samples_dir"]
    assert {"data.path", "output.samples_dir"} <= paths()


def test_each_path_is_written_once_per_process(recorded):
    target, _ = recorded
    cfg = load_config("evaluation")
    for _ in range(3):
        cfg.data.path
    assert target.read_text().splitlines().count("data.path") == 1


def test_no_library_class_is_patched():
    # a fresh interpreter importing the config package (and loading a config) with the variable set
    code = ("from omegaconf import DictConfig, ListConfig\n"
            "before = {n: (DictConfig.__dict__[n], ListConfig.__dict__[n]) for n in ('__getattr__', '__getitem__')}\n"
            "import rlhf_core.config\n"
            "cfg = rlhf_core.config.load_config('evaluation'); cfg.data.path\n"
            "after = {n: (DictConfig.__dict__[n], ListConfig.__dict__[n]) for n in ('__getattr__', '__getitem__')}\n"
            "assert before == after, after\n"
            "assert DictConfig.__getattr__.__module__ == 'omegaconf.dictconfig', DictConfig.__getattr__.__module__\n"
            "assert DictConfig.__getitem__.__module__ == 'omegaconf.dictconfig', DictConfig.__getitem__.__module__\n"
            "assert type(cfg).__name__ == 'RecordingConfig'\n")
    env = {**os.environ, reads.ENV: os.devnull}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)


def test_pickled_config_records_in_another_process(recorded, tmp_path):
    """What a Ray worker does: unpickle (the class by reference) and read; it writes to its own file."""
    cfg = load_config("ppo_trainer")
    blob = pickle.dumps(cfg.actor_rollout_ref)
    assert b"rlhf_core.config.reads" in blob and b"RecordingConfig" in blob
    worker_file = tmp_path / "worker.reads"
    code = ("import pickle, sys\n"
            "arr = pickle.loads(sys.stdin.buffer.read())\n"
            "assert type(arr).__name__ == 'RecordingConfig', type(arr)\n"
            "arr.actor.clip_ratio, arr.rollout['temperature']\n")
    env = {**os.environ, reads.ENV: str(worker_file)}
    subprocess.run([sys.executable, "-c", code], input=blob, check=True, env=env, cwd=ROOT)
    assert reads.read_paths(str(worker_file)) == {"actor_rollout_ref.actor", "actor_rollout_ref.actor.clip_ratio",
                                                   "actor_rollout_ref.rollout", "actor_rollout_ref.rollout.temperature"}


def test_omegaconf_operations_work_and_keep_recording(recorded):
    _, paths = recorded
    cfg = load_config("ppo_trainer")
    plain = OmegaConf.to_container(cfg, resolve=True)

    back = pickle.loads(pickle.dumps(cfg))
    assert type(back.trainer) is RecordingConfig and OmegaConf.to_container(back, resolve=True) == plain
    assert OmegaConf.is_struct(back) and OmegaConf.get_type(back.trainer) is OmegaConf.get_type(cfg.trainer)

    deep = copy.deepcopy(cfg)
    assert all(type(n) is RecordingConfig for n in _nodes(deep)) and deep == cfg
    shallow = cfg.trainer.copy()
    assert type(shallow) is RecordingConfig
    assert OmegaConf.to_yaml(cfg) == OmegaConf.to_yaml(OmegaConf.create(plain))
    assert OmegaConf.select(cfg, "trainer.project_name") == plain["trainer"]["project_name"]
    assert set(cfg) == set(plain) and "trainer" in cfg and "nope" not in cfg
    assert cfg.trainer.get("nope", 7) == 7 and dict(cfg.trainer.items()) == dict(plain["trainer"].items())

    with pytest.raises(ConfigAttributeError):  # struct mode: a typo is an error, as on a plain config
        cfg.trainer.nope
    with pytest.raises(ConfigAttributeError):
        cfg.trainer.nope = 1
    with open_dict(cfg.trainer):
        cfg.trainer.added = {"inner": 1}  # a node omegaconf creates inside a recording config
    assert cfg.trainer.added.inner == 1 and type(cfg.trainer.added) is RecordingConfig
    OmegaConf.set_readonly(cfg.trainer, True)
    with pytest.raises(ReadonlyConfigError):
        cfg.trainer.project_name = "q"
    with read_write(cfg.trainer):
        cfg.trainer.project_name = "p"
    assert cfg.trainer.project_name == "p"

    merged = OmegaConf.merge(deep, {"trainer": {"project_name": "m"}})
    assert type(merged) is RecordingConfig and type(merged.trainer) is RecordingConfig
    assert merged.trainer.project_name == "m"
    deep.merge_with({"trainer": {"experiment_name": "x"}})
    assert deep.trainer.experiment_name == "x"
    assert {"trainer.added.inner", "trainer.project_name", "trainer.experiment_name"} <= paths()


def test_logging_the_whole_config_is_not_a_read(recorded):
    # code that tells an OmegaConf container by its class (redact's to_container) must see a recording one too
    from rlhf_core.redact import redact

    _, paths = recorded
    cfg = load_config("sft_trainer")
    assert redact(cfg) == redact(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)))
    assert paths() == set()
