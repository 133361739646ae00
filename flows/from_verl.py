"""``rlhf experiment from-verl SCRIPT.sh [--out FILE]``: a verl launch script -> an experiment file (YAML).

The script is read, never run (:mod:`flows.verl_script`: variables it defines expanded, ``\\`` continuations
joined, comments and ``$@`` dropped). Each verl command feeds one stage: ``main_ppo`` -> ``ppo.overrides``,
``fsdp_sft_trainer``/``sft_trainer`` -> ``sft.overrides``, ``main_eval`` -> ``evaluation.overrides``,
``main_generation`` -> one ``evaluation.suites`` entry. Every ``key=value``, ``+key=value``, ``~key`` is parsed
with Hydra's override grammar (:func:`rlhf_core.config.overrides.parse_override`) and:

* **lifted** into the experiment's own field where the schema has one (:data:`LIFTED`): ``data.train_files`` ->
  ``data.train_files``, ``actor_rollout_ref.model.path`` -> ``model.path``, ``custom_reward_function.*`` ->
  ``reward.*``, ``trainer.total_training_steps`` -> ``ppo.total_steps``, ``trainer.project_name`` -> ``name``...;
* **commented out**, with the reason on the line, when the pipeline sets that key itself (:data:`PIPELINE_SETS`:
  checkpoint folders, ``save_freq``...), when its value still holds a shell reference the script does not define
  (``$HOME``, ``$1``, ``$(pwd)``), or when this project does not know the key (a verl key we do not have). Such
  keys are kept in the file, never dropped, and listed in the header comment and on stdout;
* kept as an active override otherwise.

The header also lists the settings a CPU run must change (GPU counts, a vLLM/SGLang rollout, tensor
parallelism) and, for each stage, whether its active overrides load here (:func:`rlhf_core.config.load_config`:
the first error, and the keys accepted that change nothing here).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlhf_core.config.errors import ConfigError
from rlhf_core.config.overrides import parse_override
from flows.commented_yaml import Commented, emit, plain
from flows.verl_script import OTHER_MODULES, Command, Script, read_script

CONFIG_OF = {"ppo": "ppo_trainer", "sft": "sft_trainer", "evaluation": "evaluation"}
"""Stage -> the shipped config its overrides apply to."""

LIFTED: dict[tuple[str, str], str] = {
    ("ppo", "data.train_files"): "data.train_files", ("ppo", "data.val_files"): "data.val_files",
    ("ppo", "data.train_max_samples"): "data.train_max_samples",
    ("ppo", "data.val_max_samples"): "data.val_max_samples",
    ("ppo", "actor_rollout_ref.model.path"): "model.path", ("ppo", "trainer.project_name"): "name",
    ("ppo", "custom_reward_function.path"): "reward.path", ("ppo", "custom_reward_function.name"): "reward.name",
    ("ppo", "reward.custom_reward_function.path"): "reward.path",  # verl 0.9's spelling
    ("ppo", "reward.custom_reward_function.name"): "reward.name",
    ("ppo", "trainer.total_training_steps"): "ppo.total_steps", ("ppo", "algorithm.adv_estimator"): "ppo.adv_estimator",
    ("sft", "trainer.total_epochs"): "sft.epochs",
    ("sft", "data.train_files"): "sft.train_files", ("sft", "data.val_files"): "sft.val_files",
    ("sft", "model.partial_pretrain"): "model.path", ("sft", "trainer.project_name"): "name",
    ("sft", "model.path"): "model.path",  # verl 0.9's engine SFT trainer
    ("evaluation", "custom_reward_function.path"): "reward.path",
    ("evaluation", "custom_reward_function.name"): "reward.name",
}
"""(stage, verl key) -> the experiment field that holds its value."""

LIST_FIELDS = {"data.train_files", "data.val_files", "sft.train_files", "sft.val_files"}
PATH_FIELDS = LIST_FIELDS | {"model.path", "reward.path", "name"}
"""Fields whose value is kept as written even when it holds an unexpanded reference (the user edits the path)."""

SUITE_KEYS = {"data.path": "files", "data.n_samples": "n", "rollout.temperature": "temperature",
              "rollout.top_p": "top_p", "rollout.response_length": "response_length"}
"""main_generation key -> the field of the evaluation suite it becomes."""

PIPELINE_SETS: dict[str, dict[str, str]] = {
    "ppo": {"trainer.default_local_dir": "the pipeline's checkpoint folder",
            "trainer.validation_data_dir": "the pipeline's samples folder",
            "trainer.save_freq": "a checkpoint ends each segment: ppo.segment_steps",
            "trainer.resume_mode": "segments resume from the last checkpoint",
            "trainer.stop_after_step": "where each segment stops",
            "trainer.experiment_name": "the pipeline names the stage run",
            "trainer.project_name": "the pipeline uses the experiment's name",
            "critic.model.path": "the pipeline starts the critic from the PPO model"},
    "sft": {"trainer.default_local_dir": "the pipeline's checkpoint folder",
            "trainer.project_name": "the pipeline uses the experiment's name",
            "trainer.experiment_name": "the pipeline names the stage run"},
    "evaluation": {"data.path": "the evaluate stage scores the responses it generates",
                   "output.samples_dir": "the pipeline's samples folder"},
}
"""Keys the pipeline sets for each stage (an override of them would break segments or paths): commented out."""

GPU_KEYS = re.compile(r"(^|\.)(n_gpus_per_node|nnodes|tensor_model_parallel_size|ulysses_sequence_parallel_size)$")
GPU_ROLLOUTS = ("vllm", "sglang", "trtllm")
"""Keys (with a value above 1) and rollout engines a CPU run must change."""
_CONFIG_FLAGS = {"--config-path": "path", "-cp": "path", "--config-name": "name", "-cn": "name"}


@dataclass
class Conversion:
    """The experiment (``doc``: plain data, with :class:`Commented` entries) and the report lines."""

    doc: dict[str, Any]
    source: str
    sha256: str
    commands: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    unexpanded: dict[str, list[str]] = field(default_factory=dict)
    gpu: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)

    def report(self) -> list[str]:
        """The header's lines (also printed on stdout), without the ``#``."""
        lines = [f"Converted by `rlhf experiment from-verl` from {self.source} (sha256 {self.sha256[:16]}).",
                 *[f"  {c}" for c in self.commands]]
        sections = [("Keys this project does not know (kept, commented out, in their stage's overrides):",
                     self.unknown),
                    ("Shell references the script does not define, left as written (set these values):",
                     [f"{ref}: {', '.join(dict.fromkeys(keys))}" for ref, keys in self.unexpanded.items()]),
                    ("GPU settings a CPU run must change:", self.gpu),
                    ("Notes:", self.notes), ("Loading each stage's active overrides here:", self.loads)]
        for title, items in sections:
            if items:
                lines += [title, *[f"  - {item}" for item in items]]
        return lines


def _known_keys(stage: str) -> set[str]:
    from rlhf_core.config.structured import schema_paths
    return schema_paths(CONFIG_OF[stage])


def _is_known(key: str, known: set[str], stage: str) -> bool:
    """A key of the stage's config, a sub-key of a free-form dict, or another of verl's spellings of a key
    (declared ``aliases``: verl 0.9's ``reward.custom_reward_function.path``), which the loader reads as the key, or
    a key of a distillation teacher added by name (``distillation.teacher_models.<name>.x``: ``teacher_model``'s x)."""
    from rlhf_core.config.distillation import template_path
    from rlhf_core.config.schema import is_open, renamed_path
    key = renamed_path(key, CONFIG_OF[stage]) or key
    key = template_path(key) or key
    return key in known or is_open(key) or any(k.startswith(key + ".") or key.startswith(k + ".") for k in known)


def _value(word: str, refs: list[str]) -> Any:
    """The override's value by Hydra's grammar; with an unexpanded reference Hydra cannot parse (``$(pwd)/m``),
    the text after ``=`` as written."""
    try:
        return parse_override(word).value
    except ConfigError:
        if refs:
            return word.split("=", 1)[1]
        raise


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    node = doc
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def _get(doc: dict[str, Any], dotted: str) -> Any:
    node: Any = doc
    for p in dotted.split("."):
        node = node.get(p) if isinstance(node, dict) else None
    return node


class _Converter:
    """Turns the stage commands of one script into the experiment's fields and overrides."""

    def __init__(self, script: Script, conv: Conversion):
        self.conv, self.doc = conv, conv.doc
        self.has_sft = any(c.stage == "sft" for c in script.commands)

    def stage_overrides(self, cmd: Command) -> list[Any]:
        """The command's overrides as the stage's ``overrides`` entries; lifts fields, fills the report."""
        known = _known_keys(cmd.stage)
        words = self._launcher_keys(cmd) + self._args(cmd)
        actor = next((w.split("=", 1)[1] for w in words if w.startswith("actor_rollout_ref.model.path=")), None)
        out: list[Any] = []
        for word in words:
            refs = cmd.unexpanded.get(word, [])
            key, _, value = re.sub(r"^(\+\+|\+|~)", "", word).partition("=")
            for ref in refs:
                self.conv.unexpanded.setdefault(ref, []).append(f"{cmd.stage} {key}")
            if GPU_KEYS.search(key) and value not in ("1", "0", "") or \
                    key.endswith("rollout.name") and value in GPU_ROLLOUTS:
                self.conv.gpu.append(f"{cmd.stage}: {word}")
            lifted = LIFTED.get((cmd.stage, key))
            if lifted and word.startswith(key + "="):
                if self._lift(lifted, word, refs, cmd):
                    continue
            pipeline = dict(PIPELINE_SETS[cmd.stage])
            if cmd.stage == "ppo" and self.has_sft:
                pipeline["actor_rollout_ref.model.path"] = "the pipeline's PPO starts from the SFT stage's model"
            if key == "critic.model.path" and value != actor:
                pipeline.pop(key)  # a critic model of its own: the user's choice, kept
            if key in pipeline:
                out.append(Commented(word, f"set by the pipeline: {pipeline[key]}"))
            elif not _is_known(key, known, cmd.stage):
                from rlhf_core.config.schema import nearest_key
                near = nearest_key(key, known)
                self.conv.unknown.append(f"{cmd.stage}: {key} (line {cmd.line})"
                                         + (f"; did you mean {near}?" if near else ""))
                out.append(Commented(word, f"unknown key: not in rlhf_core/configs/{CONFIG_OF[cmd.stage]}.yaml"))
            elif refs:
                out.append(Commented(word, f"unexpanded {', '.join(refs)}"))
            else:
                out.append(word)
        return out

    def _launcher_keys(self, cmd: Command) -> list[str]:
        """torchrun's ``--nproc_per_node``/``--nnodes`` as the SFT trainer's ``trainer.*`` keys."""
        out = []
        for w in cmd.launcher if cmd.stage == "sft" else []:
            m = re.fullmatch(r"--(nproc[_-]per[_-]node|nnodes)=(.*)", w)
            if m:
                out.append(f"trainer.{'nnodes' if m.group(1) == 'nnodes' else 'n_gpus_per_node'}={m.group(2)}")
                cmd.unexpanded[out[-1]] = cmd.unexpanded.get(w, [])
        return out

    def _args(self, cmd: Command) -> list[str]:
        """The command's overrides; ``--config-path/--config-name`` become the stage's ``config``."""
        args, flags = [], {}
        words = iter(cmd.args)
        for w in words:
            flag, eq, value = w.partition("=")
            if flag in _CONFIG_FLAGS:
                flags[_CONFIG_FLAGS[flag]] = value if eq else next(words, "")
            elif w.startswith("-"):
                self.conv.notes.append(f"line {cmd.line}: {w} ignored (a Hydra flag, not an override)")
            elif flag.lstrip("+~").startswith("hydra."):
                self.conv.notes.append(f"line {cmd.line}: {w} ignored (Hydra's own setting)")
            else:
                args.append(w)
        if "name" in flags:
            path = f"{flags.get('path', '.')}/{flags['name'].removesuffix('.yaml')}.yaml"
            refs = list(dict.fromkeys(r for w in cmd.args for r in cmd.unexpanded.get(w, []) if r in path))
            for ref in refs:
                self.conv.unexpanded.setdefault(ref, []).append(f"{cmd.stage} --config-path")
            if refs or "path" not in flags:
                why = f"unexpanded {', '.join(refs)}" if refs else "a config of verl's own (no --config-path)"
                _set(self.doc, f"{cmd.stage}.config", Commented(f"config: {path}", why))
                self.conv.notes.append(f"{cmd.stage}.config not set from --config-name={flags['name']}: {why}")
            else:
                _set(self.doc, f"{cmd.stage}.config", path)
        return args

    def _lift(self, dotted: str, word: str, refs: list[str], cmd: Command) -> bool:
        """Put ``word``'s value in the experiment field ``dotted``; False when it stays an override."""
        if refs and dotted not in PATH_FIELDS or dotted == "model.path" and cmd.stage == "ppo" and self.has_sft:
            return False
        value = _value(word, refs)
        if dotted in LIST_FIELDS and not isinstance(value, list):
            value = [value]
        if dotted in ("ppo.total_steps", "sft.epochs") and not isinstance(value, int):
            return False
        have = _get(self.doc, dotted)
        if have is not None and have != value:
            self.conv.notes.append(f"{cmd.stage}: {word} kept as an override: {dotted} is already {have!r}")
            return False
        _set(self.doc, dotted, value)
        return True


def _suite(cmd: Command, conv: Conversion, doc: dict[str, Any]) -> dict[str, Any]:
    """A main_generation command as one evaluation suite (``name`` from its data file's stem)."""
    suite: dict[str, Any] = {}
    for word in cmd.args:
        key = word.lstrip("+~").split("=", 1)[0]
        for ref in cmd.unexpanded.get(word, []):
            conv.unexpanded.setdefault(ref, []).append(f"generation {key}")
        if "=" in word and GPU_KEYS.search(key) and word.split("=", 1)[1] not in ("1", "0"):
            conv.gpu.append(f"generation: {word}")
        value = _value(word, cmd.unexpanded.get(word, [])) if "=" in word else None
        if key in SUITE_KEYS and (key == "data.path" or not cmd.unexpanded.get(word)):
            suite[SUITE_KEYS[key]] = value if key != "data.path" or isinstance(value, list) else [value]
        elif key == "model.path" and _get(doc, "model.path") is None:
            _set(doc, "model.path", value)
        else:
            conv.notes.append(f"generation (line {cmd.line}): {word} not carried (no evaluation-suite field)")
    first = (suite.get("files") or ["generation"])[0]
    return {"name": Path(str(first)).stem or "generation", **suite}


def convert(text: str, source: str, preset: dict[str, str] | None = None) -> Conversion:
    """The experiment for the launch script ``text`` (``source`` names it in the header and in errors);
    ``preset``: variables the caller's environment sets (``--set DEVICE=gpu``), which also decide ``if``/``case``.

    Raises:
        ConfigError: no verl command in the script, two commands for the same stage (one experiment has one
            PPO, one SFT, one evaluation stage), or an override Hydra's grammar cannot parse (naming the line).
    """
    script = read_script(text, source, preset)
    if not script.commands:
        raise ConfigError(f"{source}: no verl command found (python3 -m verl.trainer.main_ppo | sft_trainer "
                          f"| fsdp_sft_trainer | main_eval | main_generation, or {' | '.join(OTHER_MODULES)})")
    conv = Conversion({}, source, hashlib.sha256(text.encode()).hexdigest())
    conv.notes += [f"--set {name}={value}" for name, value in (preset or {}).items()]
    doc = conv.doc
    doc["name"] = None
    doc["description"] = f"converted from the verl launch script {Path(source).name}"
    converter = _Converter(script, conv)
    seen: dict[str, int] = {}
    for cmd in sorted(script.commands, key=lambda c: ["ppo", "sft", "evaluation", "generation"].index(c.stage)):
        module = cmd.module if cmd.module in OTHER_MODULES else f"verl.trainer.{cmd.module}"
        conv.commands.append(f"line {cmd.line}: {module} -> "
                             f"{'evaluation.suites' if cmd.stage == 'generation' else cmd.stage}")
        if cmd.stage != "generation" and cmd.stage in seen:
            raise ConfigError(f"{source}: two {cmd.module} commands (lines {seen[cmd.stage]} and {cmd.line}): one "
                              f"experiment has one {cmd.stage} stage; convert each part separately")
        seen[cmd.stage] = cmd.line
        try:
            if cmd.stage == "generation":
                doc.setdefault("evaluation", {}).setdefault("suites", []).append(_suite(cmd, conv, doc))
            else:
                _set(doc, f"{cmd.stage}.overrides", converter.stage_overrides(cmd))
        except ConfigError as exc:
            raise ConfigError(f"{source}, line {cmd.line}: {exc}") from None
    _finish(doc, conv, script, source)
    return conv


def _finish(doc: dict[str, Any], conv: Conversion, script: Script, source: str) -> None:
    """Defaults the script implies (name, sft.enabled), notes, and each stage's load check."""
    stages = {c.stage for c in script.commands}
    if doc["name"] is None:
        doc["name"] = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(source).stem)
    doc.setdefault("sft", {})["enabled"] = "sft" in stages
    doc["sft"] = {"enabled": doc["sft"].pop("enabled"), **doc["sft"]}
    if "ppo" not in stages:
        conv.notes.append("no main_ppo command: the pipeline runs PPO with the shipped ppo_trainer defaults")
    if "ppo" in stages and _get(doc, "ppo.total_steps") is None:
        conv.notes.append("the script sets no trainer.total_training_steps: ppo.total_steps keeps its default "
                          "(the pipeline counts steps, not trainer.total_epochs)")
    if not _get(doc, "data.train_files"):
        conv.notes.append("no RL training data (data.train_files): set it, or data.generator")
    if _get(doc, "reward.path"):
        conv.notes.append("reward.path is read relative to this file's folder")
    conv.notes += script.branches + script.assignments
    conv.notes += [f"${name} used its default {value!r} (${{{name}:-...}})" for name, value in
                   script.defaults_used.items()]
    conv.notes += [f"not converted: {s}" for s in script.skipped]
    order = ["name", "description", "model", "data", "sft", "ppo", "reward", "evaluation"]
    for key in sorted(doc, key=order.index):
        doc[key] = doc.pop(key)
    from flows.from_verl_check import load_check, run_lists

    lists, why_not = run_lists(plain(doc), stages)
    for stage in ("sft", "ppo", "evaluation"):
        if stage in stages:
            active = [o for o in doc[stage]["overrides"] if isinstance(o, str)]
            check = load_check(CONFIG_OF[stage], lists.get(stage, active))
            conv.loads.append(f"{stage}: {check}" + (f" (its overrides alone: {why_not})" if why_not else ""))


def render(conv: Conversion) -> str:
    """The experiment file's text: the report as a header comment, then the YAML (checked to load back equal)."""
    header = [f"# {line}".rstrip() for line in conv.report()]
    text = "\n".join(header + [""] + emit(conv.doc)) + "\n"
    if yaml.safe_load(text) != plain(conv.doc):  # pragma: no cover - a bug in emit
        raise AssertionError("from-verl: the YAML written does not load back as the experiment built")
    return text


def main(argv: list[str]) -> int:
    """``rlhf experiment from-verl SCRIPT.sh [--out FILE] [--force]``: write (or print) the experiment file;
    the report goes to stdout (stderr when the YAML itself goes to stdout). Exit 0, or 1 with one line for an
    input error (a missing script, nothing to convert, an existing ``--out`` without ``--force``)."""
    parser = argparse.ArgumentParser(prog="rlhf experiment", description="experiment files")
    sub = parser.add_subparsers(dest="action", required=True)
    conv_p = sub.add_parser(
        "from-verl", help="convert a verl launch script (bash) to an experiment file",
        description="Convert a verl launch script (python3 -m verl.trainer.main_ppo ..., torchrun ... -m "
                    "verl.trainer.fsdp_sft_trainer ..., main_eval, main_generation) into an experiment file. The "
                    "script is read, never run: variables it defines are expanded, others are left as written.",
        epilog="Keys set by the pipeline, keys this project does not know and values with unexpanded variables are "
               "kept as commented-out lines with their reason, and listed in the file's header and on stdout.\n"
               "then: rlhf pipeline --experiment FILE --dry-run",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    conv_p.add_argument("script", help="the verl launch script (read, never run)")
    conv_p.add_argument("--out", metavar="FILE", help="experiment file to write (default: print it on stdout)")
    conv_p.add_argument("--force", action="store_true", help="replace --out when it exists")
    conv_p.add_argument("--set", metavar="NAME=VALUE", action="append", default=[], dest="preset",
                        help="a variable the script takes from its caller's environment (DEVICE=gpu, "
                             "INFER_BACKEND=vllm): used for ${NAME:-...} and to follow if/case branches; repeatable")
    args = parser.parse_args(argv)
    path = Path(args.script)
    if not path.is_file():
        raise FileNotFoundError(f"no launch script {str(path)!r}")
    bad = [item for item in args.preset if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", item, re.S)]
    if bad:
        raise ConfigError(f"--set {bad[0]!r}: expected NAME=VALUE (a shell variable name)")
    preset = dict(item.split("=", 1) for item in args.preset)
    out = Path(args.out) if args.out is not None else None
    if out is not None and out.exists() and not args.force:  # before the conversion (it loads every stage config)
        raise ConfigError(f"--out {out} exists: pass --force to replace it (it is not changed)")
    conv = convert(path.read_text(encoding="utf-8"), str(path), preset)
    text = render(conv)
    if out is None:
        print(text, end="")
        return 0
    from rlhf_core.atomic import atomic_write_text
    os.makedirs(out.parent if str(out.parent) else ".", exist_ok=True)
    atomic_write_text(out, text)
    print("\n".join(conv.report()))
    print(f"wrote {out}")
    return 0


__all__ = ["Commented", "Conversion", "convert", "main", "render"]
