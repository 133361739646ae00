"""Choices that name a registry come from the registry when the config is checked: a user's estimator and policy
loss, registered from a file named in ``trainer.extensions``, are accepted by name; an unregistered name is refused
with did-you-mean; the built-in names are exactly the registered ones."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from rlhf_core.config import ConfigError, load_config
from rlhf_core.config.notices import ConfigNotice
from rlhf_core.config.schema import specs
from tests.paths import REPO

ROOT = REPO
EXTENSION = textwrap.dedent('''
    import torch
    from rlhf_core.algos import register_adv_est, register_policy_loss

    @register_adv_est("my_centered")
    def my_centered(token_level_rewards, response_mask, **kwargs):
        """Sequence score minus the batch mean, on every response token."""
        scores = (token_level_rewards * response_mask).sum(-1)
        adv = (scores - scores.mean()).unsqueeze(-1) * response_mask
        return adv, adv

    @register_policy_loss("my_reinforce")
    def my_reinforce(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                     rollout_is_weights=None):
        """REINFORCE: -A * log pi, token mean."""
        loss = -(advantages * log_prob * response_mask).sum() / response_mask.sum()
        zero = torch.tensor(0.0)
        return loss, zero, zero, zero
''')


def _check(args: list[str]) -> subprocess.CompletedProcess:
    # a fresh process, as a user runs it: nothing registered but the built-ins and the extension file
    code = "from rlhf_core.config.cli import main; raise SystemExit(main(" + repr(["check", *args]) + "))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT)


def test_a_user_file_registers_an_estimator_and_a_loss_that_config_check_accepts(tmp_path):
    ext = tmp_path / "my_algos.py"
    ext.write_text(EXTENSION)
    names = ["algorithm.adv_estimator=my_centered", "actor_rollout_ref.actor.policy_loss.loss_mode=my_reinforce",
             "actor_rollout_ref.rollout.name=hf"]
    ok = _check([f"trainer.extensions=[{ext}]", *names])
    assert ok.returncode == 0, ok.stderr
    assert "OK: ppo_trainer is valid" in ok.stderr
    # without the file, the same names are unknown: refused with the registered names listed
    refused = _check(names)
    assert refused.returncode == 1
    assert "algorithm.adv_estimator='my_centered' is not one of" in refused.stderr
    assert "actor_rollout_ref.actor.policy_loss.loss_mode='my_reinforce' is not one of" in refused.stderr


def test_an_unregistered_name_is_refused_with_did_you_mean():
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator='grpo_vectorised' is not one of \[.*'grpo'.*\]\. "
                                          r"Did you mean 'grpo_vectorized'\?"):
        load_config("ppo_trainer", ["algorithm.adv_estimator=grpo_vectorised"])


def test_registry_choices_are_the_registered_names():
    from rlhf_core.algos import registered_adv_estimators, registered_policy_losses
    from rlhf_core.reward.loader import registered_reward_managers

    ppo = specs("ppo_trainer")
    assert ppo["algorithm.adv_estimator"].choice_values() == tuple(registered_adv_estimators())
    assert ppo["actor_rollout_ref.actor.policy_loss.loss_mode"].choice_values() == tuple(registered_policy_losses())
    # batch is registered (verl's BatchRewardManager), so config check now accepts it
    assert ppo["reward_model.reward_manager"].choice_values() == tuple(registered_reward_managers())
    assert "batch" in registered_reward_managers()
    assert load_config("ppo_trainer", ["reward_model.reward_manager=batch"]).reward_model.reward_manager == "batch"


def test_a_missing_or_failing_extension_names_the_key_and_file(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.extensions: no such file .*nope\.py"):
        load_config("ppo_trainer", [f"trainer.extensions=[{tmp_path / 'nope.py'}]"])
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('broken on purpose')\n")
    with pytest.raises(ConfigError, match=r"trainer.extensions: running .*bad\.py.* RuntimeError: broken on purpose"):
        load_config("ppo_trainer", [f"trainer.extensions=[{bad}]"])


def test_verl_09_spelling_of_a_key_is_read_as_the_key_with_one_notice(tmp_path):
    # declared once, beside the key: custom_reward_function.path aliases=("reward.custom_reward_function.path",)
    with pytest.warns(ConfigNotice) as notices:
        cfg = load_config("ppo_trainer", ["reward.custom_reward_function.path=/r.py",
                                          "+reward.custom_reward_function.reward_kwargs.w=2",
                                          "reward.reward_manager.name=dapo"])
    assert (cfg.custom_reward_function.path, cfg.custom_reward_function.reward_kwargs.w,
            cfg.reward_model.reward_manager) == ("/r.py", 2, "dapo")
    said = [str(n.message) for n in notices if issubclass(n.category, ConfigNotice)]
    assert len(said) == 3
    assert said[0].startswith("reward.custom_reward_function.path (override) is read as custom_reward_function.path")
    # the same in a user file; both spellings with different values is one error naming both
    user = tmp_path / "ppo_trainer.yaml"
    user.write_text("reward:\n  custom_reward_function:\n    name: my_score\n")
    with pytest.warns(ConfigNotice, match=r"reward.custom_reward_function.name \(.*ppo_trainer.yaml\) is read as "
                                          r"custom_reward_function.name"):
        assert load_config(str(user)).custom_reward_function.name == "my_score"
    user.write_text("reward:\n  custom_reward_function:\n    name: a\ncustom_reward_function:\n  name: b\n")
    with pytest.raises(ConfigError, match="reward.custom_reward_function.name='a' and custom_reward_function.name='b' "
                                          "are two spellings of one key"):
        load_config(str(user))
    assert specs("ppo_trainer")["custom_reward_function.path"].aliases == ("reward.custom_reward_function.path",)


def test_both_spellings_as_overrides_with_different_values_is_one_error():
    with pytest.raises(ConfigError, match=r"reward.custom_reward_function.path='/a.py' and "
                                          r"custom_reward_function.path='/b.py' are two spellings of one key"):
        load_config("ppo_trainer", ["reward.custom_reward_function.path=/a.py", "custom_reward_function.path=/b.py"])
    # the same value twice is no conflict
    assert load_config("ppo_trainer", ["reward.custom_reward_function.path=/a.py",
                                       "custom_reward_function.path=/a.py"]).custom_reward_function.path == "/a.py"


@pytest.mark.parametrize("body, message", [
    ("raise RuntimeError('broken on purpose')\n", r"running '.*bad\.py' failed \(line 1 of .*bad\.py\): RuntimeError: "
                                                  r"broken on purpose"),
    ("import sys\nsys.exit(3)\n", r"running '.*bad\.py' failed \(line 2 of .*bad\.py\): SystemExit: 3"),
    ("from rlhf_core.algos import register_adv_est\nregister_adv_est('grpo')(lambda **kw: None)\n",
     r"ValueError: adv_estimator 'grpo' is already registered to <function compute_grpo_outcome_advantage>$"),
])
def test_an_extension_that_fails_is_named_with_its_line(tmp_path, body, message):
    bad = tmp_path / "bad.py"
    bad.write_text(body)
    with pytest.raises(ConfigError, match=message):
        load_config("ppo_trainer", [f"trainer.extensions=[{bad}]"])


def test_a_single_extension_path_is_refused_with_the_list_spelling(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.extensions='/x/my_algos.py': expected a list of Python files, "
                                          r"e.g. trainer.extensions=\[/x/my_algos.py\]"):
        load_config("ppo_trainer", ["trainer.extensions=/x/my_algos.py"])
