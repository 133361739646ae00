"""verl 0.9.1's legacy reward-loop keys ``reward_model.reward_loop_source`` / ``reward_loop_module_path`` /
``reward_loop_class_name`` (verl ``migrate_legacy_reward_impl``: moved over ``reward.reward_manager``)."""
from __future__ import annotations

import pytest

from tests.rlhf_core.reward.test_reward_verl09 import _batch, _file

from rlhf_core.config import load_config
from rlhf_core.config.errors import ConfigError
from rlhf_core.reward import load_reward_manager

LOOPS = """
    from rlhf_core.reward.managers import NaiveRewardManager

    class QuarterLoop(NaiveRewardManager):
        def score_samples(self, samples):
            return [0.25 for _ in samples]

    class NotAManager:
        def score(self, batch):
            return 0.0
"""
SRC = "reward_model.reward_loop_source"


def _load(*overrides):
    return load_config("ppo_trainer", ["actor_rollout_ref.rollout.name=hf", *overrides])


def test_importlib_loads_the_class_named_by_reward_loop_class_name(tmp_path):
    path = _file(tmp_path, "loops.py", LOOPS)
    cfg = _load(f"{SRC}=importlib", f"reward_model.reward_loop_module_path={path}",
                "reward_model.reward_loop_class_name=QuarterLoop")
    tok, batch = _batch(3)
    manager = load_reward_manager(cfg, tok)
    assert type(manager).__name__ == "QuarterLoop"
    assert manager(batch).sum().item() == pytest.approx(0.75)  # 3 samples × 0.25, not the naive scorer's
    # verl 0.9.1's own spelling: the class named by reward_model.reward_manager (class_name null) loads the same
    cfg = _load(f"{SRC}=importlib", f"reward_model.reward_loop_module_path={path}",
                "reward_model.reward_manager=QuarterLoop")
    assert type(load_reward_manager(cfg, tok)).__name__ == "QuarterLoop"
    # register: the registry's reward_model.reward_manager, over reward.reward_manager.source=importlib
    cfg = _load(f"{SRC}=register", "reward.reward_manager.source=importlib",
                f"reward.reward_manager.module.path={path}", "reward_model.reward_manager=dapo")
    assert type(load_reward_manager(cfg, tok)).__name__ == "DAPORewardManager"


def test_bad_reward_loops_are_refused_naming_the_key(tmp_path):
    tok, _ = _batch(1)
    with pytest.raises(ConfigError, match=f"{SRC}=importlib needs reward_model.reward_loop_module_path"):
        _load(f"{SRC}=importlib")
    with pytest.raises(ConfigError, match=rf"{SRC}='imports' is not one of \['register', 'importlib'\]"):
        _load(f"{SRC}=imports")
    missing = _load(f"{SRC}=importlib", f"reward_model.reward_loop_module_path={tmp_path / 'nope.py'}")
    with pytest.raises(FileNotFoundError, match="reward_model.reward_loop_module_path: no such file .*nope.py"):
        load_reward_manager(missing, tok)
    missing.reward_model.reward_loop_module_path = _file(tmp_path, "loops.py", LOOPS)
    for name, error, message in (
            ("Missing", AttributeError, "reward_model.reward_loop_class_name='Missing': .*loops.py' has no class"),
            ("NotAManager", TypeError, "reward_model.reward_loop_class_name='NotAManager': class NotAManager in "
                                       ".*loops.py' has no __call__")):
        missing.reward_model.reward_loop_class_name = name
        with pytest.raises(error, match=message):
            load_reward_manager(missing, tok)
