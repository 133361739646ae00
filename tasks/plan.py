"""Decision logic of the pipeline as plain functions (no Prefect, no Ray, no MLflow).

Segment boundaries, override lists, evaluation suites and cache-key digests are computed here so they can be tested
directly; the Prefect tasks only call them. Which failures are retried is :mod:`tasks.retry`; the validation sample
files are :mod:`tasks.samples`; the learning summary is :mod:`tasks.learning`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from rlhf_core.config import ConfigError, parse_value
# Re-exported for the paths tests and docs use (``plan.is_retriable``: tests/tasks, tests/reliability,
# rlhf_core/data/__init__.py; ``plan.validation_before_after``/``learning_line``: tests/reliability/
# test_learning_summary.py; questions_by_prompt_id: tests/tasks/test_infra_tasks_plan.py); code imports them
# from their own modules.
from tasks.learning import learning_line, validation_before_after  # noqa: F401
from tasks.retry import is_retriable  # noqa: F401
from tasks.samples import questions_by_prompt_id  # noqa: F401


def segment_boundaries(total_steps: int, segment_steps: int) -> list[int]:
    """Global steps at which PPO segments end: ``segment_steps, 2*segment_steps, ..., total_steps``.

    Example: ``segment_boundaries(5, 2) == [2, 4, 5]``.

    Raises:
        ValueError: ``total_steps < 1`` or ``segment_steps < 1``.
    """
    if total_steps < 1:
        raise ValueError(f"ppo total_steps must be >= 1, got {total_steps}")
    if segment_steps < 1:
        raise ValueError(f"ppo segment_steps must be >= 1, got {segment_steps}")
    bounds = list(range(segment_steps, total_steps, segment_steps))
    return bounds + [total_steps]


def override_value(value: Any) -> str:
    """Render a Python value as a verl/Hydra override value (``[a,b]``, ``null``, ``True``); a string that Hydra's
    grammar would not read back as itself (``~/x``, ``a,b``, ``#1``) is single-quoted with Hydra's escapes."""
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    text = str(value)
    if isinstance(value, str):
        try:
            same = parse_value(text) == text
        except ConfigError:
            same = False
        if not same:
            return _hydra_quote(text)
    return text


def _hydra_quote(text: str) -> str:
    # Hydra's quoted strings: a quote is escaped with a backslash, and so is a run of backslashes before one
    out, run = [], 0
    for ch in text:
        if ch == "\\":
            run += 1
            continue
        if ch == "'":
            out.append("\\" * (2 * run) + "\\'")
        else:
            out.append("\\" * run + ch)
        run = 0
    out.append("\\" * (2 * run))  # backslashes before the closing quote
    return "'" + "".join(out) + "'"


def as_overrides(mapping: dict[str, Any]) -> list[str]:
    """``{"a.b": 1}`` → ``["a.b=1"]`` (order kept)."""
    return [f"{key}={override_value(value)}" for key, value in mapping.items()]


def override_key(item: str) -> str:
    """The dotted key of an override (``+a.b=1`` / ``~a.b`` / ``a.b=1`` → ``a.b``)."""
    return item.split("=", 1)[0].strip().lstrip("+~")


def merge_overrides(*lists: Iterable[str]) -> list[str]:
    """Concatenate override lists; for a key given twice the last one wins (earlier ones dropped)."""
    out: dict[str, str] = {}
    for items in lists:
        for item in items or []:
            key = override_key(item)
            out.pop(key, None)
            out[key] = item
    return list(out.values())


REWARD_PATH_KEY = "custom_reward_function.path"
REWARD_KWARGS_KEY = "custom_reward_function.reward_kwargs"
_UNSET = {"", "null", "none", "~", "''", '""'}


def sets_custom_reward_path(overrides: Iterable[str]) -> bool:
    """True when ``overrides`` (last one wins) point ``custom_reward_function.path`` at a file.

    ``custom_reward_function.path=null`` (or ``~custom_reward_function.path``) means the default
    scorers, so it does not count.
    """
    value: str | None = None
    for item in overrides or []:
        if override_key(item) == REWARD_PATH_KEY:
            value = item.split("=", 1)[1].strip() if "=" in item and not item.startswith("~") else ""
    return value is not None and value.lower() not in _UNSET


def drop_preset_reward_kwargs(preset: Sequence[str], user: Sequence[str]) -> list[str]:
    """The preset's overrides without its ``custom_reward_function.reward_kwargs`` entries when the
    user's overrides set ``custom_reward_function.path``.

    A preset's reward kwargs (e.g. tiny_cpu's ``{format_score:0.1}``) are arguments of the default
    GSM8K scorer; a user's verl-style ``compute_score(data_source, solution_str, ground_truth,
    extra_info=None)`` would get them as unexpected keywords (TypeError). Reward kwargs the user
    gives themselves are kept (they are in ``user``, not touched here).
    """
    if not sets_custom_reward_path(user):
        return list(preset)
    return [item for item in preset
            if not (override_key(item) == REWARD_KWARGS_KEY
                    or override_key(item).startswith(REWARD_KWARGS_KEY + "."))]


def sft_overrides(preset: Sequence[str], user: Sequence[str], *, model_path: str, train_file: str,
                  val_file: str, out_dir: str, experiment: str,
                  epochs: int | None = None) -> list[str]:
    """Overrides for ``sft_trainer``: preset, then the pipeline's choices, then the user's (which win).

    ``epochs=None`` leaves ``trainer.total_epochs`` to the preset/user/defaults.
    """
    pipeline = as_overrides({
        "model.partial_pretrain": model_path,
        "data.train_files": train_file,
        "data.val_files": val_file,
        "trainer.default_local_dir": out_dir,
        "trainer.project_name": experiment,
        "trainer.experiment_name": "sft",
        **({"trainer.total_epochs": epochs} if epochs is not None else {}),
    })
    return merge_overrides(preset, pipeline, user)


def ppo_overrides(preset: Sequence[str], user: Sequence[str], *, model_path: str, train_file: str,
                  val_file: str, run_dir: str, total_steps: int, segment_steps: int,
                  stop_after_step: int, adv_estimator: str, experiment: str) -> list[str]:
    """Overrides for one PPO segment that stops (and checkpoints) at ``stop_after_step``.

    Every segment uses the same checkpoint folder and ``resume_mode=auto``, so segment k
    (or a retry of it) continues from the latest checkpoint. ``save_freq`` equals the
    segment size, so each boundary is also a regular checkpoint step. Validation is the
    ``validate`` task's (:func:`validate_overrides`, one per checkpoint): ``trainer.test_freq`` is -1 here
    unless the preset or the user set it (those layers win), and the flow runs the segments with
    :func:`segment_overrides` (no ``val_before_train`` inside a segment).
    """
    run = Path(run_dir)
    pipeline = as_overrides({
        "actor_rollout_ref.model.path": model_path,
        "critic.model.path": model_path,  # GAE's critic starts from the same (SFT) model, as verl's examples do
        "data.train_files": train_file,
        "data.val_files": val_file,
        "algorithm.adv_estimator": adv_estimator,
        "trainer.total_training_steps": total_steps,
        "trainer.save_freq": segment_steps,
        "trainer.default_local_dir": str(run / "checkpoints"),
        "trainer.validation_data_dir": str(run / "val_samples"),
        "trainer.project_name": experiment,
        "trainer.experiment_name": "ppo",
    })
    segment = as_overrides({"trainer.stop_after_step": stop_after_step, "trainer.resume_mode": "auto"})
    # validation is the validate task's: no test_freq inside segments, unless the preset or the user set one
    return merge_overrides(["trainer.test_freq=-1"], preset, pipeline, user, segment)


def segment_overrides(ppo_list: Sequence[str]) -> list[str]:
    """A ppo_segment's overrides: ``ppo_list`` with ``trainer.val_before_train=False`` (the step-0 validation is
    the ``validate`` task's; a segment, or a retry of one, never validates before its first step)."""
    return merge_overrides(ppo_list, ["trainer.val_before_train=False"])


def validate_overrides(ppo_list: Sequence[str], checkpoint: str | None) -> list[str]:
    """The ``validate`` task's overrides: the PPO run's ``ppo_list`` in verl's validation-only mode
    (``trainer.val_only`` + ``val_before_train``) on ``checkpoint`` (a ``global_step_N`` folder:
    ``resume_mode=resume_path``, so the trainer loads its weights and logs at step N), or on the starting model at
    step 0 when ``checkpoint`` is None (``resume_mode=disable``). ``del_local_ckpt_after_load`` is off: validating
    a checkpoint never removes it."""
    where = ({"trainer.resume_mode": "resume_path", "trainer.resume_from_path": checkpoint} if checkpoint
             else {"trainer.resume_mode": "disable"})
    return merge_overrides(ppo_list, as_overrides({"trainer.val_only": True, "trainer.val_before_train": True,
                                                   "trainer.del_local_ckpt_after_load": False, **where}))


def eval_overrides(preset: Sequence[str], user: Sequence[str], *, responses_path: str,
                   samples_dir: str) -> list[str]:
    """Overrides for ``evaluation``: score ``responses_path``, write samples to ``samples_dir``."""
    pipeline = as_overrides({"data.path": responses_path, "output.samples_dir": samples_dir})
    return merge_overrides(preset, pipeline, user)


DEFAULT_SUITE = "val"
SUITE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def resolve_suites(suites: Sequence[dict[str, Any]], val_file: str, ppo_config: Any) -> list[dict[str, Any]]:
    """The evaluation suites with every sampling setting filled in: ``name, files, n, temperature, top_p, top_k,
    do_sample, response_length, labelled``. ``[]`` is one suite ``val`` over ``val_file`` sampled as the PPO
    validation does (``actor_rollout_ref.rollout.val_kwargs``), ``labelled`` False: its metrics and samples keep
    the names of runs before suites existed (``test_score/<data_source>``), so a regression gate compares across
    that change. A named suite is ``labelled``: ``test_score/<suite>/<data_source>``. ``temperature`` 0 is greedy
    (``do_sample`` False); ``response_length`` None is the PPO config's ``data.max_response_length``.

    Raises:
        ConfigError: a suite without files, or whose name is not made of letters, digits and ``_.-`` (it names a
            folder and a DuckDB file), naming ``evaluation.suites[i]``.
    """
    max_len = int(ppo_config.data.max_response_length)
    if not suites:
        kw = ppo_config.actor_rollout_ref.rollout.val_kwargs
        return [{"name": DEFAULT_SUITE, "files": [val_file], "n": int(kw.n), "temperature": float(kw.temperature),
                 "top_p": float(kw.top_p), "top_k": int(kw.top_k), "do_sample": bool(kw.do_sample),
                 "response_length": max_len, "labelled": False}]
    out = []
    for i, suite in enumerate(suites):
        name = str(suite["name"])
        if not name or not set(name) <= SUITE_NAME_CHARS:
            raise ConfigError(f"evaluation.suites[{i}].name={name!r}: use letters, digits and _.- only")
        if not suite["files"]:
            raise ConfigError(f"evaluation.suites[{i}] ({name}): no files")
        temperature = float(suite["temperature"])
        length = suite["response_length"]
        out.append({"name": name, "files": [str(f) for f in suite["files"]], "n": int(suite["n"]),
                    "temperature": temperature, "top_p": float(suite["top_p"]), "top_k": -1,
                    "do_sample": temperature > 0, "response_length": max_len if length is None else int(length),
                    "labelled": True})
    return out


def generation_overrides(suite: dict[str, Any], data_path: str, output_path: str, model_path: str,
                         ppo_config: Any) -> list[str]:
    """``generation`` (verl ``main_generation``) overrides that answer ``data_path`` with ``model_path`` as
    :func:`resolve_suites`'s ``suite`` says; prompt length, prompt key, chat-template arguments, device and dtype
    as the PPO run had them."""
    rollout, data = ppo_config.actor_rollout_ref.rollout, ppo_config.data
    return as_overrides({
        "data.path": data_path, "data.output_path": output_path, "data.n_samples": suite["n"],
        "data.prompt_key": str(data.prompt_key), "model.path": model_path,
        "rollout.temperature": suite["temperature"], "rollout.top_p": suite["top_p"], "rollout.top_k": suite["top_k"],
        "rollout.do_sample": suite["do_sample"], "rollout.response_length": suite["response_length"],
        "rollout.prompt_length": int(data.max_prompt_length), "rollout.dtype": str(rollout.dtype),
        "trainer.device": str(ppo_config.trainer.device)})


def suite_metric_names(metrics: dict[str, float], suite: str, data_sources: Iterable[str]) -> dict[str, float]:
    """Evaluation metrics of one suite named after it: ``test_score/<ds>`` -> ``test_score/<suite>/<ds>`` (likewise
    ``pass@k/<ds>``, ``pass@k/num_prompts/<ds>``, ``reward/num_errors/<ds>``: the data source that ends the name, the
    longest when several do). A key that ends with no data source keeps its name."""
    sources = sorted({str(d) for d in data_sources}, key=len, reverse=True)
    out = {}
    for key, value in metrics.items():
        ds = next((d for d in sources if key.endswith("/" + d)), None)
        out[key if ds is None else f"{key[:-len(ds)]}{suite}/{ds}"] = value
    return out


def files_digest(paths: Iterable[str | Path]) -> str:
    """sha256 over the bytes of files (a folder: all files below it, by relative name)."""
    h = hashlib.sha256()
    for path in sorted(str(p) for p in paths):
        p = Path(path)
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def inputs_key(name: str, files: Iterable[str | Path], **params: Any) -> str:
    """Cache key of a stage: its name, the digest of its input files and its parameters (JSON)."""
    blob = json.dumps(params, sort_keys=True, default=str)
    return hashlib.sha256(f"{name}|{files_digest(files)}|{blob}".encode()).hexdigest()
