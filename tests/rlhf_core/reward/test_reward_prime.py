"""The prime reward manager: process pool, per-sample timeout, crash containment, same scores as naive."""
from __future__ import annotations

import textwrap
import time

import pytest
import torch

from rlhf_core.reward import NaiveRewardManager, PrimeRewardManager, load_custom_reward_function
from rlhf_core.reward.pool import ScorerPool

from tests.fixtures.reward_fixtures import CharTokenizer, make_batch

SCORER = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(10_000)           # never returns within any sane timeout
    if solution_str == "crash":
        raise RuntimeError("scorer bug")
    if solution_str == "die":
        os._exit(7)                  # the worker process itself disappears
    if solution_str.startswith("sleep"):
        time.sleep(float(solution_str[5:]))
        return 1.0
    return {"score": float(solution_str == ground_truth), "acc": solution_str == ground_truth}
"""


@pytest.fixture()
def scorer(tmp_path):
    path = tmp_path / "scorer.py"
    path.write_text(textwrap.dedent(SCORER))
    return load_custom_reward_function(str(path))


def test_prime_contains_hang_crash_and_death(scorer):
    tok = CharTokenizer()
    responses = ["a", "hang", "crash", "b", "die", "a"]
    batch = make_batch(tok, ["p"] * 6, responses, ["a"] * 6, ["src"] * 6)
    manager = PrimeRewardManager(tok, compute_score=scorer, timeout_s=2.0, num_processes=2)
    try:
        start = time.monotonic()
        out = manager(batch, return_dict=True)
        elapsed = time.monotonic() - start
        # The hung sample is killed after 2 s; worker start-up (spawn) takes ~1 s each, and the dead worker is
        # replaced once. 30 s is far below "hung forever" yet safe on a loaded 2-core machine.
        assert elapsed < 30.0
        reward = out["reward_tensor"]
        # "a" + EOS = 2 valid tokens → the score sits at index 1; only rows 0 and 5 are right.
        expected = torch.zeros(6, 40)
        expected[0, 1] = expected[5, 1] = 1.0
        assert torch.equal(reward, expected)
        info = out["reward_extra_info"]
        assert info["reward_timeout"] == [0, 1, 0, 0, 0, 0]
        assert info["reward_error"] == [0, 0, 1, 0, 1, 0]  # the exception and the dead worker
        assert info["score"] == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        assert info["acc"] == [True, None, None, False, None, True]
        assert (manager.num_timeouts, manager.num_errors) == (1, 2)
        # the pool survives: a second call on healthy samples reuses it and counters accumulate only on failures
        again = manager(make_batch(tok, ["p"], ["a"], ["a"], ["src"]), return_dict=True)
        assert again["reward_tensor"][0, 1] == 1.0 and (manager.num_timeouts, manager.num_errors) == (1, 2)
    finally:
        manager.close()


def test_prime_matches_naive_on_default_scorer():
    tok = CharTokenizer()
    batch = make_batch(tok, ["q"] * 4, ["#### 7", "#### 8", "x", "#### 1,000"], ["7", "7", "7", "1000"],
                       ["openai/gsm8k"] * 4)
    prime = PrimeRewardManager(tok, timeout_s=60.0, num_processes=2)
    try:
        fast = prime(batch, return_dict=True)
    finally:
        prime.close()
    slow = NaiveRewardManager(tok)(batch, return_dict=True)
    assert torch.equal(fast["reward_tensor"], slow["reward_tensor"])
    assert fast["reward_tensor"].sum() == 2.0  # rows 0 and 3 are right
    assert fast["reward_extra_info"]["reward_timeout"] == [0, 0, 0, 0]


def test_unpicklable_scorer_is_refused():
    with pytest.raises(TypeError, match="picklable"):
        ScorerPool(lambda **kw: 1.0, num_processes=1, timeout_s=1.0)
    with pytest.raises(ValueError):
        ScorerPool(load_custom_reward_function, num_processes=0)


def test_prime_configured_through_reward_kwargs():
    from tests.fixtures.config_fixtures import typed_config

    from rlhf_core.reward import load_reward_manager

    cfg = typed_config("ppo_trainer", "reward_model.reward_manager=prime",
                       "reward_model.reward_kwargs={timeout_s: 5, num_processes: 3}")
    manager = load_reward_manager(cfg, CharTokenizer(), num_examine=1, num_processes=1)
    assert isinstance(manager, PrimeRewardManager)
    assert manager.timeout_s == 5.0 and manager.num_processes == 1  # keyword arguments override reward_kwargs
    assert manager.reward_fn_key == "data_source" and manager._pool is None  # no process started until a call


def test_prime_manager_pickles_without_its_pool(scorer):
    import pickle

    tok = CharTokenizer()
    manager = PrimeRewardManager(tok, compute_score=scorer, timeout_s=30.0, num_processes=1)
    try:
        manager(make_batch(tok, ["p"], ["a"], ["a"], ["src"]))
        assert manager._pool is not None
        clone = pickle.loads(pickle.dumps(manager))  # e.g. shipped to a Ray actor
        assert clone._pool is None and clone.timeout_s == 30.0
        assert clone(make_batch(tok, ["p"], ["b"], ["b"], ["src"]))[0, 1] == 1.0  # starts its own pool
        clone.close()
    finally:
        manager.close()


def _kw(responses):
    return [dict(data_source="src", solution_str=r, ground_truth="a", extra_info=None) for r in responses]


def test_pool_hung_sample_times_out_others_scored(scorer):
    pool = ScorerPool(scorer, num_processes=2, timeout_s=3.0)
    try:
        start = time.monotonic()
        results, statuses = pool.map(_kw(["a", "hang", "b", "a", "a"]))
        # the hung worker is stopped after 3 s and replaced; spawn start-up ~1 s; far below "forever"
        assert time.monotonic() - start < 30.0
        assert statuses == ["ok", "timeout", "ok", "ok", "ok"]
        assert [r["score"] if isinstance(r, dict) else r for r in results] == [1.0, None, 0.0, 1.0, 1.0]
    finally:
        pool.close()


def test_pool_dead_worker_is_replaced_others_scored(scorer):
    # one worker only: after it dies on sample 1, samples 2 and 3 can only be scored by its replacement
    pool = ScorerPool(scorer, num_processes=1, timeout_s=30.0)
    try:
        results, statuses = pool.map(_kw(["a", "die", "a", "b"]))
        assert statuses == ["ok", "error", "ok", "ok"]
        assert "died" in results[1] and "7" in results[1]  # exit code of os._exit(7)
        assert [results[i]["score"] for i in (0, 2, 3)] == [1.0, 1.0, 0.0]
    finally:
        pool.close()


def test_pool_timeout_counts_from_pick_up_not_from_queueing(scorer):
    # one worker, three samples of 1.5 s each, timeout 2.5 s: the third waits ~3 s in the queue, more than the
    # timeout, yet none times out because each clock starts when the worker takes the sample
    pool = ScorerPool(scorer, num_processes=1, timeout_s=2.5)
    try:
        pool.map(_kw(["a"]))  # worker started and scorer loaded before timing
        results, statuses = pool.map(_kw(["sleep1.5"] * 3))
        assert statuses == ["ok"] * 3 and results == [1.0] * 3
    finally:
        pool.close()
