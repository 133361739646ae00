"""GRPO through ``run_ppo`` with a generative reward model: the tiny policy's responses are judged by a tiny judge
served on 127.0.0.1 for the run, through a verl 0.9-style reward function (tests/data/genrm/genrm_reward_fn.py);
bad GenRM input is refused before Ray starts."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rlhf_core.config.errors import ConfigError
from rlhf_core.workers.genrm_server import start_genrm
from rlhf_core.trainer.tracking import read_metrics_jsonl
from tests.fixtures.genrm_fixtures import constant_judge

from test_ppo_e2e import gsm8k_parquet, ppo_config  # noqa: F401 - gsm8k_parquet is a fixture

FN = str(Path(__file__).resolve().parents[1] / "data" / "genrm" / "genrm_reward_fn.py")


def _genrm_config(model, files, out, judge, *extra):
    return ppo_config(model, files, out, "grpo", "trainer.total_training_steps=2", "trainer.test_freq=2",
                      f"custom_reward_function.path={FN}",
                      "custom_reward_function.name=compute_score_genrm",
                      "reward.reward_model.enable=True", f"reward.reward_model.model_path={judge}",
                      "reward.reward_model.rollout.name=hf", "reward.reward_model.rollout.dtype=float32", *extra)


@pytest.mark.slow
@pytest.mark.ray
def test_grpo_rewards_come_from_the_judge(tiny_model_dir, gsm8k_parquet, tmp_path, monkeypatch):  # noqa: F811
    from rlhf_core.trainer.main_ppo import run_ppo

    from rlhf_core.trainer import main_ppo

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    addresses = []  # the judge server's address, recorded when the run starts it

    def recording_start(cfg):
        server = start_genrm(cfg)
        addresses.append(server.address)
        return server

    monkeypatch.setattr(main_ppo, "start_genrm", recording_start)
    judge = constant_judge(tiny_model_dir, tmp_path / "judge")
    result = run_ppo(_genrm_config(tiny_model_dir, gsm8k_parquet, tmp_path / "run", judge))
    assert result["global_step"] == 2
    metrics = read_metrics_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
    # the judge answers "7" twelve times (max_tokens=12 in the function) and the function scores the digits: every
    # sample 12, in training and in validation; no sample failed (reward_error would be counted)
    for step in (1, 2):
        assert metrics[step]["critic/score/mean"] == metrics[step]["critic/score/min"] == 12.0
        assert metrics[step].get("reward/num_errors", 0) == 0
    assert metrics[2]["val-core/openai/gsm8k/reward/mean@2"] == 12.0
    # one judge server, on 127.0.0.1, closed when the run returned
    (address,) = addresses
    host, port = address.split(":")
    assert host == "127.0.0.1"
    with pytest.raises(OSError):  # refused: nothing listens there any more
        socket.create_connection((host, int(port)), timeout=2)


def test_bad_genrm_input_is_refused_before_ray(tiny_model_dir, gsm8k_parquet, tmp_path, monkeypatch):  # noqa: F811
    from rlhf_core.trainer import main_ppo
    from rlhf_core.trainer.main_ppo import run_ppo

    def too_late(*args, **kwargs):
        raise AssertionError("reached the judge server or Ray: the bad input was not refused first")

    monkeypatch.setattr(main_ppo, "start_genrm", too_late)
    monkeypatch.setattr(main_ppo, "init_ray", too_late)
    judge = constant_judge(tiny_model_dir, tmp_path / "judge")
    wrong = _genrm_config(tiny_model_dir, gsm8k_parquet, tmp_path / "a", judge,
                          "custom_reward_function.name=compute_score_wrong_signature")
    with pytest.raises(ConfigError, match="lacks \\['reward_router_address', 'reward_model_tokenizer'\\]"):
        run_ppo(wrong)
    missing = _genrm_config(tiny_model_dir, gsm8k_parquet, tmp_path / "b", str(tmp_path / "no_judge"))
    with pytest.raises(FileNotFoundError, match="reward_model.model.path"):
        run_ppo(missing)
