"""Responses aborted by ``rollout.over_sample_rate`` are not samples (issue 32, "numbers at the edges").

``abort_slowest`` empties the slowest responses (no response token). Before the fix they were scored (0) and counted
in their group's mean and standard deviation, so the kept responses' GRPO/RLOO advantages were wrong, and their 0
entered ``critic/score/*``. Now the estimator sees only the kept rows, aborted rows get advantage 0 and no loss
token, ``critic/score/*`` and ``critic/rewards/*`` leave them out, and ``response/aborted_ratio`` and
``response_length_non_aborted/*`` are reported, as verl 0.6's ``metric_utils``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.rlhf_core.trainer.test_trainer_ppo import (  # noqa: E402
    DecodeTok, FakeActor, FakeGroup, make_config, make_dataset)

from rlhf_core.algos.advantages import compute_advantage_without_aborted, get_adv_estimator  # noqa: E402
from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer  # noqa: E402

EPS = 1e-6
T = 3  # response width of the fake rollout
# two prompts × 4 responses. (first response token, length): the score of a response is its first token / 10.
# The two longest (length 3, the last row of each group) are the slowest: over_sample_rate 0.25 keeps
# int(8 × 0.75) = 6 and aborts exactly those two, one per group.
ROWS = [(10, 1), (0, 1), (5, 1), (7, 3),   # group a: kept scores 1.0, 0.0, 0.5; the aborted one would score 0.7
        (10, 1), (10, 2), (0, 2), (4, 3)]  # group b: kept scores 1.0, 1.0, 0.0


def _scores_batch(scores, aborted):
    """``token_level_rewards (B, 2)`` with each score on the first token; aborted rows have an empty mask."""
    b = len(scores)
    rewards = torch.zeros(b, 2)
    rewards[:, 0] = torch.tensor(scores)
    mask = torch.ones(b, 2)
    mask[torch.tensor(aborted)] = 0
    return rewards, mask


@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized"])
def test_grpo_statistics_of_a_group_leave_its_aborted_response_out(name):
    # group a: scores 1.0, 0.0, 0.5 kept, the 4th aborted (scored 0 by the reward function, as an empty answer is)
    # group b: 1, 1, 0, 0, none aborted
    rewards, mask = _scores_batch([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.0], [False, False, False, True] + [False] * 4)
    index = np.array(["a"] * 4 + ["b"] * 4, dtype=object)
    aborted = mask.sum(-1) == 0
    adv, ret = compute_advantage_without_aborted(get_adv_estimator(name), aborted, token_level_rewards=rewards,
                                                 response_mask=mask, index=index, epsilon=EPS,
                                                 norm_adv_by_std_in_grpo=True)
    # group a over its 3 kept responses: mean3 = 1.5/3 = 0.5; unbiased std3 = sqrt((0.25 + 0.25 + 0)/2) = 0.5
    # → A = (1 − 0.5)/(0.5 + 1e-6) = 0.999998, (0 − 0.5)/0.500001 = −0.999998, 0.
    # (With the aborted 0 counted, mean4 = 0.375 and std4 = 0.4787: the first response's A was 1.3056.)
    a = 0.5 / (0.5 + EPS)
    assert adv[:4, 0].tolist() == pytest.approx([a, -a, 0.0, 0.0], abs=1e-6)
    assert torch.all(adv[3] == 0) and torch.all(ret[3] == 0)  # the aborted row: exactly 0
    # group b untouched: mean 0.5, std sqrt(4 × 0.25 / 3) = 0.57735 → ±0.5/0.57735 = ±0.866025
    b = 0.5 / (math.sqrt(1 / 3) + EPS)
    assert adv[4:, 0].tolist() == pytest.approx([b, b, -b, -b], abs=1e-6)
    assert torch.equal(adv, ret)


def test_rloo_uses_the_kept_responses_and_a_lone_survivor_gets_no_advantage():
    # group a: 1.0, 0.0, 0.5 kept + 1 aborted → A_i = 3/2·(s_i − 0.5) = 0.75, −0.75, 0 (the 4-sample leave-one-out
    # with the aborted 0 would give 4/3·(1 − 0.375) = 0.8333 for the first)
    # group c: 3 of 4 aborted → one survivor, no baseline: A = 0 (before: RLOO's "a group has only 1" error, or, for
    # GRPO, A = s)
    rewards, mask = _scores_batch([1.0, 0.0, 0.5, 0.0, 0.9, 0.0, 0.0, 0.0],
                                  [False, False, False, True, False, True, True, True])
    index = ["a"] * 4 + ["c"] * 4
    for name in ("rloo", "rloo_vectorized", "grpo", "grpo_passk", "opo"):
        adv, _ = compute_advantage_without_aborted(get_adv_estimator(name), mask.sum(-1) == 0,
                                                   token_level_rewards=rewards, response_mask=mask, index=index,
                                                   epsilon=EPS, norm_adv_by_std_in_grpo=True)
        assert torch.all(adv[4:] == 0), name
        if name.startswith("rloo"):
            assert adv[:4, 0].tolist() == pytest.approx([0.75, -0.75, 0.0, 0.0], abs=1e-6)


def test_nothing_aborted_gives_the_estimators_own_output():
    rewards, mask = _scores_batch([1.0, 0.0, 0.5, 0.2], [False] * 4)
    index = ["a"] * 4
    for name in ("grpo", "rloo", "gae"):
        kwargs = dict(token_level_rewards=rewards, response_mask=mask, index=index, values=torch.zeros(4, 2),
                      gamma=1.0, lam=1.0, epsilon=EPS, norm_adv_by_std_in_grpo=True)
        got = compute_advantage_without_aborted(get_adv_estimator(name), torch.zeros(4, dtype=torch.bool), **kwargs)
        want = get_adv_estimator(name)(**kwargs)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), name


class OverSampleActor(FakeActor):
    """Generates :data:`ROWS` for two prompts × 4 and records what the update trained on."""

    def __init__(self):
        super().__init__([])
        self.trained = []

    def generate_sequences(self, batch: Batch) -> Batch:
        b, p = batch["input_ids"].shape
        assert b == len(ROWS)
        first = torch.tensor([tok for tok, _ in ROWS])
        lengths = torch.tensor([n for _, n in ROWS])
        mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        responses = torch.ones(b, T, dtype=torch.long) * mask
        responses[:, 0] = first
        return Batch({"prompts": batch["input_ids"], "responses": responses,
                      "input_ids": torch.cat([batch["input_ids"], responses], 1),
                      "attention_mask": torch.cat([batch["attention_mask"], mask], 1),
                      "position_ids": torch.arange(p + T).expand(b, -1).clone(), "response_mask": mask})

    def update_actor(self, batch):
        self.trained.append({k: batch[k].clone() for k in ("advantages", "response_mask", "token_level_scores")})
        return super().update_actor(batch)


class PadTok(DecodeTok):
    pad_token_id = 0


def first_token_reward(batch, return_dict=False):
    """score = first response token / 10 on the last response token (an aborted, all-pad response scores 0)."""
    scores = torch.zeros(batch["responses"].shape)
    last = (batch["response_mask"].sum(-1) - 1).clamp_min(0)
    scores[torch.arange(len(batch)), last] = batch["responses"][:, 0].float() / 10
    return {"reward_tensor": scores, "reward_extra_info": {}}


def test_a_step_with_over_sample_rate_trains_and_reports_only_the_kept_responses(tmp_path):
    cfg = make_config(tmp_path, total_training_steps=1, val_before_train=False, test_freq=-1, save_freq=-1)
    cfg.actor_rollout_ref.rollout.n = 4
    cfg.actor_rollout_ref.rollout.over_sample_rate = 0.25
    actor = OverSampleActor()
    trainer = RayPPOTrainer(cfg, PadTok(), lambda c: {"actor_rollout": FakeGroup(actor, world_size=1)},
                            first_token_reward, first_token_reward, make_dataset(), None)
    metrics = trainer.fit()
    trainer.shutdown()
    (trained,) = actor.trained
    adv, mask = trained["advantages"], trained["response_mask"]
    # rows 3 and 7 (length 3, the slowest) were aborted: no loss token, advantage 0
    assert mask.sum(-1).tolist() == [1, 1, 1, 0, 1, 2, 2, 0]
    assert torch.all(adv[[3, 7]] == 0)
    # group a: kept 1.0, 0.0, 0.5 → ±0.5/(0.5 + 1e-6), 0 (see the GRPO test above)
    a = 0.5 / (0.5 + EPS)
    assert [float(adv[i, 0]) for i in range(3)] == pytest.approx([a, -a, 0.0], abs=1e-6)
    # group b: kept 1, 1, 0 → mean 2/3, std sqrt(((1/3)² + (1/3)² + (2/3)²)/2) = sqrt(1/3) = 0.57735
    # → A = (1/3)/0.57735 = 0.57735 for the two 1s, (−2/3)/0.57735 = −1.154700 for the 0, on every valid token
    s = math.sqrt(1 / 3) + EPS
    want = torch.tensor([[1 / 3 / s, 0, 0], [1 / 3 / s, 1 / 3 / s, 0], [-2 / 3 / s, -2 / 3 / s, 0]])
    assert torch.allclose(adv[4:7], want, atol=1e-6, rtol=0)
    # scores over the 6 kept responses: (1 + 0 + 0.5 + 1 + 1 + 0)/6 = 0.58333 (all 8, aborted 0s included: 0.4375)
    assert metrics["critic/score/mean"] == pytest.approx(3.5 / 6)
    assert (metrics["critic/score/max"], metrics["critic/score/min"]) == (1.0, 0.0)
    assert metrics["critic/rewards/mean"] == pytest.approx(3.5 / 6)
    assert metrics["response/aborted_ratio"] == pytest.approx(2 / 8)  # one of each group's 4
    # lengths of the kept: 1, 1, 1, 1, 2, 2 → mean 8/6, none reaches T = 3; over all 8 rows (verl's
    # response_length/*): 8/8 = 1.0, min 0
    assert metrics["response_length_non_aborted/mean"] == pytest.approx(8 / 6)
    assert metrics["response_length_non_aborted/min"] == 1.0
    assert metrics["response_length_non_aborted/clip_ratio"] == 0.0
    assert metrics["response_length/mean"] == pytest.approx(1.0) and metrics["response_length/min"] == 0.0


def test_without_over_sample_rate_nothing_is_reported_aborted(tmp_path):
    cfg = make_config(tmp_path, total_training_steps=1, val_before_train=False, test_freq=-1, save_freq=-1)
    cfg.actor_rollout_ref.rollout.n = 4
    actor = OverSampleActor()
    trainer = RayPPOTrainer(cfg, PadTok(), lambda c: {"actor_rollout": FakeGroup(actor, world_size=1)},
                            first_token_reward, first_token_reward, make_dataset(), None)
    metrics = trainer.fit()
    trainer.shutdown()
    # all 8 kept: group a's 4th response (0.7) counts; scores 1, 0, .5, .7, 1, 1, 0, .4 → mean 4.6/8 = 0.575
    assert metrics["response/aborted_ratio"] == 0.0
    assert metrics["critic/score/mean"] == pytest.approx(4.6 / 8)
    assert metrics["response_length_non_aborted/mean"] == metrics["response_length/mean"] == pytest.approx(14 / 8)
    assert "perf/mfu/actor" not in metrics  # fake workers report no peak: left out, not 0


def test_a_rate_that_would_abort_every_response_is_refused_at_load():
    from rlhf_core.config import ConfigError, load_config

    # the shipped config: 1024 prompts × 1 response. Rate 0.999: int(1024 × 0.001) = 1 kept, accepted;
    # rate 0.9999: int(1024 × 0.0001) = int(0.1024) = 0 kept, refused before anything starts
    load_config("ppo_trainer", ["actor_rollout_ref.rollout.over_sample_rate=0.999"])
    with pytest.raises(ConfigError, match=r"over_sample_rate=0.9999 keeps int\(1024 × \(1 − 0.9999\)\) = 0 of the "
                                          r"1024 responses"):
        load_config("ppo_trainer", ["actor_rollout_ref.rollout.over_sample_rate=0.9999"])
