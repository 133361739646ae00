"""status06_effects.yaml, the data behind EFFECT06: how it is read and the errors a bad entry gives."""
from __future__ import annotations

import pytest

from rlhf_core.config.status06 import EFFECT06, NO_EFFECT_ON_CPU, NO_EFFECT_YET, load_effects


def test_each_key_gets_its_group_status_and_reason(tmp_path):
    path = tmp_path / "effects.yaml"
    path.write_text(f"{NO_EFFECT_YET}:\n  \"one reason: two keys\":\n    - a.b\n    - a.c\n"
                    f"{NO_EFFECT_ON_CPU}:\n  CUDA only:\n    - d\n")
    assert load_effects(path) == {"a.b": (NO_EFFECT_YET, "one reason: two keys"),
                                  "a.c": (NO_EFFECT_YET, "one reason: two keys"), "d": (NO_EFFECT_ON_CPU, "CUDA only")}
    # the shipped file: one entry per key, spot-checked (the key list itself: test_config_verl06.py)
    assert EFFECT06["actor_rollout_ref.rollout.gpu_memory_utilization"][0] == NO_EFFECT_ON_CPU
    assert EFFECT06["critic.model.fsdp_config.use_orig_params"] == (
        NO_EFFECT_YET, "an FSDP1 option; FSDP2 has no flat parameters")


@pytest.mark.parametrize("text, message", [
    ("supported:\n  why:\n    - a\n", "status 'supported' is not"),
    (f"{NO_EFFECT_YET}:\n  why: a\n", "needs a list of keys, got 'a'"),
    (f"{NO_EFFECT_YET}:\n  one:\n    - a\n  two:\n    - a\n", "a is listed twice \\('one' and 'two'\\)"),
])
def test_a_bad_entry_names_the_file_and_the_entry(tmp_path, text, message):
    path = tmp_path / "effects.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"effects.yaml: .*{message}"):
        load_effects(path)
