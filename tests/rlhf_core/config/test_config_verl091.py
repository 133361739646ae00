"""Every leaf of verl 0.9.1's composed ppo_trainer and evaluation configs is a key of ours with verl's default.

tests/data/verl091/*.yaml are verl 0.9.1's configs composed with Hydra and stripped of comments and ``_target_``
(tests/data/verl091/compose.py). A verl leaf is found in ours as a declared key or as an ``aliases=`` spelling of
one (a key's or a whole section's). Its default must equal ours, same value and same YAML type, unless the key
declares ``differs=`` with ``verl_default=`` (the reference's default wins, or a CPU/product reason; shown in
docs/CONFIG_KEYS.md): then verl's value must be the declared ``verl_default`` and differ from ours, so the
declaration cannot go stale.

Interpolations are compared by meaning, not spelling: each ``${...}`` is rewritten to the absolute path it reads
(verl's relative ``${.save_contents}`` becomes ``${critic.checkpoint.save_contents}``), and
``${oc.select:path,default}`` becomes ``${path}`` when ``path`` is a key or section of that config (the default is
then never used) or else the default itself (verl's ``${oc.select:actor_rollout_ref.actor.megatron.qat,null}``
in an FSDP config is null). A path verl spells the earlier way (an alias of ours) is read as our key. So verl's
``${oc.select:actor_rollout_ref.rollout.n,1}`` and our ``${actor_rollout_ref.rollout.n}`` are equal, while a
literal default against an interpolation is a difference.
"""

from __future__ import annotations

import functools

import pytest
import yaml
from omegaconf import OmegaConf

from rlhf_core.config.schema import renamed_path, specs
from tests.paths import TEST_DATA

DATA = TEST_DATA / "verl091"


def _leaves(node, prefix: str = "") -> dict:
    """Dotted path -> value of every leaf of a plain dict (an empty dict is a leaf, lists are leaves)."""
    out = {}
    for k, v in node.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_leaves(v, path + "."))
        else:
            out[path] = v
    return out


@functools.lru_cache(maxsize=None)
def _verl(name: str) -> dict:
    return _leaves(OmegaConf.to_container(OmegaConf.load(DATA / f"{name}.yaml"), resolve=False))


def _nodes(paths) -> frozenset:
    """Every leaf path and every section above one."""
    out = set()
    for p in paths:
        parts = p.split(".")
        out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return frozenset(out)


def _absolute(target: str, here: str) -> str:
    """``target`` of an interpolation written at ``here``, relative dots resolved (``.x`` = a sibling of here)."""
    if not target.startswith("."):
        return target
    dots = len(target) - len(target.lstrip("."))
    base = here.split(".")[:-dots]
    return ".".join(base + [target[dots:]])


def _close(text: str, start: int) -> int:
    """Index just past the ``}`` closing the ``${`` at ``start``."""
    depth, j = 1, start + 2
    while depth:
        if text.startswith("${", j):
            depth, j = depth + 1, j + 2
            continue
        depth -= text[j] == "}"
        j += 1
    return j


def _canon(text: str, here: str, nodes: frozenset, name: str) -> str:
    """``text`` with every interpolation rewritten as the module docstring says."""
    out, i = "", 0
    while i < len(text):
        if not text.startswith("${", i):
            out, i = out + text[i], i + 1
            continue
        j = _close(text, i)
        body = text[i + 2: j - 1]
        if body.startswith("oc.select:"):
            arg, depth, cut = body[len("oc.select:"):], 0, None
            for k, c in enumerate(arg):
                depth += (c == "{") - (c == "}")
                if c == "," and depth == 0:
                    cut = k
                    break
            target = _absolute((arg if cut is None else arg[:cut]).strip(), here)
            default = "null" if cut is None else arg[cut + 1:].strip()
            out += ("${" + (renamed_path(target, name) or target) + "}" if target in nodes
                    else _canon(default, here, nodes, name))
        else:
            target = _absolute(body, here)
            out += "${" + (renamed_path(target, name) or target) + "}"
        i = j
    return out


def meaning(value, here: str, nodes: frozenset, name: str):
    """The value a default means (see the module docstring); non-strings are returned as they are."""
    if not isinstance(value, str) or "${" not in value:
        return value
    text = _canon(value, here, nodes, name)
    return text if "${" in text else yaml.safe_load(text)  # an oc.select that fell back to its literal default


def _same(a, b) -> bool:
    return a == b and type(a) is type(b)


def problems(name: str, table: dict | None = None) -> list[str]:
    """One line per verl 0.9.1 leaf of config ``name`` missing from ours or with another default (undeclared)."""
    table = specs(name) if table is None else table
    verl, ours_nodes = _verl(name), _nodes(table)
    verl_nodes = _nodes(verl)
    out = []
    for path, value in verl.items():
        ours_path = path if path in table else renamed_path(path, name)
        if ours_path not in table:
            if value == {} and path in ours_nodes:
                continue  # verl's empty section; ours holds keys below it (the reference's override_config layout)
            out.append(f"{path}: missing (verl 0.9.1 default {value!r})")
            continue
        spec = table[ours_path]
        theirs = meaning(value, path, verl_nodes, name)
        ours = meaning(spec.default, ours_path, ours_nodes, name)
        if ours_path != path:  # verl 0.9.1's spelling of a key of ours (an alias): its default is ours, or ours is a
            if not _same(theirs, ours) and spec.verl is None:  # documented difference (differs=, on our key)
                out.append(f"{path} (read as {ours_path}): ours {ours!r}, verl 0.9.1 {theirs!r}; declare differs=")
            continue
        if spec.verl is not None:
            declared = meaning(spec.verl[0], ours_path, ours_nodes, name)
            if not _same(theirs, declared):
                out.append(f"{path}: verl_default={declared!r} declared, verl 0.9.1 has {theirs!r}")
            elif _same(theirs, ours):
                out.append(f"{path}: declared differs= but ours equals verl's {theirs!r}; drop it")
        elif not _same(theirs, ours):
            out.append(f"{path}: ours {ours!r} ({type(ours).__name__}), verl 0.9.1 {theirs!r} "
                       f"({type(theirs).__name__}); use verl's or declare differs=")
    return out


def test_vendored_files_are_keys_and_defaults_only():
    # 898 leaves in verl's _generated_ppo_trainer.yaml minus its 69 _target_ entries, plus model_engine
    # (a Hydra choice that the generated file leaves out) = 830.
    assert len(_verl("ppo_trainer")) == 830 and len(_verl("evaluation")) == 9
    for name in ("ppo_trainer", "sft_trainer_engine", "evaluation"):
        text = (DATA / f"{name}.yaml").read_text(encoding="utf-8")
        body = text.split("\n", 2)[2] if name == "sft_trainer_engine" else text  # its two-line header (compose.py)
        assert "#" not in body and "_target_" not in body


@pytest.mark.parametrize("name", ["ppo_trainer", "evaluation"])
def test_every_verl091_leaf_is_ours_with_verl_default(name):
    found = problems(name)
    assert not found, f"{len(found)} verl 0.9.1 leaves differ:\n" + "\n".join(found)


def test_a_removed_key_fails():
    table = dict(specs("ppo_trainer"))
    del table["actor_rollout_ref.actor.checkpoint.strict"]
    assert problems("ppo_trainer", table) == [
        "actor_rollout_ref.actor.checkpoint.strict: missing (verl 0.9.1 default True)"]


def test_interpolations_compare_by_meaning():
    nodes = _nodes(_verl("ppo_trainer"))
    # an oc.select whose path exists means that path; a relative path is made absolute
    assert meaning("${oc.select:actor_rollout_ref.rollout.n,1}", "critic.rollout_n", nodes, "ppo_trainer") == \
        "${actor_rollout_ref.rollout.n}"
    assert meaning("${.save_contents}", "critic.checkpoint.load_contents", nodes, "ppo_trainer") == \
        "${critic.checkpoint.save_contents}"
    # a missing path means its default, parsed as YAML (Megatron's qat is absent from the FSDP config)
    assert meaning("${oc.select:actor_rollout_ref.actor.megatron.qat,null}", "x", nodes, "ppo_trainer") is None
    assert meaning("${oc.select:a.b,${oc.select:c.d,False}}", "x", nodes, "ppo_trainer") is False


def test_verl06_spellings_of_moved_keys_are_read_as_the_091_keys():
    import warnings

    from rlhf_core.config import ConfigError, load_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config("ppo_trainer", ["critic.model.fsdp_config.fsdp_size=2",
                                          "actor_rollout_ref.rollout.skip_rollout=true",
                                          "actor_rollout_ref.rollout.update_weights_bucket_megabytes=64"])
    assert (cfg.critic.fsdp.fsdp_size, cfg.skip.rollout.enable,
            cfg.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes) == (2, True, 64)
    notices = [str(w.message) for w in caught if "is read as" in str(w.message)]
    assert len(notices) == 3 and any("read as critic.fsdp.fsdp_size" in n for n in notices)
    with pytest.raises(ConfigError, match="two spellings of one key"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_config("ppo_trainer", ["critic.model.fsdp_config.fsdp_size=2", "critic.fsdp.fsdp_size=4"])


def test_backends_we_do_not_have_are_refused_by_name():
    from rlhf_core.config import ConfigError, load_config

    for override, named in (("actor_rollout_ref.actor.fsdp_config.qat.enable=true", "quantization-aware training"),
                            ("transfer_queue.enable=true", "TransferQueue"),
                            ("+actor_rollout_ref.rollout.engine_kwargs.trtllm.a=1", "TensorRT-LLM"),
                            ("actor_rollout_ref.model.mtp.enable=true", "multi-token prediction")):
        with pytest.raises(ConfigError, match=named):
            load_config("ppo_trainer", [override])


@pytest.mark.parametrize("verl_name,ours", [("ppo_trainer", "ppo_trainer"), ("_generated_ppo_trainer", "ppo_trainer"),
                                            ("evaluation", "evaluation"), ("sft_trainer_engine", "sft_trainer")])
def test_verl091_config_names(verl_name, ours):
    from rlhf_core.config import load_config
    from rlhf_core.config.structured import schema_class

    from omegaconf import OmegaConf

    assert OmegaConf.get_type(load_config(verl_name)) is schema_class(ours)


@pytest.mark.parametrize("verl_name,backend", [("ppo_megatron_trainer", "Megatron"),
                                               ("ppo_torchtitan_trainer", "torchtitan"),
                                               ("ppo_veomni_trainer", "veomni")])
def test_foreign_backend_config_names_are_refused(verl_name, backend, capsys):
    from rlhf_core.config.cli import main as config_main
    from rlhf_core.trainer.commands import ppo_main

    assert config_main(["check", "--config-name", verl_name]) == 1
    assert f"verl's config for its {backend} backend" in capsys.readouterr().err
    assert ppo_main([f"--config-name={verl_name}"]) == 1  # refused before any training starts
    assert f"{backend} backend, which this project does not have" in capsys.readouterr().err


def test_ppo_command_takes_verl_name_and_refuses_another_commands_config(capsys):
    from rlhf_core.trainer.commands import ppo_main

    assert ppo_main.check(["--config-name", "_generated_ppo_trainer", "trainer.total_epochs=1"]) is None
    assert ppo_main(["--config-name", "evaluation"]) == 1
    assert "this command runs ppo_trainer; evaluation belongs to another command" in capsys.readouterr().err


def test_py_executable_reaches_rays_runtime_env(monkeypatch):
    import rlhf_core.distributed.ray_init as ray_init
    from rlhf_core.config import load_config

    cfg = load_config("ppo_trainer", ["ray_kwargs.ray_init.runtime_env.py_executable=uv run"])
    assert cfg.ray_kwargs.ray_init.runtime_env.py_executable == "uv run"
    seen = {}
    monkeypatch.setattr(ray_init.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_init, "start_embedded_ray", lambda num_cpus, **kw: seen.update(kw))
    monkeypatch.setattr(ray_init.shutil, "which", lambda program: f"/usr/bin/{program}")  # as if uv were installed
    monkeypatch.delenv("RLHF_CONFIG_READS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray_init.init_ray(None, 1, cfg.ray_kwargs.ray_init.runtime_env.py_executable)
    assert seen["runtime_env"] == {"py_executable": "uv run"}
    assert ray_init.ray_runtime_env(None, None) is None
