"""verl 0.9's ``reward.*`` section: every leaf accepted (aliases of the 0.6 keys or keys of their own), the
``remote`` (scoring in reward.num_workers processes) and ``rate_limited`` managers, and reward managers loaded
by file (``reward.reward_manager.source=importlib``)."""
from __future__ import annotations

import os
import textwrap
import threading
import time

import pytest
from omegaconf import OmegaConf

from tests.fixtures.config_fixtures import typed_config
from tests.fixtures.reward_fixtures import CharTokenizer, make_batch
from rlhf_core.config import load_config
from rlhf_core.config.errors import ConfigError
from rlhf_core.reward import load_reward_manager
from rlhf_core.reward.rate_limited import RateLimitedRewardManager, TokenBucket

# verl 0.9.1 _generated_ppo_trainer.yaml `reward:` leaves (reward_model.rollout.* aside) -> where each is read here
VERL09_REWARD_LEAVES = {
    "reward.num_workers": ("reward.num_workers", 3),
    "reward.custom_reward_function.path": ("custom_reward_function.path", "/x/r.py"),
    "reward.custom_reward_function.name": ("custom_reward_function.name", "score_fn"),
    "reward.reward_manager.source": ("reward.reward_manager.source", "register"),
    "reward.reward_manager.name": ("reward_model.reward_manager", "rate_limited"),
    "reward.reward_manager.module.path": ("reward.reward_manager.module.path", "/x/m.py"),
    "reward.reward_manager.module.name": ("reward.reward_manager.module.name", "my_managers"),
    "reward.reward_model.enable": ("reward_model.enable", False),
    "reward.reward_model.enable_resource_pool": ("reward_model.enable_resource_pool", False),
    "reward.reward_model.n_gpus_per_node": ("reward_model.n_gpus_per_node", 2),
    "reward.reward_model.nnodes": ("reward_model.nnodes", 1),
    "reward.reward_model.model_path": ("reward_model.model.path", "/x/rm"),
    "reward.sandbox_fusion.url": ("reward_model.sandbox_fusion.url", None),
    "reward.sandbox_fusion.max_concurrent": ("reward_model.sandbox_fusion.max_concurrent", 8),
    "reward.sandbox_fusion.memory_limit_mb": ("reward_model.sandbox_fusion.memory_limit_mb", 512),
}


def _value(v):
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


@pytest.mark.filterwarnings("ignore")
def test_every_verl09_reward_leaf_is_accepted_and_read_where_it_acts():
    overrides = [f"{k}={_value(v)}" for k, (_, v) in VERL09_REWARD_LEAVES.items()]
    cfg = load_config("ppo_trainer", overrides + ["actor_rollout_ref.rollout.name=hf"])
    for given, (read_as, value) in VERL09_REWARD_LEAVES.items():
        assert OmegaConf.select(cfg, read_as) == value, given
    # the 0.6 keys keep their reference defaults when the 0.9 spelling is not used
    base = typed_config("ppo_trainer")
    assert base.reward_model.n_gpus_per_node == 0 and base.reward.num_workers == 8
    assert base.reward.reward_manager.source == "register" and base.reward.max_concurrent == 1


@pytest.mark.filterwarnings("ignore")
def test_reward_section_bad_values_are_named():
    with pytest.raises(ConfigError, match=r"reward.reward_manager.source=importlib needs "
                                          r"reward.reward_manager.module.path"):
        load_config("ppo_trainer", ["reward.reward_manager.source=importlib", "actor_rollout_ref.rollout.name=hf"])
    with pytest.raises(ConfigError, match=r"reward.max_rpm=0 must be > 0"):
        load_config("ppo_trainer", ["reward.max_rpm=0", "actor_rollout_ref.rollout.name=hf"])
    with pytest.raises(ConfigError, match=r"reward_model.reward_manager='Mine' is not one of"):
        load_config("ppo_trainer", ["reward.reward_manager.name=Mine", "actor_rollout_ref.rollout.name=hf"])


@pytest.mark.parametrize("name", ["batch", "remote", "rate_limited"])
def test_config_check_accepts_the_builtin_managers(name, capsys):
    from rlhf_cli import main

    assert main(["config", "check", "actor_rollout_ref.rollout.name=hf", f"reward.reward_manager.name={name}"]) == 0
    captured = capsys.readouterr()
    assert "OK: ppo_trainer is valid" in captured.out + captured.err


def test_token_bucket_schedule_on_a_fake_clock():
    now = [0.0]
    bucket = TokenBucket(rate=2.0, capacity=2.0, clock=lambda: now[0])
    # full at the start: 2 stored tokens, then each further one 1/rate = 0.5 s after the previous
    assert [bucket.reserve() for _ in range(4)] == [0.0, 0.0, 0.5, 1.0]
    now[0] = 1.0  # balance −2 + 1 s × 2/s = 0 → the next waits 0.5 s
    assert bucket.reserve() == 0.5
    now[0] = 10.0  # refilled to the capacity (2), not beyond
    assert bucket.reserve(2.0) == 0.0 and bucket.reserve(1.0) == 0.5
    with pytest.raises(ValueError, match="rate > 0"):
        TokenBucket(0.0, 1.0)


def _file(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def _batch(n):
    tok = CharTokenizer()
    return tok, make_batch(tok, ["q"] * n, [f"r{i}" for i in range(n)], ["1"] * n, ["d"] * n)


def _cfg(tmp_path, scorer_source, **reward):
    cfg = typed_config("ppo_trainer")
    cfg.custom_reward_function.path = _file(tmp_path, "scorer.py", scorer_source)
    cfg.reward_model.reward_manager = reward.pop("manager")
    for k, v in reward.items():
        cfg.reward[k] = v
    return cfg


@pytest.mark.parametrize("limits", [{"max_rpm": 120},  # 2 calls per second
                                    {"max_tpm": 6000, "estimated_tokens_per_request": 50}])  # 100 tokens/s ÷ 50
def test_rate_limited_spaces_calls_by_max_rpm_or_max_tpm(tmp_path, limits):
    cfg = _cfg(tmp_path, """
        import time
        STARTS = []
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            STARTS.append(time.monotonic())
            return 0.5
    """, manager="rate_limited", max_concurrent=8, **limits)
    tok, batch = _batch(5)
    manager = load_reward_manager(cfg, tok)
    out = manager(batch, return_dict=True)
    starts = sorted(manager.compute_score._fn.__globals__["STARTS"])
    offsets = [t - starts[0] for t in starts]
    # 2 calls per second, burst of one second's worth (2): calls start at 0, 0, 0.5, 1.0, 1.5 s
    assert offsets[1] < 0.1
    for k, expected in ((2, 0.5), (3, 1.0), (4, 1.5)):
        assert expected - 0.02 <= offsets[k] < expected + 0.3, (k, offsets)
    assert out["reward_tensor"].sum().item() == pytest.approx(2.5)  # 5 × 0.5
    assert out["reward_extra_info"]["acc"] == [0.5] * 5  # a plain number is also the acc extra (verl)


def test_rate_limited_caps_concurrency_and_times_out(tmp_path):
    cfg = _cfg(tmp_path, """
        import threading, time
        LOCK, STATE = threading.Lock(), {"running": 0, "peak": 0}
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            with LOCK:
                STATE["running"] += 1
                STATE["peak"] = max(STATE["peak"], STATE["running"])
            time.sleep(2.0 if solution_str == "r5" else 0.2)
            with LOCK:
                STATE["running"] -= 1
            return {"score": 1.0, "judge": solution_str}
    """, manager="rate_limited", max_concurrent=2, timeout=0.8)
    tok, batch = _batch(6)
    manager = load_reward_manager(cfg, tok)
    started = time.monotonic()
    out = manager(batch, return_dict=True)
    took = time.monotonic() - started
    state = manager.compute_score._fn.__globals__["STATE"]
    assert state["peak"] == 2  # never more than max_concurrent at once
    # 5 calls of 0.2 s two at a time plus r5 cut at 0.8 s: at least 0.2 × 2 + 0.8 = 1.2 s, well under r5's 2 s
    assert 1.15 <= took < 1.9
    extra = out["reward_extra_info"]
    assert extra["reward_error"] == [0, 0, 0, 0, 0, 1] and extra["judge"][:2] == ["r0", "r1"]
    assert out["reward_tensor"].sum().item() == 5.0  # r5 timed out → 0


def test_rate_limited_awaits_an_async_scorer():
    async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return float(len(solution_str))

    tok, batch = _batch(2)
    manager = RateLimitedRewardManager(tok, compute_score=compute_score, max_concurrent=2)
    assert manager(batch).sum().item() == 4.0  # "r0", "r1": 2 characters each


@pytest.mark.slow  # spawns 2 worker processes: 7.5 s at load average 8 on 2 cores
def test_remote_scores_in_num_workers_other_processes(tmp_path):
    cfg = _cfg(tmp_path, """
        import os
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return float(os.getpid())
    """, manager="remote", num_workers=2)
    tok, batch = _batch(6)
    manager = load_reward_manager(cfg, tok)
    try:
        assert manager.num_processes == 2
        out = manager(batch, return_dict=True)
    finally:
        manager.close()
    pids = {int(p) for p in out["reward_extra_info"]["acc"]}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


def test_importlib_source_loads_the_manager_class_from_a_file(tmp_path):
    path = _file(tmp_path, "managers.py", """
        from rlhf_core.reward.managers import NaiveRewardManager

        class ConstantManager(NaiveRewardManager):
            def score_samples(self, samples):
                return [0.25 for _ in samples]
    """)
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.rollout.name=hf", "reward.reward_manager.source=importlib",
                                      "reward.reward_manager.name=ConstantManager",
                                      f"reward.reward_manager.module.path={path}"])
    tok, batch = _batch(3)
    manager = load_reward_manager(cfg, tok)
    assert type(manager).__name__ == "ConstantManager"
    assert manager(batch).sum().item() == pytest.approx(0.75)
    cfg.reward_model.reward_manager = "Missing"
    with pytest.raises(AttributeError, match="'Missing'.*has no class of that name"):
        load_reward_manager(cfg, tok)


def test_batch_manager_without_a_custom_function_scores_with_the_builtin_scorers():
    tok = CharTokenizer()
    batch = make_batch(tok, ["q", "q"], ["#### 7", "#### 8"], ["7", "7"], ["openai/gsm8k"] * 2)
    cfg = typed_config("ppo_trainer")
    cfg.reward_model.reward_manager = "batch"
    # the gsm8k scorer one sample at a time: "#### 7" is right (1.0 on its last token, index 6), "#### 8" wrong (0)
    reward = load_reward_manager(cfg, tok)(batch)
    assert reward[0, 6] == 1.0 and reward.sum() == 1.0


def test_reward_model_num_workers_replaces_reward_num_workers():
    # verl 0.9.1's reward loop: a set reward_model.num_workers is moved over reward.num_workers
    from rlhf_core.reward.remote import RemoteRewardManager

    cfg = typed_config("ppo_trainer", "reward.num_workers=3")
    assert RemoteRewardManager.config_kwargs(cfg) == {"num_processes": 3}  # null: reward.num_workers
    cfg = typed_config("ppo_trainer", "reward.num_workers=3", "reward_model.num_workers=5")
    assert RemoteRewardManager.config_kwargs(cfg) == {"num_processes": 5}
