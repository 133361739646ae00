"""Config error messages never echo a secret (issue 32): a password in a URL, a token in a URL's userinfo, the
value of a secret-named override or config-file key, on every error path a user meets first (unknown key with its
did-you-mean, wrong type, bad choice, a value outside the allowed list, an unparsable override), through
``load_config`` and through the real ``rlhf config check`` command line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_core.config import ConfigError, load_config
from rlhf_core.redact import redact_text

PASSWORD = "hunter2-Pa55w0rd"
TOKEN = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"

CASES = {  # override -> a fragment the message must still carry (the key, the rule), with the secret redacted
    "unknown key, did you mean": (f"trainer.default_local_dri=s3://ci-user:{PASSWORD}@bucket/ckpt",
                                  "Did you mean 'trainer.default_local_dir'?", "s3://ci-user:***@bucket/ckpt"),
    "wrong type": (f"data.train_batch_size=http://ci-user:{PASSWORD}@host/x",
                   "expected int, got str", "http://ci-user:***@host/x"),
    "bad choice": (f"algorithm.adv_estimator=https://{TOKEN}@github.com/org/repo",
                   "is not one of ['gae', 'gdpo', 'gpg', 'grpo'", "https://***@github.com/org/repo"),  # registered names, sorted
    "not among the allowed values": (f"trainer.logger=[console,'http://u:{PASSWORD}@mlflow:5000']",
                                     "not among the allowed values", "http://u:***@mlflow:5000"),
    "unsupported engine": (f"actor_rollout_ref.rollout.name=s3://u:{PASSWORD}@h", "accepted: ['hf', 'vllm']",
                           "s3://u:***@h"),
    "a sweep refused": (f"trainer.total_epochs=http://u:{PASSWORD}@h,x", "is a Hydra sweep", "http://u:***@h,x"),
    "a delete that does not match": (f"~trainer.total_epochs=http://u:{PASSWORD}@h", "its value is 30",
                                     "not 'http://u:***@h'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_messages_redact_url_passwords_and_tokens(case):
    override, rule, shown = CASES[case]
    with pytest.raises(ConfigError) as info:
        load_config("ppo_trainer", [override])
    msg = str(info.value)
    assert PASSWORD not in msg and TOKEN not in msg
    assert rule in msg and shown in msg  # still names the key, the rule and the (redacted) value


def test_secret_named_values_are_not_echoed_by_a_later_error():
    # the dict value sets reward_kwargs.api_key; the same text then reaches an error about another key
    secret = "sk-live-4242424242"
    with pytest.raises(ConfigError) as info:
        load_config("ppo_trainer", [f"custom_reward_function.reward_kwargs={{api_key: {secret}}}",
                                    f"data.train_batch_size=[{secret}]"])
    assert secret not in str(info.value) and "data.train_batch_size=['***']: expected int" in str(info.value)


def test_secrets_of_a_config_file_are_not_echoed(tmp_path):
    secret = "file-secret-7777777"
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(f"custom_reward_function:\n  reward_kwargs:\n    password: {secret}\n"
                    f"trainer:\n  project_name: [{secret}]\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert secret not in str(info.value) and "trainer.project_name" in str(info.value)


def test_rlhf_config_check_prints_one_redacted_line(tmp_path):
    rlhf = str(Path(sys.executable).parent / "rlhf")
    proc = subprocess.run([rlhf, "config", "check", "actor_rollout_ref.rollout.name=hf",
                           f"trainer.default_local_dri=s3://ci-user:{PASSWORD}@bucket/ckpt"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1 and PASSWORD not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("rlhf config: error: Unknown config key 'trainer.default_local_dri'.")
    assert "s3://ci-user:***@bucket/ckpt" in proc.stderr and "Traceback" not in proc.stderr


def test_url_userinfo_rule():
    assert redact_text(f"https://{TOKEN}@github.com/o/r.git") == "https://***@github.com/o/r.git"
    assert redact_text(f"redis://:{PASSWORD}@cache:6379/0") == "redis://:***@cache:6379/0"
    assert redact_text("ssh://git@github.com/o/r.git") == "ssh://git@github.com/o/r.git"  # a user name, kept
