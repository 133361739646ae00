"""Resolve the ``rlhf`` flow's settings: an experiment file (``flows.experiment``) plus the flow's run-time
parameters, which win over the file's fields (``train_prompts`` over ``data.train_max_samples``, ``ppo_steps`` over
``ppo.total_steps``, ``*_overrides`` after the file's ``overrides``...).

Layering of one stage's overrides (later wins): the shipped config -> the experiment's ``config`` file -> the
experiment's fields that map to keys (``reward.path``/``name`` -> ``custom_reward_function.*``; the pipeline's own
choices: paths, steps, ``adv_estimator``) -> the experiment's ``overrides`` -> the flow's ``*_overrides``.
Every default lives in ``flows/experiment.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any, Mapping

from flows.experiment import Experiment, ExperimentError, experiment_for_flow
from infra.home import remembered
from rlhf_core.config.yaml_file import read_yaml_mapping
from rlhf_core.redact import redact
from tasks import plan

TASK_NAMES = tuple(f.name for f in dataclasses.fields(Experiment().tasks))
TASK_OPTION_KEYS = ("retries", "retry_delay_seconds", "timeout_seconds")


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """Every value the flow uses: the experiment's, with the flow's run-time parameters applied."""

    experiment: str                    # the experiment's name: MLflow experiment, trainer.project_name
    experiment_file: str               # where the experiment came from (a path, or <experiment text>)
    experiment_sha256: str             # sha256 of the experiment's text
    preset: str | None                 # the preset= alias used (experiments/<preset>.yaml), or None
    model_path: str | None
    ray_address: str | None
    generator: str | None              # data.generator, or None for train_files/val_files
    generator_args: dict[str, Any]
    train_files: list[str]
    val_files: list[str]
    sft_train_files: list[str]
    sft_val_files: list[str]
    train_prompts: int                 # rows kept from the training data (first N; <= 0 all)
    val_prompts: int
    sft_enabled: bool
    sft_epochs: int
    ppo_steps: int
    segment_steps: int
    adv_estimator: str
    evaluate_enabled: bool
    model_sizes: dict[str, Any]
    experiment_sft: list[str]          # the experiment's layers of each stage (config file, mapped fields, overrides)
    experiment_ppo: list[str]
    experiment_eval: list[str]
    sft_overrides: list[str]           # the flow's run-time *_overrides (they win)
    ppo_overrides: list[str]
    eval_overrides: list[str]
    suites: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    task_options: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    baseline: str | None = None        # regression gate: previous-successful | a run id | None (off)
    max_regression: float = 0.0        # absolute drop of a data source's mean score tolerated
    schedule: dict[str, Any] | None = None
    work_pool: str = ""
    description: str = ""
    # the PPO config's overlong filter (data.*): when filter_overlong_prompts is on, the filter_prompts task
    # filters the prepared files and the ppo stage reads them with data.filter_overlong_prompts=False
    prefilter: bool = False
    filter_cfg: dict[str, Any] = dataclasses.field(default_factory=dict)
    prompt_key: str = "prompt"
    reward_path: str | None = None     # the PPO config's custom_reward_function.path / .name (checked by preflight)
    reward_name: str = "compute_score"

    @property
    def data_label(self) -> str:
        """:func:`rlhf_core.data.generators.data_label` of this experiment's generator (as ``prepare_data``
        names the data)."""
        from rlhf_core.data.generators import data_label

        return data_label(self.generator)

    def data_spec(self) -> dict[str, Any]:
        """The ``prepare_data`` task's ``data`` argument (what the prepared files are a function of)."""
        return {"generator": self.generator, "generator_args": dict(self.generator_args),
                "train_files": list(self.train_files), "val_files": list(self.val_files),
                "train_prompts": self.train_prompts, "val_prompts": self.val_prompts,
                "sft_train_files": list(self.sft_train_files), "sft_val_files": list(self.sft_val_files),
                "suites": [{"name": x["name"], "files": list(x["files"])} for x in self.suites],
                "prompt_key": self.prompt_key}

    def as_params(self) -> dict[str, Any]:
        """The settings as a dict (for the parent MLflow run's params)."""
        return dataclasses.asdict(self)

    def sft_list(self) -> list[str]:
        """The sft task's overrides: the experiment's, then ``trainer.total_epochs``, then the run-time ones."""
        return plan.merge_overrides(self.experiment_sft, [f"trainer.total_epochs={self.sft_epochs}"],
                                    self.sft_overrides)

    def eval_list(self) -> list[str]:
        """The evaluate task's overrides: the experiment's, then the run-time ones."""
        return plan.merge_overrides(self.experiment_eval, self.eval_overrides)

    def ppo_list(self, *, model_path: str, train_file: str, val_file: str, run_dir: str,
                 stop_after_step: int) -> list[str]:
        """One ppo_segment task's overrides (``plan.ppo_overrides`` with these settings). With ``prefilter`` the
        data files were filtered by the ``filter_prompts`` task, so ``data.filter_overlong_prompts=False`` is added
        last (the PPO stage filters nothing again)."""
        out = plan.ppo_overrides(
            self.experiment_ppo, self.ppo_overrides, model_path=model_path, train_file=train_file,
            val_file=val_file, run_dir=run_dir, total_steps=self.ppo_steps,
            segment_steps=self.segment_steps, stop_after_step=stop_after_step,
            adv_estimator=self.adv_estimator, experiment=self.experiment)
        return plan.merge_overrides(out, ["data.filter_overlong_prompts=False"]) if self.prefilter else out


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping ({} for an empty file): :func:`rlhf_core.config.yaml_file.read_yaml_mapping`.

    Raises:
        FileNotFoundError: ``path`` is missing.
        ConfigError: (a ``ValueError``) one line naming the file: not valid YAML, or not a mapping.
    """
    return read_yaml_mapping(path)


def _render(value: Any) -> str:
    """An override value; mappings in Hydra's ``{k:v}`` syntax (``plan.override_value`` for the rest)."""
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_render(v) for v in value) + "]"
    return plan.override_value(value)


def config_file_overrides(path: str | None, field: str, config_name: str) -> list[str]:
    """The keys of a user's stage config file (verl's ``--config-path/--config-name``) as overrides, after checking
    it against the shipped ``config_name`` (``load_config``: unknown keys refused with a suggestion).

    Raises:
        ExperimentError: one line naming the experiment field, the file and load_config's message.
    """
    if path is None:
        return []
    from rlhf_core.config import ConfigError, load_config
    from rlhf_core.config.schema import flatten

    try:
        raw = read_yaml_mapping(path)
        raw = {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}
        out = [f"{k}={_render(v)}" for k, v in flatten(raw, resolve=False).items()
               if k.rsplit(".", 1)[-1] != "_target_"]
        load_config(config_name, out)  # its keys checked against the shipped config (unknown key: a suggestion)
    except (ConfigError, FileNotFoundError) as exc:
        raise ExperimentError(f"{field}: {path}: {exc}") from None
    return out


def _reward_overrides(exp: Experiment) -> list[str]:
    if exp.reward.path is None:
        return []
    return plan.as_overrides({"custom_reward_function.path": exp.reward.path,
                              "custom_reward_function.name": exp.reward.name})


def _pick(param: Any, default: Any) -> Any:
    return default if param is None else param


def _generator_args(exp: Experiment, params: Mapping[str, Any]) -> dict[str, Any]:
    """The experiment's generator arguments; a generator that reads a ``source_dir`` gets the ``gsm8k_dir``
    parameter, else the file's value, else ``$GSM8K_DIR``, else the folder an earlier flow run in this
    ``$RLHF_HOME`` recorded (``infra.home.remembered``)."""
    from rlhf_core.data.generators import GENERATORS

    args = dict(exp.data.generator_args)
    gen = GENERATORS.get(exp.data.generator or "")
    if gen is not None and "source_dir" in inspect.signature(gen.generate).parameters:
        args["source_dir"] = (params.get("gsm8k_dir") or args.get("source_dir") or os.environ.get("GSM8K_DIR")
                              or remembered("gsm8k_dir"))
    return args


def resolve_settings(params: Mapping[str, Any], experiment: Experiment | None = None) -> PipelineSettings:
    """Combine the flow's parameters (None = unset) with the experiment.

    The experiment is ``experiment`` when given, else the one the parameters name
    (``experiment_content``/``experiment_file``/``experiment_sha256``/``experiment_base_dir``, or ``preset``:
    :func:`flows.experiment.experiment_for_flow`). The ``experiment`` parameter renames the MLflow experiment. When
    the run-time ppo (eval) overrides set ``custom_reward_function.path``, the experiment's
    ``custom_reward_function.reward_kwargs`` entries are dropped (they are for the scorer it named).

    Raises:
        ExperimentError: (a ConfigError) the experiment file's errors; a step count below 1 from the parameters.
        ValueError: ``max_regression`` below 0, or a baseline with ``skip_evaluate``.
        FileNotFoundError: an experiment file that does not exist.
    """
    exp = experiment or experiment_for_flow(
        params.get("experiment_file"), params.get("experiment_content"), params.get("experiment_sha256"),
        params.get("experiment_base_dir"), params.get("preset"))
    skip_sft, skip_eval = params.get("skip_sft"), params.get("skip_evaluate")
    reward = _reward_overrides(exp)
    ppo_layers = (config_file_overrides(exp.ppo.config, "ppo.config", "ppo_trainer") + reward
                  + list(exp.ppo.overrides))
    eval_layers = config_file_overrides(exp.evaluation.config, "evaluation.config", "evaluation") + reward + list(
        exp.evaluation.overrides)
    baseline = _pick(params.get("baseline"), exp.regression_gate.baseline)
    if isinstance(baseline, str) and baseline.strip().lower() in ("", "none", "null"):
        baseline = None
    s = PipelineSettings(
        experiment=_pick(params.get("experiment"), exp.name),
        experiment_file=exp.source,
        experiment_sha256=exp.sha256,
        preset=params.get("preset"),
        model_path=_pick(params.get("model_path"), exp.model.path),
        ray_address=_pick(params.get("ray_address"), exp.ray_address),
        generator=exp.data.generator,
        generator_args=_generator_args(exp, params),
        train_files=list(exp.data.train_files),
        val_files=list(exp.data.val_files),
        sft_train_files=list(exp.sft.train_files),
        sft_val_files=list(exp.sft.val_files),
        train_prompts=int(_pick(params.get("train_prompts"), exp.data.train_max_samples)),
        val_prompts=int(_pick(params.get("val_prompts"), exp.data.val_max_samples)),
        sft_enabled=not skip_sft if skip_sft is not None else exp.sft.enabled,
        sft_epochs=int(_pick(params.get("sft_epochs"), exp.sft.epochs)),
        ppo_steps=int(_pick(params.get("ppo_steps"), exp.ppo.total_steps)),
        segment_steps=int(_pick(params.get("segment_steps"), exp.ppo.segment_steps)),
        adv_estimator=str(_pick(params.get("adv_estimator"), exp.ppo.adv_estimator)),
        evaluate_enabled=not skip_eval if skip_eval is not None else exp.evaluation.enabled,
        model_sizes=dict(exp.model.tiny),
        experiment_sft=config_file_overrides(exp.sft.config, "sft.config", "sft_trainer") + list(exp.sft.overrides),
        # the experiment's reward_kwargs are for the scorer it names: dropped when the run brings its own
        # custom_reward_function.path (plan.drop_preset_reward_kwargs)
        experiment_ppo=plan.drop_preset_reward_kwargs(ppo_layers, params.get("ppo_overrides") or []),
        experiment_eval=plan.drop_preset_reward_kwargs(eval_layers, params.get("eval_overrides") or []),
        sft_overrides=list(params.get("sft_overrides") or []),
        ppo_overrides=list(params.get("ppo_overrides") or []),
        eval_overrides=list(params.get("eval_overrides") or []),
        suites=[dataclasses.asdict(x) for x in exp.evaluation.suites],
        task_options=exp.tasks.as_dict(),
        baseline=baseline,
        max_regression=float(_pick(params.get("max_regression"), exp.regression_gate.max_regression)),
        schedule=dataclasses.asdict(exp.schedule) if exp.schedule is not None else None,
        work_pool=exp.work_pool,
        description=exp.description,
    )
    if s.ppo_steps >= 1 and s.segment_steps >= 1:
        s = _with_filter(s)
    if s.ppo_steps < 1 or s.segment_steps < 1:
        raise ExperimentError(f"ppo_steps ({s.ppo_steps}) and segment_steps ({s.segment_steps}) must be >= 1")
    if s.max_regression < 0:
        raise ExperimentError(f"{s.experiment_file}: regression_gate.max_regression (or --max-regression) must be "
                              f">= 0 (an absolute score drop), got {s.max_regression}")
    if s.baseline is not None and not s.evaluate_enabled:
        raise ExperimentError(f"{s.experiment_file}: regression_gate.baseline={s.baseline!r} needs the evaluate "
                              "stage (evaluation.enabled is false or --skip-evaluate is set)")
    return s


_PLACEHOLDER = "/validate-only"


def _with_filter(s: PipelineSettings) -> PipelineSettings:
    """``s`` with the PPO config's overlong-filter settings (``prefilter``, ``filter_cfg``, ``prompt_key``); ``s``
    as it is when the ppo overrides do not load (:func:`validate_overrides` then names the bad key)."""
    from rlhf_core.config import ConfigError

    try:
        cfg = ppo_config(s)
    except ConfigError:
        return s
    data, reward = cfg.data, cfg.custom_reward_function
    filter_cfg = {"max_prompt_length": int(data.max_prompt_length),
                  "workers": int(data.filter_overlong_prompts_workers), "prompt_key": str(data.prompt_key),
                  "template_kwargs": dict(data.apply_chat_template_kwargs)}
    return dataclasses.replace(s, prefilter=bool(data.filter_overlong_prompts), filter_cfg=filter_cfg,
                               prompt_key=str(data.prompt_key), reward_path=reward.path, reward_name=str(reward.name))


def validate_overrides(s: PipelineSettings) -> None:
    """Load every stage's config with its combined override list, before any stage runs.

    The lists are built as the tasks build them (placeholder paths for the files that do not
    exist yet; only the stages that will run are checked), so a typo in ``--ppo-overrides``
    fails in seconds instead of after data preparation and SFT.

    Raises:
        ConfigError: names the stage, the experiment file and the flag, then load_config's message (unknown key
            with a suggestion, wrong type, impossible batch sizes...).
    """
    from rlhf_core.config import ConfigError, load_config

    section = {"sft": "sft", "ppo": "ppo", "eval": "evaluation"}
    for stage, config_name, overrides in stage_override_lists(s):
        try:
            cfg = load_config(config_name, overrides)
        except ConfigError as exc:
            raise ConfigError(f"{stage} stage ({config_name}): invalid overrides ({s.experiment_file} "
                              f"{section[stage]}.overrides + --{stage}-overrides), checked before any stage ran: "
                              f"{exc}") from exc
        redact(cfg)  # remember its secret values: this process's logs and artifacts scrub them from now on


def stage_override_lists(s: PipelineSettings) -> list[tuple[str, str, list[str]]]:
    """``[(stage, config name, overrides)]`` of the stages that will run (``sft``, ``ppo``, ``eval``), built as the
    tasks build them, with placeholder paths for the files that do not exist yet (the experiment's fields that map
    to keys included: ``ppo.adv_estimator``, steps, ``reward.*``)."""
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
    return checks


def ppo_config(s: PipelineSettings) -> Any:
    """The PPO stage's resolved config (its ``data`` section holds the overlong filter's settings:
    ``max_prompt_length``, ``filter_overlong_prompts``, ``filter_overlong_prompts_workers``, ``prompt_key``,
    ``apply_chat_template_kwargs``; ``custom_reward_function`` the reward file).

    Raises:
        ConfigError: the ppo overrides do not load (as :func:`validate_overrides`).
    """
    from rlhf_core.config import load_config

    p = _PLACEHOLDER
    return load_config("ppo_trainer", s.ppo_list(
        model_path=s.model_path or p + "/model", train_file=p + "/train.parquet", val_file=p + "/val.parquet",
        run_dir=p + "/run", stop_after_step=plan.segment_boundaries(s.ppo_steps, s.segment_steps)[0]))
