"""The ``distillation`` section's teachers and rules (verl 0.9.1 ``verl/workers/config/distillation.py``).

``distillation.teacher_models`` is, in verl, a dict of named teachers: the declared ``teacher_model`` entry, or
entries added with ``+distillation.teacher_models.<name>.<key>=...`` (multi-teacher on-policy distillation, MOPD).
When any other entry is added, ``teacher_model`` is dropped (verl pops it). Each entry's keys are
``teacher_model``'s (:data:`TEMPLATE`); the loader and the schema checks read ``teacher_models.<name>.x`` as
``teacher_models.teacher_model.x`` (:func:`template_path`). An added entry's keys it does not set take
``teacher_model``'s declared defaults (those following the rollout's keys follow them).

Routing (verl ``AsyncTeacherLLMServerManager``): one teacher scores every row; several teachers are keyed by their
``key``, and each row goes to the teacher whose ``key`` equals the row's ``distillation.teacher_key`` column.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

SECTION = "distillation.teacher_models"
TEMPLATE = "teacher_model"
ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # = rlhf_core.algos.distillation's (tested)
LOSS_MODES = ("forward_kl_topk",) + ESTIMATOR_MODES


def template_path(path: str) -> str | None:
    """``distillation.teacher_models.<name>.rest`` → ``distillation.teacher_models.teacher_model.rest`` for an added
    teacher ``<name>``; None for any other path (or the template itself)."""
    if not path.startswith(SECTION + "."):
        return None
    name, _, rest = path[len(SECTION) + 1:].partition(".")
    if name == TEMPLATE:
        return None
    return f"{SECTION}.{TEMPLATE}" + (f".{rest}" if rest else "")


def _entries(cfg: DictConfig) -> dict[str, Any]:
    """Name → teacher section, as verl resolves them: ``teacher_model`` alone, or every other entry without it."""
    entries = dict(cfg.distillation.teacher_models.items())
    if len(entries) > 1:
        entries.pop(TEMPLATE, None)
    return entries


def _with_defaults(cfg: DictConfig, name: str, entry: Any) -> DictConfig:
    """An added teacher's section with ``teacher_model``'s declared defaults under it, resolved against the
    rollout's keys (``inference.dtype`` follows ``actor_rollout_ref.rollout.dtype``...)."""
    from rlhf_core.config.schemas.sections09 import TeacherModelConfig

    if name == TEMPLATE:
        return entry
    merged = OmegaConf.merge(OmegaConf.structured(TeacherModelConfig), entry)
    rollout = OmegaConf.to_container(cfg.actor_rollout_ref.rollout, resolve=True)
    root = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}, "t": OmegaConf.to_container(merged)})
    return OmegaConf.create(OmegaConf.to_container(root.t, resolve=True))


def resolve_teachers(cfg: DictConfig) -> dict[str, DictConfig]:
    """Routing key → teacher section (verl ``DistillationConfig._resolve_teacher_models``): a single
    ``teacher_model`` is keyed ``default`` and scores every row; several teachers are keyed by their ``key``.

    Raises:
        ValueError: from :func:`teacher_errors` (a missing ``model_path`` or ``key``, a duplicate ``key``).
    """
    errors = teacher_errors(cfg)
    if errors:
        raise ValueError("; ".join(errors))
    entries = _entries(cfg)
    if list(entries) == [TEMPLATE]:
        return {"default": entries[TEMPLATE]}
    return {str(e.key): _with_defaults(cfg, n, e) for n, e in entries.items()}


def teacher_sections(cfg: DictConfig) -> dict[str, str]:
    """Routing key (as :func:`resolve_teachers` keys them: ``default`` for a single ``teacher_model``) → the config
    path of that teacher's section, e.g. ``distillation.teacher_models.teacher_model``, so that errors name the key a
    user wrote rather than the internal routing key. Assumes :func:`teacher_errors` found nothing."""
    entries = _entries(cfg)
    if list(entries) == [TEMPLATE]:
        return {"default": f"{SECTION}.{TEMPLATE}"}
    return {str(e.key): f"{SECTION}.{n}" for n, e in entries.items()}


def teacher_errors(cfg: DictConfig) -> list[str]:
    """What is wrong with the teachers of an enabled ``distillation`` section (empty: nothing)."""
    entries = _entries(cfg)
    errors, seen = [], {}
    for name, entry in entries.items():
        path = f"{SECTION}.{name}"
        if not isinstance(entry, DictConfig):
            errors.append(f"{path} must be a section with model_path, key, ...; got {entry!r}")
            continue
        if entry.get("model_path") is None:
            errors.append(f"{path}.model_path must be set (a local Hugging Face model folder): it is the teacher that "
                          "scores the student's responses")
        if len(entries) > 1:
            key = entry.get("key")
            if key is None:
                errors.append(f"{path}.key must be set with several teachers: the value of distillation.teacher_key "
                              "whose rows this teacher scores")
            elif key in seen:
                errors.append(f"{path}.key={key!r} is also {SECTION}.{seen[key]}.key: each teacher needs its own key")
            else:
                seen[key] = name
    return errors


def distillation_errors(cfg: DictConfig) -> list[str]:
    """The rules of an enabled ``distillation`` section (verl ``DistillationLossConfig.__post_init__`` and
    ``DistillationTeacherModelConfig.validate_and_prepare_for_distillation``), checked before anything loads:
    the teachers (:func:`teacher_errors`); ``k1`` (or its alias ``kl``) only with ``use_policy_gradient`` (its
    gradient does not depend on the teacher); ``topk`` >= 1 for ``forward_kl_topk``; room in each teacher's
    ``inference.max_model_len`` for prompt + response + 1."""
    d = cfg.distillation
    if not d.enabled:
        return []
    errors = teacher_errors(cfg)
    lc = d.distillation_loss
    if lc.loss_mode in ("k1", "kl") and not lc.use_policy_gradient:
        errors.append(f"distillation.distillation_loss.loss_mode={lc.loss_mode} needs use_policy_gradient=True: "
                      "backpropagating k1 directly is incorrect, its gradient does not depend on the teacher's "
                      "log-probs (use k3, or forward_kl_topk, for a supervised loss)")
    if lc.loss_mode == "forward_kl_topk" and (lc.topk is None or int(lc.topk) < 1):
        errors.append(f"distillation.distillation_loss.topk={lc.topk} must be >= 1 for loss_mode=forward_kl_topk")
    if errors:
        return errors
    for key, t in resolve_teachers(cfg).items():
        inf = t.inference
        need = int(inf.prompt_length) + int(inf.response_length) + 1
        if inf.max_model_len is not None and need > int(inf.max_model_len):
            errors.append(f"distillation teacher {key!r}: inference.max_model_len={inf.max_model_len} leaves no room "
                          f"for the student's prompt and response: prompt_length {inf.prompt_length} + "
                          f"response_length {inf.response_length} + 1 = {need}")
    return errors
