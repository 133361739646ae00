"""On-policy distillation (``distillation.*``, verl 0.9.1) in a real tiny PPO run (``run_ppo``: Ray worker groups,
FSDP2 on gloo, HF rollout), and its checks before Ray: a missing teacher, a teacher with another vocabulary.

The teacher is the tiny student's architecture with other weights (seed 7) and a final norm scaled ×30, so its
next-token distributions are peaked where the student's are near uniform: a KL the student can visibly reduce.
"""
from __future__ import annotations

import math
import shutil

import pytest

from rlhf_core.trainer.tracking import read_metrics_jsonl
from tests.fixtures.teacher_fixtures import build_teacher

from test_ppo_e2e import gsm8k_parquet, ppo_config  # noqa: F401  (gsm8k_parquet is a fixture)

D = "distillation."
DL = D + "distillation_loss."


@pytest.fixture(scope="module")
def teacher_dir(tiny_model_dir, tmp_path_factory):
    return build_teacher(tiny_model_dir, tmp_path_factory.mktemp("teacher") / "model")


def _distill(model, files, out, teacher, *extra):
    return ppo_config(model, files, out, "grpo", "trainer.test_freq=-1", "trainer.val_before_train=false",
                      "actor_rollout_ref.actor.use_kl_loss=false", f"{D}enabled=true",
                      f"{D}teacher_models.teacher_model.model_path={teacher}", *extra)


@pytest.mark.slow
@pytest.mark.ray
def test_pure_distillation_lowers_the_teacher_kl(tiny_model_dir, teacher_dir, gsm8k_parquet, tmp_path, monkeypatch):  # noqa: F811
    from rlhf_core.trainer.main_ppo import run_ppo

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    out = tmp_path / "opd"
    cfg = _distill(tiny_model_dir, gsm8k_parquet, out, teacher_dir, "trainer.total_training_steps=4",
                   f"{DL}loss_mode=forward_kl_topk", f"{DL}topk=64", f"{DL}use_task_rewards=false",
                   f"{DL}log_prob_min_clamp=-20.0", "actor_rollout_ref.actor.optim.lr=5e-2")
    assert run_ppo(cfg)["global_step"] == 4
    m = read_metrics_jsonl(str(out / "metrics.jsonl"))
    for step in (1, 4):
        assert {"distillation/loss", "distillation/loss_min", "distillation/loss_max", "distillation/student_mass",
                "distillation/teacher_mass", "distillation/overlap_ratio", "timing_s/teacher"} <= set(m[step])
        # neither use_task_rewards nor use_policy_gradient: verl computes no PPO loss at all
        assert "actor/pg_loss" not in m[step] and "distillation/pg_clipfrac" not in m[step]
        assert 0 <= m[step]["distillation/loss_min"] <= m[step]["distillation/loss"] <= m[step]["distillation/loss_max"]
        assert 0 < m[step]["distillation/teacher_mass"] <= 1 + 1e-6
    # the top-64 forward KL to the teacher (token mean over the step's responses) falls over 4 steps of distillation,
    # and the student puts more of its mass on the teacher's top tokens
    # (measured 2026-12-05, load 13: loss 5.74, 6.39, 5.10, 1.09 and student_mass 0.089, 0.066, 0.098, 0.689 over the
    # 4 steps: each step scores other samples, so the fall is not monotone step by step)
    losses = [m[s]["distillation/loss"] for s in (1, 2, 3, 4)]
    assert m[4]["distillation/loss"] < 0.8 * m[1]["distillation/loss"], losses
    assert m[4]["distillation/student_mass"] > m[1]["distillation/student_mass"]


def test_a_missing_teacher_is_refused_before_ray(tiny_model_dir, gsm8k_parquet, tmp_path):  # noqa: F811
    from rlhf_core.workers.teacher import check_teachers

    cfg = _distill(tiny_model_dir, gsm8k_parquet, tmp_path, str(tmp_path / "no_teacher"))
    # the key the user wrote, not the internal routing key ('default') of a single teacher
    with pytest.raises(FileNotFoundError,
                       match=r"^distillation\.teacher_models\.teacher_model\.model_path=.*no_teacher.*does not exist"):
        check_teachers(cfg)


def test_a_missing_added_teacher_is_named_by_its_section(tiny_model_dir, gsm8k_parquet, tmp_path):  # noqa: F811
    from rlhf_core.workers.teacher import check_teachers

    # two teachers: teacher_model is dropped (verl), the first ('gsm') loads, the second ('geo') is missing, so the
    # error must name geo's section rather than its routing key 'geo3k' or the template's section
    cfg = _distill(tiny_model_dir, gsm8k_parquet, tmp_path, str(tiny_model_dir),
                   f"+{D}teacher_models.gsm.model_path={tiny_model_dir}", f"+{D}teacher_models.gsm.key=openai/gsm8k",
                   f"+{D}teacher_models.geo.model_path={tmp_path / 'no_geo'}", f"+{D}teacher_models.geo.key=geo3k")
    with pytest.raises(FileNotFoundError, match=r"^distillation\.teacher_models\.geo\.model_path=.*no_geo"):
        check_teachers(cfg)


def test_a_teacher_with_another_vocabulary_is_refused(tiny_model_dir, gsm8k_parquet, tmp_path):  # noqa: F811
    from rlhf_core.config import ConfigError
    from rlhf_core.workers.teacher import check_teachers

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    import json

    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[100:102]  # swap two ids: the same tokens, other ids
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    cfg = _distill(tiny_model_dir, gsm8k_parquet, tmp_path, str(other))
    with pytest.raises(ConfigError, match=r"vocabulary .* differs from the student's .*same tokenizer"):
        check_teachers(cfg)


def test_rows_route_to_the_teacher_of_their_key():
    import numpy as np

    from rlhf_core.workers.teacher import route_rows

    rows = route_rows(np.array(["gsm8k", "math", "gsm8k"], dtype=object), 3, ["gsm8k", "math"], "data_source")
    assert {k: v.tolist() for k, v in rows.items()} == {"gsm8k": [0, 2], "math": [1]}
    assert route_rows(np.array(["x", "y"], dtype=object), 2, ["default"], "data_source")["default"].tolist() == [0, 1]
    assert route_rows(None, 2, ["default"], "data_source")["default"].tolist() == [0, 1]  # one teacher: no column needed
    with pytest.raises(ValueError, match=r"no distillation teacher for data_source='geo3k'.*\['gsm8k', 'math'\]"):
        route_rows(np.array(["gsm8k", "geo3k"], dtype=object), 2, ["gsm8k", "math"], "data_source")
    with pytest.raises(ValueError, match=r"the batch has no column 'data_source'"):
        route_rows(None, 2, ["gsm8k", "math"], "data_source")


def test_teacher_outputs_alignment():
    # logits of 2 positions over V = 3; sampled tokens [2, 0]: log p_T of each, and the top-2 ids/log-probs
    import torch

    from rlhf_core.workers.teacher import teacher_outputs

    logits = torch.log(torch.tensor([[[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]]]))
    out = teacher_outputs(logits, torch.tensor([[2, 0]]), None)
    assert torch.allclose(out["teacher_log_probs"], torch.log(torch.tensor([[0.5, 0.6]])))
    top = teacher_outputs(logits, torch.tensor([[2, 0]]), 2)
    assert top["teacher_topk_ids"].tolist() == [[[2, 1], [0, 2]]]
    assert torch.allclose(top["teacher_topk_log_probs"], torch.log(torch.tensor([[[0.5, 0.3], [0.6, 0.3]]])))
    with pytest.raises(ValueError, match="topk=4 exceeds the teacher's vocabulary of 3"):
        teacher_outputs(logits, torch.tensor([[2, 0]]), 4)
    assert math.isfinite(float(out["teacher_log_probs"].sum()))
