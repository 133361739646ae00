"""The experiment file: one YAML file describes one experiment (model, data, the three stage configs, reward,
evaluation suites, Ray address, schedule, regression gate, task options). It is what a team keeps in git.

The schema is the frozen dataclasses below; every field's default lives here (nowhere else), with its type and a
help string (``metadata["help"]``). :func:`load_experiment` reads a file (or its text), refuses unknown fields with
a did-you-mean naming the file and the dotted field, checks every value's type, resolves relative paths against the
file's folder (URLs such as ``s3://``, ``hdfs://``, ``gs://``, ``memory://``, ``file://`` are kept as they are)
and records the text's sha256, so a deployment can carry the exact content it was made from.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rlhf_core.config import ConfigError
from rlhf_core.config.yaml_file import parse_yaml_text

REPO_ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS_DIR = REPO_ROOT / "experiments"
DEFAULT_EXPERIMENT = EXPERIMENTS_DIR / "gsm8k_tiny.yaml"
PRESET_ALIASES = {"tiny_cpu": "gsm8k_tiny", "tiny_cpu_tools": "gsm8k_tools"}  # the presets before issue 33


class ExperimentError(ConfigError):
    """An experiment file that cannot be used: one line naming the file and the dotted field (a ConfigError, so an
    input error: shown without a traceback and never retried)."""


def _f(default: Any = None, help: str = "", *, path: bool = False, factory: Any = None) -> Any:  # noqa: A002
    meta = {"help": help, "path": path}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelSpec:
    """The model to start from."""

    path: str | None = _f(None, "a Hugging Face causal-LM folder or any fsspec URL (copied once into "
                                "$RLHF_HOME/cache); null = build the tiny model from the training text", path=True)
    tiny: dict[str, Any] = _f(help="rlhf_core.models.tiny.build_tiny_model sizes (vocab_size, hidden_size, "
                                   "intermediate_size, num_layers, num_attention_heads, num_key_value_heads), "
                                   "used when path is null", factory=dict)


@dataclass(frozen=True)
class DataSpec:
    """The RL prompts: verl-schema parquet files, or a built-in generator."""

    generator: str | None = _f(None, "a built-in generator (rlhf_core.data.generators: gsm8k, gsm8k_tools, "
                                     "countdown) or null to read train_files/val_files")
    generator_args: dict[str, Any] = _f(help="the generator's keyword arguments (gsm8k: source_dir, null = "
                                             "$GSM8K_DIR, else the hub; countdown: min_numbers, max_numbers, "
                                             "max_number)", factory=dict)
    train_files: list[str] = _f(help="verl-schema RL parquet files (prompt, data_source, "
                                     "reward_model.ground_truth, ...): paths or any fsspec URL", path=True,
                                factory=list)
    val_files: list[str] = _f(help="validation parquet files, same schema", path=True, factory=list)
    train_max_samples: int = _f(-1, "the first N training rows are kept (-1 = all; for a generator, <=0 = its "
                                    "default size); the flow's train_prompts parameter overrides it")
    val_max_samples: int = _f(-1, "the first N validation rows (-1 = all); the val_prompts parameter overrides it")


@dataclass(frozen=True)
class SftSpec:
    """The SFT stage (sft_trainer)."""

    enabled: bool = _f(True, "run the sft stage (false: PPO starts from the model as it is)")
    epochs: int = _f(1, "trainer.total_epochs of the sft stage; the sft_epochs parameter overrides it")
    train_files: list[str] = _f(help="verl SFT parquet (prompt/response keys or a messages column); [] = the RL "
                                     "training data", path=True, factory=list)
    val_files: list[str] = _f(help="SFT validation parquet; [] = the RL validation data", path=True, factory=list)
    config: str | None = _f(None, "a user sft_trainer YAML merged over the shipped one (verl's "
                                  "--config-path/--config-name)", path=True)
    overrides: list[str] = _f(help="sft_trainer overrides (verl dotted keys: key=value)", factory=list)


@dataclass(frozen=True)
class PpoSpec:
    """The PPO stage (ppo_trainer), run as ppo_segment tasks that each end at a checkpoint."""

    total_steps: int = _f(20, "trainer.total_training_steps; the ppo_steps parameter overrides it")
    segment_steps: int = _f(10, "a checkpoint boundary (and one ppo_segment task) every N steps")
    adv_estimator: str = _f("grpo", "algorithm.adv_estimator: gae | grpo | rloo | reinforce_plus_plus | ...")
    config: str | None = _f(None, "a user ppo_trainer YAML merged over the shipped one", path=True)
    overrides: list[str] = _f(help="ppo_trainer overrides (verl dotted keys: key=value)", factory=list)


@dataclass(frozen=True)
class RewardSpec:
    """The reward function (verl's custom_reward_function)."""

    path: str | None = _f(None, "custom_reward_function.path: a .py file (relative to the experiment file); "
                                "null = the built-in scorers by data_source", path=True)
    name: str = _f("compute_score", "custom_reward_function.name: the function in that file")


@dataclass(frozen=True)
class Suite:
    """One evaluation suite: a named parquet set and its sampling settings."""

    name: str = _f("", "the suite's name (metrics are <name>/<data_source>/...)")
    files: list[str] = _f(help="verl-schema parquet files of the suite", path=True, factory=list)
    n: int = _f(1, "responses per prompt (pass@k over them)")
    temperature: float = _f(0.0, "sampling temperature (0 = greedy)")
    top_p: float = _f(1.0, "nucleus sampling")
    response_length: int | None = _f(None, "max new tokens; null = the ppo config's data.max_response_length")


@dataclass(frozen=True)
class EvaluationSpec:
    """The evaluate stage: generate with the final model on every suite, then score (evaluation.yaml)."""

    enabled: bool = _f(True, "run the evaluate stage; the skip_evaluate parameter overrides it")
    config: str | None = _f(None, "a user evaluation YAML merged over the shipped one", path=True)
    overrides: list[str] = _f(help="evaluation overrides (verl dotted keys: key=value)", factory=list)
    suites: list[Suite] = _f(help="[] = one suite 'val' over data.val_files with the ppo config's val_kwargs",
                             factory=list)


@dataclass(frozen=True)
class Schedule:
    """When the deployment runs (Prefect cron schedule)."""

    cron: str = _f("0 2 * * *", "a cron expression")
    timezone: str = _f("UTC", "the cron's time zone")
    active: bool = _f(True, "whether the schedule is on")


@dataclass(frozen=True)
class RegressionGate:
    """After evaluation, compare with a baseline run (flows/report.py)."""

    baseline: str | None = _f(None, "previous-successful | a flow-run / MLflow run id | null = no gate")
    max_regression: float = _f(0.02, "fail when a data source's whole 95% interval lies below -this")


@dataclass(frozen=True)
class TaskOptions:
    """Prefect options of one stage (input errors and a full or read-only disk are never retried:
    tasks.retry.is_retriable)."""

    retries: int = _f(1, "attempts after the first")
    retry_delay_seconds: float = _f(30, "seconds between attempts")
    timeout_seconds: float | None = _f(None, "the stage's wall-clock limit, enforced where its work runs "
                                             "(tasks.deadline); null = none")


def _task(retries: int, delay: float, timeout: float) -> Any:
    return field(default_factory=lambda: TaskOptions(retries, delay, timeout),
                 metadata={"help": f"default: {retries} retries, {delay:g} s apart, {timeout:g} s limit",
                           "path": False})


@dataclass(frozen=True)
class TasksSpec:
    """Prefect options per stage."""

    prepare_data: TaskOptions = _task(2, 10, 3600)
    build_model: TaskOptions = _task(1, 10, 3600)
    filter_prompts: TaskOptions = _task(2, 10, 3600)
    sft: TaskOptions = _task(1, 30, 21600)
    ppo_segment: TaskOptions = _task(2, 30, 43200)
    validate: TaskOptions = _task(1, 30, 7200)
    evaluate: TaskOptions = _task(1, 30, 7200)
    register_model: TaskOptions = _task(1, 30, 3600)

    def as_dict(self) -> dict[str, dict[str, float]]:
        """``{stage: {retries, retry_delay_seconds, timeout_seconds}}`` (timeout left out when null)."""
        return {name: {k: v for k, v in dataclasses.asdict(getattr(self, name)).items() if v is not None}
                for name in (f.name for f in dataclasses.fields(self))}


@dataclass(frozen=True)
class Experiment:
    """One experiment (the top level of the file)."""

    name: str = _f("", "required: the MLflow experiment, trainer.project_name and the deployment rlhf/<name>")
    description: str = _f("", "free text (the deployment's description)")
    model: ModelSpec = _f(help="the model", factory=ModelSpec)
    data: DataSpec = _f(help="the RL prompts", factory=DataSpec)
    sft: SftSpec = _f(help="the sft stage", factory=SftSpec)
    ppo: PpoSpec = _f(help="the ppo stage", factory=PpoSpec)
    reward: RewardSpec = _f(help="the reward function", factory=RewardSpec)
    evaluation: EvaluationSpec = _f(help="the evaluate stage", factory=EvaluationSpec)
    ray_address: str | None = _f(None, "null = embedded local Ray; auto or ray://host:port = an existing cluster")
    schedule: Schedule | None = _f(None, "{cron, timezone, active} for rlhf deploy; null = no schedule")
    work_pool: str = _f("rlhf-pool", "the Prefect work pool of the deployment")
    regression_gate: RegressionGate = _f(help="the regression gate", factory=RegressionGate)
    tasks: TasksSpec = _f(help="Prefect options per stage", factory=TasksSpec)
    # where it came from (set by load_experiment; not fields of the file)
    source: str = field(default="", metadata={"internal": True})
    base_dir: str = field(default="", metadata={"internal": True})
    sha256: str = field(default="", metadata={"internal": True})
    text: str = field(default="", metadata={"internal": True}, repr=False)


def is_url(value: str) -> bool:
    """True for ``scheme://...`` (left as it is by path resolution)."""
    return "://" in value


def _resolve(value: str, base_dir: Path) -> str:
    if is_url(value):
        return value
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base_dir / p).resolve())


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
                "dict": "a mapping", "list": "a list"}.get(tp.__name__, f"a mapping ({tp.__name__})")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return "a mapping"
    return str(tp)


class _Reader:
    """Builds the dataclasses from the parsed YAML, naming ``source`` and the dotted field in every error."""

    def __init__(self, source: str, base_dir: Path):
        self.source, self.base_dir = source, base_dir

    def fail(self, where: str, message: str) -> ExperimentError:
        return ExperimentError(f"{self.source}: {where}: {message}")

    def build(self, cls: type, raw: Any, where: str, base: Any = None) -> Any:
        """``cls`` from the mapping ``raw``; fields ``raw`` leaves out keep ``base``'s values (the enclosing
        field's default, e.g. a stage's own task options), else ``cls``'s defaults."""
        if not isinstance(raw, Mapping):
            raise self.fail(where or "(top level)", f"must be a mapping of fields, got {type(raw).__name__} {raw!r}")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
        values = {}
        for key, value in raw.items():
            dotted = f"{where}.{key}" if where else str(key)
            if key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise self.fail(dotted, f"unknown field{hint} (known: {', '.join(fields)})")
            f = fields[key]
            if dataclasses.is_dataclass(hints[key]) and f.default_factory is not dataclasses.MISSING:
                values[key] = self.build(hints[key], {} if value is None else value, dotted,
                                         base=f.default_factory())
            else:
                values[key] = self.value(hints[key], value, dotted, bool(f.metadata.get("path")))
        return dataclasses.replace(base, **values) if base is not None else cls(**values)

    def value(self, tp: Any, value: Any, where: str, path: bool) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            if value is None and type(None) in args:
                return None
            inner = [a for a in args if a is not type(None)]
            return self.value(inner[0], value, where, path)
        if dataclasses.is_dataclass(tp):
            return self.build(tp, {} if value is None else value, where)
        if origin is list:
            if not isinstance(value, list):
                raise self.fail(where, f"must be {_type_name(tp)}, got {type(value).__name__} {value!r}")
            return [self.value(args[0], v, f"{where}[{i}]", path) for i, v in enumerate(value)]
        if origin is dict or tp is dict:
            if not isinstance(value, Mapping):
                raise self.fail(where, f"must be a mapping, got {type(value).__name__} {value!r}")
            out = dict(value)
            for k, v in out.items():  # generator_args.source_dir and the like: paths relative to the file
                if isinstance(v, str) and str(k).endswith(("_dir", "_path", "_file")):
                    out[k] = _resolve(v, self.base_dir)
            return out
        ok = (isinstance(value, tp) and not (tp is int and isinstance(value, bool))) or (
            tp is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            raise self.fail(where, f"must be {_type_name(tp)}, got {type(value).__name__} {value!r}")
        if tp is float:
            value = float(value)
        return _resolve(value, self.base_dir) if path and tp is str else value


def load_experiment(path_or_text: str | os.PathLike, base_dir: str | os.PathLike | None = None) -> Experiment:
    """Read an experiment file (a path) or its YAML text.

    ``path_or_text`` is read as a file when it is a ``Path``, names an existing file, or is one line ending in
    ``.yaml``/``.yml``; otherwise it is the YAML text itself. Relative paths inside are resolved against
    ``base_dir`` (default: the file's folder, or the current folder for text).

    Returns:
        The :class:`Experiment`, with ``source`` (the file, or ``<experiment text>``), ``base_dir``, ``sha256``
        (hex digest of the UTF-8 text) and ``text`` set.

    Raises:
        FileNotFoundError: a path that does not exist.
        ExperimentError: (a ConfigError) one line naming the file and the dotted field: not valid YAML, a key given
            twice, an unknown field (with a did-you-mean), a value of the wrong type, no ``name``, a step count below
            1, an unknown generator, data given both ways or not at all, a suite without a name or files.
    """
    text_given = not isinstance(path_or_text, os.PathLike) and (
        "\n" in str(path_or_text) or not (os.path.isfile(str(path_or_text))
                                          or str(path_or_text).endswith((".yaml", ".yml"))))
    if text_given:
        text, source = str(path_or_text), "<experiment text>"
        folder = Path(base_dir or Path.cwd())
    else:
        file = Path(path_or_text).expanduser()
        if not file.is_file():
            raise FileNotFoundError(f"experiment file {file}: no such file")
        text, source = file.read_text(encoding="utf-8"), str(file)
        folder = Path(base_dir) if base_dir else file.resolve().parent
    try:
        raw = parse_yaml_text(text, source)  # a key given twice is refused, not silently the last one
    except ConfigError as exc:
        raise ExperimentError(str(exc)) from None
    reader = _Reader(source, folder.expanduser().resolve())
    exp = reader.build(Experiment, {} if raw is None else raw, "")
    exp = dataclasses.replace(exp, source=source, base_dir=str(reader.base_dir), text=text,
                              sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())
    _check(exp, reader)
    return exp


def _check(exp: Experiment, reader: _Reader) -> None:
    """The rules between fields (ExperimentError naming the field)."""
    from rlhf_core.data.generators import GENERATORS

    if not exp.name.strip():
        raise reader.fail("name", "required (the MLflow experiment and the deployment's name)")
    for key in ("total_steps", "segment_steps"):
        if getattr(exp.ppo, key) < 1:
            raise reader.fail(f"ppo.{key}", f"must be >= 1, got {getattr(exp.ppo, key)}")
    if exp.regression_gate.max_regression < 0:
        raise reader.fail("regression_gate.max_regression", f"must be >= 0, got {exp.regression_gate.max_regression}")
    d = exp.data
    if d.generator is not None:
        if d.generator not in GENERATORS:
            close = difflib.get_close_matches(d.generator, list(GENERATORS), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise reader.fail("data.generator", f"unknown generator {d.generator!r}{hint} (known: {list(GENERATORS)})")
        if d.train_files or d.val_files:
            raise reader.fail("data.generator", "set either a generator or train_files/val_files, not both")
        try:
            GENERATORS[d.generator].check_args(d.generator_args)
        except ValueError as exc:
            raise reader.fail("data.generator_args", str(exc)) from None
    elif not d.train_files or not d.val_files:
        missing = "data.train_files" if not d.train_files else "data.val_files"
        raise reader.fail(missing, "no files (give verl-schema parquet files, or a data.generator)")
    names = [s.name for s in exp.evaluation.suites]
    for i, suite in enumerate(exp.evaluation.suites):
        if not suite.name:
            raise reader.fail(f"evaluation.suites[{i}].name", "required")
        if not suite.files:
            raise reader.fail(f"evaluation.suites[{i}].files", f"suite {suite.name!r} has no files")
        if names.count(suite.name) > 1:
            raise reader.fail(f"evaluation.suites[{i}].name", f"suite {suite.name!r} is named twice")
    if exp.reward.path is not None and not is_url(exp.reward.path) and not exp.reward.path.endswith(".py"):
        raise reader.fail("reward.path", f"must be a .py file, got {exp.reward.path!r}")


def demo_experiment(preset: str | None) -> Path:
    """The demo experiment file of ``preset`` (``experiments/<preset>.yaml``, ``tiny_cpu`` -> gsm8k_tiny,
    ``tiny_cpu_tools`` -> gsm8k_tools), or the default ``experiments/gsm8k_tiny.yaml`` for ``None`` or ``""``.

    The demos are files of the repository checkout, found beside ``flows/``; an installed wheel ships the code and
    ``rlhf_core/configs/`` but not them (an experiment is a file a team copies and keeps in git, and
    ``gsm8k_tools.yaml`` names its tool config relative to the checkout).

    Raises:
        ExperimentError: no ``experiments/`` folder (an installed wheel: the message says to pass an experiment
            file), or an unknown preset (listing the shipped experiments).
    """
    file = EXPERIMENTS_DIR / f"{PRESET_ALIASES.get(preset, preset)}.yaml" if preset else DEFAULT_EXPERIMENT
    what = f"preset {preset!r}" if preset else "the default experiment"
    if not EXPERIMENTS_DIR.is_dir():
        raise ExperimentError(f"{what}: no demo experiments at {EXPERIMENTS_DIR} (an installed package does not ship "
                              "them; they are experiments/*.yaml of the repository): pass --experiment FILE.yaml")
    if not file.is_file():
        known = sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml"))
        raise ExperimentError(f"{what}: no experiment file {file}; known: {known + list(PRESET_ALIASES)}")
    return file


def experiment_for_flow(experiment_file: str | None = None, experiment_content: str | None = None,
                        experiment_sha256: str | None = None, experiment_base_dir: str | None = None,
                        preset: str | None = None) -> Experiment:
    """The experiment a flow run uses: ``experiment_content`` (the YAML text, which wins) or ``experiment_file``;
    else ``preset`` as ``experiments/<preset>.yaml`` (``tiny_cpu`` -> gsm8k_tiny, ``tiny_cpu_tools`` ->
    gsm8k_tools); else ``experiments/gsm8k_tiny.yaml``.

    Raises:
        ExperimentError: ``experiment_sha256`` given and not the content's digest (names both), or an unknown
            preset (listing the shipped experiments); and :func:`load_experiment`'s errors.
    """
    if experiment_content is not None:
        exp = load_experiment(experiment_content if "\n" in experiment_content else experiment_content + "\n",
                              base_dir=experiment_base_dir)
        if experiment_file:
            exp = dataclasses.replace(exp, source=experiment_file)
    elif experiment_file:
        exp = load_experiment(Path(experiment_file), base_dir=experiment_base_dir)
    else:
        exp = load_experiment(demo_experiment(preset), base_dir=experiment_base_dir)
    if experiment_sha256 is not None and experiment_sha256 != exp.sha256:
        raise ExperimentError(f"{exp.source}: content sha256 {exp.sha256} is not the expected experiment_sha256 "
                              f"{experiment_sha256} (the file changed since it was deployed)")
    return exp


def field_help(cls: type = Experiment, prefix: str = "") -> list[tuple[str, str, str]]:
    """``[(dotted field, default, help)]`` over the whole schema (for documentation and ``--help`` texts)."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        name = prefix + f.name
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(hints[f.name]):
            out.append((name, "", f.metadata.get("help", "")))
            out.extend(field_help(hints[f.name], name + "."))
        else:
            out.append((name, repr(default), f.metadata.get("help", "")))
    return out
