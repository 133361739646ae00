"""Distillation teachers in the actor's workers (rlhf_core/workers/teacher.py), without Ray: the scored log-probs
are the teacher's own forward at the response positions, rows go to the teacher of their ``teacher_key`` value, the
teacher loads in ``inference.dtype`` and scores at temperature 1 whatever ``inference.temperature`` says."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from rlhf_core.config import load_config
from rlhf_core.protocol import Batch
from rlhf_core.workers.teacher import TeacherScorer
from tests.fixtures.teacher_fixtures import build_teacher

D = "distillation."
P, T = 4, 3


@pytest.fixture(scope="module")
def teacher_dir(tiny_model_dir, tmp_path_factory):
    return build_teacher(tiny_model_dir, tmp_path_factory.mktemp("teacher") / "model")


def _config(*overrides):
    return load_config("ppo_trainer", [f"{D}enabled=true", "actor_rollout_ref.rollout.dtype=float32",
                                       "actor_rollout_ref.rollout.temperature=1.0", *overrides])


def _batch(sources):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 900, (len(sources), P + T), generator=g)
    mask = torch.ones_like(ids)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": torch.arange(P + T).expand_as(ids),
                  "responses": ids[:, P:]}, {"data_source": np.array(sources, dtype=object)})


def _own_forward(path, batch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits[:, P - 1:P + T - 1].float()
    return torch.gather(torch.log_softmax(logits, -1), -1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def test_rows_are_scored_by_the_teacher_of_their_key(tiny_model_dir, teacher_dir):
    cfg = _config(f"+{D}teacher_models.gsm.model_path={tiny_model_dir}", f"+{D}teacher_models.gsm.key=gsm8k",
                  f"+{D}teacher_models.math.model_path={teacher_dir}", f"+{D}teacher_models.math.key=math")
    batch = _batch(["gsm8k", "math", "gsm8k", "math"])
    scorer = TeacherScorer(cfg, use_remove_padding=False, topk=None)
    got = scorer.score(batch, micro_batch_size=1)["teacher_log_probs"]
    by_student, by_teacher = _own_forward(tiny_model_dir, batch), _own_forward(teacher_dir, batch)
    assert torch.allclose(got[[0, 2]], by_student[[0, 2]], atol=1e-5)
    assert torch.allclose(got[[1, 3]], by_teacher[[1, 3]], atol=1e-5)
    assert not torch.allclose(by_student, by_teacher, atol=1e-2)  # the two teachers do differ: routing matters
    with pytest.raises(ValueError, match=r"no distillation teacher for data_source='geo3k'"):
        scorer.score(_batch(["gsm8k", "geo3k"]), micro_batch_size=None)


def test_dtype_topk_and_temperature(teacher_dir, caplog):
    base = [f"{D}teacher_models.teacher_model.model_path={teacher_dir}"]
    bf16 = TeacherScorer(_config(*base, f"{D}teacher_models.teacher_model.inference.dtype=bfloat16"), False, None)
    assert next(bf16.models["default"].parameters()).dtype == torch.bfloat16
    batch = _batch(["a", "b"])
    ref = TeacherScorer(_config(*base), False, 5).score(batch, None)
    with caplog.at_level(logging.WARNING, logger="rlhf_core.workers.teacher"):
        warm = TeacherScorer(_config(*base, "actor_rollout_ref.rollout.temperature=0.7"), False, 5)
    assert "inference.temperature=0.7 has no effect" in caplog.text
    out = warm.score(batch, None)  # as verl: the teacher's log-probs at temperature 1 whatever the key says
    assert torch.equal(out["teacher_topk_ids"], ref["teacher_topk_ids"]) and out["teacher_topk_ids"].shape == (2, T, 5)
    assert torch.allclose(out["teacher_topk_log_probs"], ref["teacher_topk_log_probs"])
    # the top-1 log-prob is the maximum of the teacher's own log-softmax at each position
    assert torch.all(ref["teacher_topk_log_probs"][..., 0] >= _own_forward(teacher_dir, batch) - 1e-5)


def _ragged_batch(n):
    """``n`` rows of P + T tokens, row i with its last i % T response tokens padded out (valid lengths 7, 6, 5, 7,
    6, ...): the token budget then cuts them unevenly."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 900, (n, P + T), generator=g)
    mask = torch.ones_like(ids)
    for i in range(n):
        mask[i, P + T - i % T:] = 0
    ids = ids * mask
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0),
                  "responses": ids[:, P:], "response_mask": mask[:, P:]},
                 {"data_source": np.array(["a"] * n, dtype=object)})


@pytest.mark.parametrize("remove_padding", [False, True])
def test_dynamic_bsz_splits_the_forwards_and_not_the_results(teacher_dir, monkeypatch, remove_padding):
    """``log_prob_use_dynamic_bsz`` with no micro size (verl's OPD example): the teacher's rows run in token-budget
    forwards, not all at once, and every output equals the one-forward result (float32 rounding only)."""
    import rlhf_core.workers.actor as actor_mod

    scorer = TeacherScorer(_config(f"{D}teacher_models.teacher_model.model_path={teacher_dir}"), remove_padding, 4)
    batch = _ragged_batch(6)  # valid lengths 7, 6, 5, 7, 6, 5
    calls = []
    real = actor_mod.forward_response_logits
    monkeypatch.setattr(actor_mod, "forward_response_logits", lambda m, mb, *a, **k: calls.append(len(mb)) or
                        real(m, mb, *a, **k))
    whole = scorer.score(batch, None)
    assert calls == [6]
    calls.clear()
    # budget 13: 7+6 | 5+7 | 6+5 (consecutive rows, each group <= 13 tokens)
    split = scorer.score(batch, None, use_dynamic_bsz=True, max_token_len=13)
    assert calls == [2, 2, 2]
    for name in ("teacher_topk_log_probs", "teacher_topk_ids"):
        assert split[name].shape == whole[name].shape == (6, T, 4)
    valid = batch["response_mask"].bool()  # padding positions hold whatever the teacher says there
    assert torch.equal(split["teacher_topk_ids"][valid], whole["teacher_topk_ids"][valid])
    assert torch.allclose(split["teacher_topk_log_probs"][valid], whole["teacher_topk_log_probs"][valid], atol=1e-5)
    with pytest.raises(ValueError, match=r"log_prob_max_token_len_per_gpu=6 is smaller than a sequence of 7"):
        scorer.score(batch, None, use_dynamic_bsz=True, max_token_len=6)
    with pytest.raises(ValueError, match=r"needs a positive actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"):
        scorer.score(batch, None, use_dynamic_bsz=True, max_token_len=None)


def test_the_worker_reads_the_log_prob_batching_keys(monkeypatch):
    """``compute_teacher_log_prob`` batches as ``compute_log_prob``: dynamic bsz with its budget and no micro size,
    the micro size per GPU, or the deprecated global one ÷ world size (neither: the config loader refuses it)."""
    from types import SimpleNamespace

    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    seen = []
    teachers = SimpleNamespace(score=lambda batch, *args: seen.append(args))
    R = "actor_rollout_ref.rollout."

    def run(*overrides):
        cfg = load_config("ppo_trainer", list(overrides))
        worker = SimpleNamespace(teachers=teachers, arr=cfg.actor_rollout_ref, actor_sp=None, role="actor_rollout")
        ActorRolloutRefWorker.compute_teacher_log_prob(worker, None)
        return seen[-1]

    none = f"{R}log_prob_micro_batch_size_per_gpu=null"  # the shipped default is 16
    dynamic = (f"{R}log_prob_use_dynamic_bsz=true", f"{R}log_prob_max_token_len_per_gpu=4096")
    assert run(none, *dynamic) == (None, True, 4096)
    assert run(f"{R}log_prob_micro_batch_size_per_gpu=3")[:2] == (3, False)
    # the loader converts the deprecated global size: 8 / world size (trainer.n_gpus_per_node 2 × nnodes 1) = 4
    with pytest.warns(DeprecationWarning, match=r"log_prob_micro_batch_size_per_gpu=4 \(8 / world size 2\)"):
        assert run(none, f"{R}log_prob_micro_batch_size=8", "trainer.n_gpus_per_node=2")[:2] == (4, False)
