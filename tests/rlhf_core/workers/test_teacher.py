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
