"""Resolve the ``rlhf`` flow's parameters against ``configs/pipeline.yaml`` and a preset."""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any, Mapping

from infra.home import remembered
from rlhf_core.config.yaml_file import read_yaml_mapping
from rlhf_core.redact import redact
from tasks import plan

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """Every value the flow uses, after defaults are applied."""

    experiment: str
    preset: str | None
    task: str
    model_path: str | None
    gsm8k_dir: str | None
    ray_address: str | None
    train_prompts: int
    val_prompts: int
    sft_enabled: bool
    sft_epochs: int
    ppo_steps: int
    segment_steps: int
    adv_estimator: str
    evaluate_enabled: bool
    model_sizes: dict[str, int]
    countdown: dict[str, int]          # generate_countdown arguments (a preset's ``countdown:``), {} = its defaults
    preset_sft: list[str]
    preset_ppo: list[str]
    preset_eval: list[str]
    sft_overrides: list[str]
    ppo_overrides: list[str]
    eval_overrides: list[str]
    task_options: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    baseline: str | None = None        # regression gate: previous-successful | a run id | None (off)
    max_regression: float = 0.0        # absolute drop of a data source's mean score tolerated

    def as_params(self) -> dict[str, Any]:
        """The settings as a dict (for the parent MLflow run's params)."""
        return dataclasses.asdict(self)

    def sft_list(self) -> list[str]:
        """The sft task's overrides: preset, then ``trainer.total_epochs``, then the user's."""
        return plan.merge_overrides(self.preset_sft, [f"trainer.total_epochs={self.sft_epochs}"],
                                    self.sft_overrides)

    def eval_list(self) -> list[str]:
        """The evaluate task's overrides: preset, then the user's."""
        return plan.merge_overrides(self.preset_eval, self.eval_overrides)

    def ppo_list(self, *, model_path: str, train_file: str, val_file: str, run_dir: str,
                 stop_after_step: int) -> list[str]:
        """One ppo_segment task's overrides (``plan.ppo_overrides`` with these settings)."""
        return plan.ppo_overrides(
            self.preset_ppo, self.ppo_overrides, model_path=model_path, train_file=train_file,
            val_file=val_file, run_dir=run_dir, total_steps=self.ppo_steps,
            segment_steps=self.segment_steps, stop_after_step=stop_after_step,
            adv_estimator=self.adv_estimator, experiment=self.experiment)


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping ({} for an empty file): :func:`rlhf_core.config.yaml_file.read_yaml_mapping`.

    Raises:
        FileNotFoundError: ``path`` is missing.
        ConfigError: (a ``ValueError``) one line naming the file: not valid YAML (with the line and column), or not
            a mapping.
    """
    return read_yaml_mapping(path)


def load_preset(name: str | None, config_dir: Path = CONFIG_DIR) -> dict[str, Any]:
    """``configs/presets/<name>.yaml`` ({} for None).

    Raises:
        FileNotFoundError: no such preset; the message lists the available ones.
    """
    if not name:
        return {}
    path = config_dir / "presets" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (config_dir / "presets").glob("*.yaml"))
        raise FileNotFoundError(f"preset {name!r} not found in {path.parent}; known: {known}")
    return load_yaml(path)


PRESET_PIPELINE_KEYS = ("train_prompts", "val_prompts", "sft_epochs", "ppo_steps", "segment_steps")
COUNTDOWN_KEYS = ("min_numbers", "max_numbers", "max_number")  # a preset's countdown: (generate_countdown's)
TASK_NAMES = ("prepare_data", "build_model", "sft", "ppo_segment", "evaluate", "register_model")
TASK_OPTION_KEYS = ("retries", "retry_delay_seconds", "timeout_seconds")


def _task_options(raw: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Validate ``tasks:`` of pipeline.yaml: ``{stage: {retries, retry_delay_seconds, timeout_seconds}}``.

    Raises:
        ValueError: an unknown stage or option name.
    """
    out: dict[str, dict[str, float]] = {}
    for name, opts in raw.items():
        if name not in TASK_NAMES:
            raise ValueError(f"pipeline.yaml tasks.{name}: unknown stage; known: {list(TASK_NAMES)}")
        bad = set(opts or {}) - set(TASK_OPTION_KEYS)
        if bad:
            raise ValueError(f"pipeline.yaml tasks.{name}: unknown options {sorted(bad)}; "
                             f"known: {list(TASK_OPTION_KEYS)}")
        out[name] = dict(opts or {})
    return out


def _countdown_args(preset_name: str | None, raw: Any) -> dict[str, int]:
    """A preset's ``countdown:`` mapping (``min_numbers``, ``max_numbers``, ``max_number``) as ints, checked against
    ``generate_countdown``'s limits here, before any stage runs.

    Raises:
        ValueError: not a mapping, an unknown key, a value that is not an integer, or a range outside the generator's
            limits (names the preset, key and value).
    """
    from rlhf_core.data.countdown import check_ranges, generate_countdown

    if not isinstance(raw, Mapping):
        raise ValueError(f"preset {preset_name!r}: countdown must be a mapping of {list(COUNTDOWN_KEYS)}, got {raw!r}")
    bad = set(raw) - set(COUNTDOWN_KEYS)
    if bad:
        raise ValueError(f"preset {preset_name!r}: unknown countdown keys {sorted(bad)}; "
                         f"known: {list(COUNTDOWN_KEYS)}")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"preset {preset_name!r}: countdown.{key} must be an integer, got {value!r}")
    defaults = inspect.signature(generate_countdown).parameters
    full = {k: raw.get(k, defaults[k].default) for k in COUNTDOWN_KEYS}
    try:
        check_ranges(**full)
    except ValueError as exc:
        raise ValueError(f"preset {preset_name!r}: countdown {dict(raw)}: {exc}") from exc
    return dict(raw)


def _pick(param: Any, default: Any) -> Any:
    return default if param is None else param


def resolve_settings(params: Mapping[str, Any], config_dir: Path = CONFIG_DIR) -> PipelineSettings:
    """Combine flow parameters (None = unset) with ``pipeline.yaml`` and the preset.

    A preset may hold ``task`` (``gsm8k``, ``gsm8k_tools`` or ``countdown``, default ``gsm8k``) and a ``pipeline`` mapping of
    pipeline.yaml values (``train_prompts``, ``val_prompts``, ``sft_epochs``, ``ppo_steps``, ``segment_steps``)
    that sit between pipeline.yaml and the flow parameters. ``gsm8k_dir`` falls back to ``$GSM8K_DIR``, then to
    the folder an earlier flow run in this ``$RLHF_HOME`` recorded (``infra.home.remembered``), when neither
    parameter nor file sets it. When the
    user's ppo (eval) overrides set ``custom_reward_function.path``, the preset's
    ``custom_reward_function.reward_kwargs`` entries are dropped (they are for the default scorer).

    Raises:
        ValueError: a step count below 1, an unknown task, a ``countdown:`` mapping on a task other than countdown.
        FileNotFoundError: unknown preset.
    """
    path = config_dir / "pipeline.yaml"
    cfg = load_yaml(path)

    def setting(key: str) -> Any:  # pipeline.yaml holds every setting: its values are the defaults, none here
        node: Any = cfg
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise ValueError(f"{path}: missing setting '{key}' (every key of the shipped pipeline.yaml is needed)")
            node = node[part]
        return node

    preset_name = _pick(params.get("preset"), setting("preset"))
    preset = load_preset(preset_name, config_dir)
    pp = preset.get("pipeline") or {}
    bad = set(pp) - set(PRESET_PIPELINE_KEYS)
    if bad:
        raise ValueError(f"preset {preset_name!r}: unknown pipeline keys {sorted(bad)}; known: {list(PRESET_PIPELINE_KEYS)}")
    # a preset's pipeline values sit between pipeline.yaml and the flow parameters
    preset_key = {"data.train_prompts": "train_prompts", "data.val_prompts": "val_prompts", "sft.epochs": "sft_epochs",
                  "ppo.total_steps": "ppo_steps", "ppo.segment_steps": "segment_steps"}

    def value(key: str) -> Any:
        name = preset_key.get(key)
        return pp[name] if name in pp else setting(key)

    task = str(preset["task"] if "task" in preset else setting("task"))
    if task not in plan.PIPELINE_TASKS:
        raise ValueError(f"preset {preset_name!r}: unknown task {task!r}; known: {list(plan.PIPELINE_TASKS)}")
    if "countdown" in preset and task != "countdown":
        raise ValueError(f"preset {preset_name!r}: a countdown: mapping needs task: countdown (task is {task!r})")
    skip_sft, skip_eval = params.get("skip_sft"), params.get("skip_evaluate")
    s = PipelineSettings(
        experiment=_pick(params.get("experiment"), setting("experiment")),
        preset=preset_name,
        task=task,
        model_path=_pick(params.get("model_path"), setting("model_path")),
        # then the folder an earlier run in this $RLHF_HOME used (e.g. `make demo`'s GSM8K_DIR)
        gsm8k_dir=(_pick(params.get("gsm8k_dir"), setting("gsm8k_dir")) or os.environ.get("GSM8K_DIR")
                   or remembered("gsm8k_dir")),
        ray_address=_pick(params.get("ray_address"), setting("ray_address")),
        train_prompts=int(_pick(params.get("train_prompts"), value("data.train_prompts"))),
        val_prompts=int(_pick(params.get("val_prompts"), value("data.val_prompts"))),
        sft_enabled=not skip_sft if skip_sft is not None else bool(setting("sft.enabled")),
        sft_epochs=int(_pick(params.get("sft_epochs"), value("sft.epochs"))),
        ppo_steps=int(_pick(params.get("ppo_steps"), value("ppo.total_steps"))),
        segment_steps=int(_pick(params.get("segment_steps"), value("ppo.segment_steps"))),
        adv_estimator=str(_pick(params.get("adv_estimator"), setting("ppo.adv_estimator"))),
        evaluate_enabled=not skip_eval if skip_eval is not None else bool(setting("evaluate.enabled")),
        model_sizes=dict(preset.get("model") or {}),
        countdown=_countdown_args(preset_name, preset["countdown"] if "countdown" in preset else {}),
        preset_sft=list(preset.get("sft") or []),
        # a preset's reward_kwargs are for the default scorer: dropped when the user brings
        # their own custom_reward_function.path (plan.drop_preset_reward_kwargs)
        preset_ppo=plan.drop_preset_reward_kwargs(preset.get("ppo") or [], params.get("ppo_overrides") or []),
        preset_eval=plan.drop_preset_reward_kwargs(preset.get("evaluation") or [],
                                                   params.get("eval_overrides") or []),
        sft_overrides=list(params.get("sft_overrides") or []),
        ppo_overrides=list(params.get("ppo_overrides") or []),
        eval_overrides=list(params.get("eval_overrides") or []),
    )
    baseline = _pick(params.get("baseline"), setting("regression_gate.baseline"))
    if isinstance(baseline, str) and baseline.strip().lower() in ("", "none", "null"):
        baseline = None
    s = dataclasses.replace(
        s, task_options=_task_options(setting("tasks") or {}), baseline=baseline,
        max_regression=float(_pick(params.get("max_regression"), setting("regression_gate.max_regression"))))
    if s.ppo_steps < 1 or s.segment_steps < 1:
        raise ValueError(f"ppo_steps ({s.ppo_steps}) and segment_steps ({s.segment_steps}) must be >= 1")
    if s.max_regression < 0:
        raise ValueError(f"max_regression must be >= 0 (an absolute score drop), got {s.max_regression}")
    if s.baseline is not None and not s.evaluate_enabled:
        raise ValueError(f"baseline={s.baseline!r} needs the evaluate stage (skip_evaluate is set)")
    return s


_PLACEHOLDER = "/validate-only"


def validate_overrides(s: PipelineSettings) -> None:
    """Load every stage's config with its combined override list, before any stage runs.

    The lists are built as the tasks build them (placeholder paths for the files that do not
    exist yet; only the stages that will run are checked), so a typo in ``--ppo-overrides``
    fails in seconds instead of after data preparation and SFT.

    Raises:
        ConfigError: names the stage and the flag, then load_config's message (unknown key
            with a suggestion, wrong type, impossible batch sizes...).
    """
    from rlhf_core.config import ConfigError, load_config

    p = _PLACEHOLDER
    checks: list[tuple[str, str, list[str]]] = []
    if s.sft_enabled:
        checks.append(("sft", "sft_trainer", plan.sft_overrides(
            [], s.sft_list(), model_path=p + "/model", train_file=p + "/train.parquet",
            val_file=p + "/val.parquet", out_dir=p + "/sft", experiment=s.experiment)))
    checks.append(("ppo", "ppo_trainer", s.ppo_list(
        model_path=s.model_path or p + "/model", train_file=p + "/train.parquet",
        val_file=p + "/val.parquet", run_dir=p + "/run",
        stop_after_step=plan.segment_boundaries(s.ppo_steps, s.segment_steps)[0])))
    if s.evaluate_enabled:
        checks.append(("eval", "evaluation", plan.eval_overrides(
            [], s.eval_list(), responses_path=p + "/responses.parquet", samples_dir=p + "/samples")))
    for stage, config_name, overrides in checks:
        try:
            cfg = load_config(config_name, overrides)
        except ConfigError as exc:
            raise ConfigError(f"{stage} stage ({config_name}): invalid overrides (preset "
                              f"{s.preset!r} + --{stage}-overrides), checked before any stage ran: "
                              f"{exc}") from exc
        redact(cfg)  # remember its secret values: this process's logs and artifacts scrub them from now on
