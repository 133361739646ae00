"""The ``distillation`` section's checks when the config loads (rlhf_core/config/distillation.py; verl 0.9.1
``verl/workers/config/distillation.py``): each bad input is refused naming its key and value, before any model."""
from __future__ import annotations

import pytest

from rlhf_core.config import ConfigError, load_config
from rlhf_core.config.distillation import LOSS_MODES, resolve_teachers, template_path

D = "distillation."
T0 = D + "teacher_models.teacher_model."
ON = [f"{D}enabled=true", f"{T0}model_path=/models/teacher"]


def _load(*overrides):
    return load_config("ppo_trainer", list(overrides))


def test_loss_modes_are_the_registered_ones():
    from rlhf_core.algos.distillation import LOSS_MODES as REGISTERED

    assert LOSS_MODES == REGISTERED


@pytest.mark.parametrize("overrides,message", [
    ([f"{D}enabled=true"], r"teacher_model.model_path must be set"),
    ([*ON, f"{D}distillation_loss.loss_mode=reverse_kl_topk"],
     r"loss_mode='reverse_kl_topk' is not one of \['forward_kl_topk', 'kl', 'k1'"),
    ([*ON, f"{D}distillation_loss.loss_mode=k1"], r"loss_mode=k1 needs use_policy_gradient=True"),
    ([*ON, f"{D}distillation_loss.policy_loss_mode=gspo"], r"policy_loss_mode='gspo' is not one of \['vanilla'\]"),
    ([*ON, f"{D}distillation_loss.loss_mode=forward_kl_topk", f"{D}distillation_loss.topk=0"], r"topk=0 must be >= 1"),
    # verl: the teacher's context must hold the student's prompt, its response and one generated token
    ([*ON, "actor_rollout_ref.rollout.prompt_length=64", "actor_rollout_ref.rollout.response_length=32",
      f"{T0}inference.max_model_len=96"], r"max_model_len=96 leaves no room .* 64 \+ response_length 32 \+ 1 = 97"),
    ([f"{D}enabled=true", f"+{D}teacher_models.a.model_path=/m/a", f"+{D}teacher_models.b.model_path=/m/b",
      f"+{D}teacher_models.b.key=math"], r"teacher_models.a.key must be set with several teachers"),
    ([f"{D}enabled=true", f"+{D}teacher_models.a.model_path=/m/a", f"+{D}teacher_models.a.key=math",
      f"+{D}teacher_models.b.model_path=/m/b", f"+{D}teacher_models.b.key=math"],
     r"teacher_models.b.key='math' is also distillation.teacher_models.a.key"),
    ([f"+{D}teacher_models.a.modl_path=/m/a"], r"Unknown config key 'distillation.teacher_models.a.modl_path'. Did you "
                                                r"mean 'distillation.teacher_models.teacher_model.model_path'"),
    ([f"+{D}teacher_models.a.inference.temperature=hot"], r"teacher_models.a.inference.temperature='hot'"),
])
def test_bad_input_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _load(*overrides)


def test_max_model_len_with_room_passes():
    cfg = _load(*ON, "actor_rollout_ref.rollout.prompt_length=64", "actor_rollout_ref.rollout.response_length=32",
                f"{T0}inference.max_model_len=97")
    assert list(resolve_teachers(cfg)) == ["default"]


def test_added_teachers_replace_teacher_model_and_take_its_defaults():
    # verl pops teacher_model once other entries exist; an added entry's unset keys take teacher_model's declared
    # defaults, those following the rollout's keys resolved (dtype follows rollout.dtype)
    cfg = _load(f"{D}enabled=true", "actor_rollout_ref.rollout.dtype=float16", f"{T0}model_path=/ignored",
                f"+{D}teacher_models.gsm.model_path=/m/gsm", f"+{D}teacher_models.gsm.key=openai/gsm8k",
                f"+{D}teacher_models.geo.model_path=/m/geo", f"+{D}teacher_models.geo.key=geo3k",
                f"+{D}teacher_models.geo.inference.dtype=bfloat16")
    teachers = resolve_teachers(cfg)
    assert {k: (t.model_path, t.inference.dtype) for k, t in teachers.items()} == {
        "openai/gsm8k": ("/m/gsm", "float16"), "geo3k": ("/m/geo", "bfloat16")}
    assert template_path(f"{D}teacher_models.gsm.inference.dtype") == f"{T0}inference.dtype"
    assert template_path(f"{T0}key") is None and template_path("trainer.nnodes") is None


def test_added_teachers_in_a_user_file(tmp_path):
    # the same named entries written in a user's YAML file (verl's mopd layout) instead of '+' overrides
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text("distillation:\n  enabled: true\n  teacher_models:\n    gsm:\n      key: openai/gsm8k\n"
                    "      model_path: /m/gsm\n    geo:\n      key: geo3k\n      model_path: /m/geo\n"
                    "      inference:\n        dtype: float32\n")
    teachers = resolve_teachers(load_config(str(path)))
    assert {k: (t.model_path, t.inference.dtype) for k, t in teachers.items()} == {
        "openai/gsm8k": ("/m/gsm", "bfloat16"), "geo3k": ("/m/geo", "float32")}  # rollout.dtype's default: bfloat16
