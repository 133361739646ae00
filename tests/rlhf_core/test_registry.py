"""The shared registry behind adv_estimator, policy loss_mode and reward_manager names."""
import pytest

from rlhf_core.algos import get_adv_estimator
from rlhf_core.registry import Registry
from rlhf_core.reward.managers import get_reward_manager_cls


def test_register_get_and_refuse_duplicates():
    reg: Registry = Registry("widget")

    @reg.register("a")
    def a():
        return 1

    reg.register("a")(a)  # the same entry again is harmless (module re-import)
    assert reg.get("a") is a and "a" in reg and reg.names() == ["a"] and len(reg) == 1
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a")(lambda: 2)
    with pytest.raises(ValueError, match=r"unknown widget 'b'; registered: \['a'\]"):
        reg.get("b")


def test_config_facing_registries_name_the_choices():
    with pytest.raises(ValueError, match=r"unknown adv_estimator 'grpoo'; registered: \[.*'grpo'"):
        get_adv_estimator("grpoo")
    with pytest.raises(ValueError, match=r"unknown reward_model.reward_manager 'nave'; registered: \[.*'naive'"):
        get_reward_manager_cls("nave")
