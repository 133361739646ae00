"""On-policy distillation teachers, scored by a Hugging Face forward in the actor's workers (verl 0.9.1 serves them
as vLLM/sglang servers: ``verl/experimental/teacher_loop``).

Each actor rank holds a full (unsharded, frozen) copy of every teacher and scores the rows of its own shard: the
teacher's log-prob of each sampled response token given the prompt and the response so far (the same alignment as
the reference's log-probs), and for ``forward_kl_topk`` its ``topk`` most likely tokens and their log-probs at each
response position. As in verl the teacher's log-probs are taken at temperature 1 (verl: temperature has no effect on
prompt log-probs, and a ``distillation...inference.temperature`` other than 1 is warned about and ignored); the
student's are at the rollout temperature.

Routing (:func:`route_rows`): one teacher scores every row; with several, each row goes to the teacher whose
``key`` equals the row's ``distillation.teacher_key`` column.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from rlhf_core.config.distillation import resolve_teachers, teacher_sections
from rlhf_core.models.loading import load_causal_lm, to_torch_dtype
from rlhf_core.protocol import Batch
from rlhf_core.workers.batching import token_budget_partition
from rlhf_core.workers.fsdp_utils import device
from rlhf_core.workers.model_setup import prepare_role_model

logger = logging.getLogger(__name__)


def route_rows(values: np.ndarray | None, n_rows: int, teacher_keys: list[str],
               teacher_key: str) -> dict[str, np.ndarray]:
    """Row indices per teacher (verl ``AsyncTeacherLLMServerManager._resolve_teacher_key``).

    Args:
        values: the rows' ``teacher_key`` column (``(B,)``), or None when the batch lacks it.
        n_rows: B.
        teacher_keys: the teachers' routing keys (one: every row goes to it, whatever its column says).
        teacher_key: the column's name (``distillation.teacher_key``), for errors.
    Raises:
        ValueError: with several teachers, when the column is missing or a row's value matches no teacher (naming
            the value, the column and the configured keys).
    """
    if len(teacher_keys) == 1:
        return {teacher_keys[0]: np.arange(n_rows)}
    if values is None:
        raise ValueError(f"multi-teacher distillation routes rows by distillation.teacher_key={teacher_key!r}, but the "
                         f"batch has no column {teacher_key!r} (a field of each data row)")
    out: dict[str, np.ndarray] = {}
    for value in dict.fromkeys(values.tolist()):
        if value not in teacher_keys:
            raise ValueError(f"no distillation teacher for {teacher_key}={value!r}: the teachers' keys are "
                             f"{sorted(teacher_keys)} (distillation.teacher_models.<name>.key)")
        out[value] = np.nonzero(values == value)[0]
    return out


def teacher_outputs(logits: torch.Tensor, responses: torch.Tensor, topk: int | None) -> dict[str, torch.Tensor]:
    """The teacher's log-probs from its logits predicting the response tokens.

    Args:
        logits: ``(b, T, V)`` (temperature 1).
        responses: ``(b, T)`` the sampled token ids.
        topk: k for ``forward_kl_topk``, or None.
    Returns:
        ``teacher_log_probs (b, T)`` float32 (log p_T of the sampled token), or with ``topk``
        ``teacher_topk_log_probs (b, T, k)`` float32 and ``teacher_topk_ids (b, T, k)`` int64.
    Raises:
        ValueError: when ``topk`` exceeds the vocabulary.
    """
    log_p = torch.log_softmax(logits.float(), dim=-1)
    if topk is None:
        return {"teacher_log_probs": torch.gather(log_p, -1, responses.long().unsqueeze(-1)).squeeze(-1)}
    if topk > log_p.shape[-1]:
        raise ValueError(f"distillation.distillation_loss.topk={topk} exceeds the teacher's vocabulary of "
                         f"{log_p.shape[-1]} tokens")
    values, ids = torch.topk(log_p, k=topk, dim=-1)
    return {"teacher_topk_log_probs": values, "teacher_topk_ids": ids}


class TeacherScorer:
    """The teachers of one actor rank (``distillation.teacher_models``, resolved by
    :func:`~rlhf_core.config.distillation.resolve_teachers`).

    Args:
        config: the full PPO config (``distillation.*``).
        use_remove_padding: ``actor_rollout_ref.model.use_remove_padding``: the forward runs packed.
        topk: ``distillation_loss.topk`` when the loss mode needs top-k log-probs, else None.
    Raises:
        OSError / FileNotFoundError: naming the teacher's ``model_path`` when it cannot be loaded.
    """

    def __init__(self, config: Any, use_remove_padding: bool, topk: int | None) -> None:
        from rlhf_core.workers.actor import choose_response_forward

        self.teacher_key = str(config.distillation.teacher_key)
        self.topk = topk
        self.models, self.paths = {}, {}
        for key, t in resolve_teachers(config).items():
            if float(t.inference.temperature) != 1.0:
                logger.warning("distillation teacher %r: inference.temperature=%s has no effect on its log-probs of "
                               "given tokens (a forward pass only); they are taken at temperature 1, as in verl",
                               key, t.inference.temperature)
            dtype = to_torch_dtype(t.inference.dtype)  # null: float32
            try:
                model = load_causal_lm(str(t.model_path), dtype=dtype)
            except OSError as exc:
                raise type(exc)(f"distillation teacher {key!r}: model_path={t.model_path!r}: {exc}") from exc
            model.requires_grad_(False)
            model = prepare_role_model(model, "ref", None).to(device()).eval()
            self.models[key] = model
            self.paths[key] = choose_response_forward(model, use_remove_padding)

    @torch.no_grad()
    def score(self, batch: Batch, micro_batch_size: int | None, use_dynamic_bsz: bool = False,
              max_token_len: int | None = None) -> Batch:
        """The teachers' log-probs of this rank's rows (:func:`teacher_outputs`), rows in order; padding positions
        hold whatever the teacher says there (the loss masks them).

        Each teacher's rows run in forwards of ``micro_batch_size`` rows, or with ``use_dynamic_bsz`` of consecutive
        rows whose valid tokens (``attention_mask`` sums) stay within ``max_token_len``
        (``rollout.log_prob_max_token_len_per_gpu``; verl's ``log_prob_*`` batching). The cut is local to this rank
        (:func:`~rlhf_core.workers.batching.token_budget_partition`, no all-reduce: the teachers are unsharded
        copies and each rank's routes differ); with neither, one forward per teacher. The outputs do not depend on
        the cut (row-wise forwards).

        Raises:
            ValueError: from :func:`route_rows`; with ``use_dynamic_bsz``, a ``max_token_len`` that is not positive
                or is shorter than a row (naming ``actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu``).
        """
        from rlhf_core.workers.actor import forward_response_logits

        key_name = "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"
        if use_dynamic_bsz and (not max_token_len or int(max_token_len) <= 0):
            raise ValueError(f"log_prob_use_dynamic_bsz needs a positive {key_name}, got {max_token_len!r}")
        routes = route_rows(batch.non_tensors.get(self.teacher_key), len(batch), list(self.models), self.teacher_key)
        responses = batch["responses"]
        B, T = responses.shape
        out: dict[str, torch.Tensor] = {}
        for key, rows in routes.items():
            sub = batch.index(rows)
            if use_dynamic_bsz:
                lens = [int(n) for n in sub["attention_mask"].sum(dim=-1).tolist()]
                pieces = [sub.index(g) for g in token_budget_partition(lens, int(max_token_len), key_name)]
            else:
                pieces = sub.split(int(micro_batch_size) if micro_batch_size else max(len(sub), 1))
            parts = [teacher_outputs(forward_response_logits(self.models[key], mb, T, path=self.paths[key]),
                                     mb["responses"].to(device()), self.topk) for mb in pieces]
            for name in parts[0] if parts else ():
                value = torch.cat([p[name] for p in parts]).cpu()
                if name not in out:
                    out[name] = torch.zeros((B, *value.shape[1:]), dtype=value.dtype)
                out[name][torch.as_tensor(rows, dtype=torch.long)] = value
        return Batch(out)


def build_teachers(config: Any, use_remove_padding: bool) -> TeacherScorer:
    """This rank's :class:`TeacherScorer` (``distillation.enabled``), with ``topk`` from
    ``distillation.distillation_loss.topk`` when its ``loss_mode`` uses top-k log-probs (else None).

    Raises:
        OSError / FileNotFoundError: from :class:`TeacherScorer`.
    """
    from rlhf_core.algos.distillation import uses_topk

    loss_cfg = config.distillation.distillation_loss
    return TeacherScorer(config, use_remove_padding, int(loss_cfg.topk) if uses_topk(loss_cfg.loss_mode) else None)


def check_teachers(config: Any) -> None:
    """Refuse, before Ray starts, a teacher that cannot serve (``distillation.enabled``): a ``model_path`` that does
    not exist or lacks complete weights (as the roles' paths), or a tokenizer vocabulary other than the student's
    (verl requires the same tokenizer: the teacher scores the student's token ids). Loads the tokenizers only.

    Raises:
        FileNotFoundError / ConfigError: naming the teacher's config key (``distillation.teacher_models.<name>.
        model_path``), the path and the problem.
    """
    from rlhf_core.config.errors import ConfigError
    from rlhf_core.models.loading import check_local_path, load_tokenizer, local_path, model_tokenizer_path
    from rlhf_core.models.preflight import check_model_files

    if not config.distillation.enabled:
        return
    try:
        teachers = resolve_teachers(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    mcfg = config.actor_rollout_ref.model
    student_path = model_tokenizer_path(mcfg)
    student = load_tokenizer(local_path(student_path), bool(mcfg.trust_remote_code)).get_vocab()
    sections = teacher_sections(config)
    for key, t in teachers.items():
        name = f"{sections[key]}.model_path"
        try:
            check_local_path(str(t.model_path))
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{name}={t.model_path!r}: {exc}") from None
        check_model_files(name, str(t.model_path))
        vocab = load_tokenizer(local_path(str(t.model_path)), bool(mcfg.trust_remote_code)).get_vocab()
        if vocab != student:
            only_t = sorted(set(vocab) - set(student))[:3]
            only_s = sorted(set(student) - set(vocab))[:3]
            raise ConfigError(f"{name}={t.model_path!r}: its tokenizer's vocabulary ({len(vocab)} tokens) differs from "
                              f"the student's ({student_path!r}, {len(student)} tokens; e.g. only the teacher's: "
                              f"{only_t}, only the student's: {only_s}, or the same tokens with other ids): on-policy "
                              "distillation needs the same tokenizer (the teacher scores the student's token ids)")
