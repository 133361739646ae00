"""How the actor, critic and SFT worker hand their :class:`~rlhf_core.workers.ulysses.SequenceParallel` on, in one
process (no process group: the SP object is a stand-in with ``size`` 2 and the row gather is the identity, so each
test stops where the data would meet the model). The two-rank equivalence tests are in test_ulysses_ranks.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.fixtures.config_fixtures import typed_config
from tests.rlhf_core.workers.test_workers_shared_prefix import tiny_lm

from rlhf_core.protocol import Batch
from rlhf_core.trainer.sft_worker import SFTWorker
from rlhf_core.workers import actor as actor_module
from rlhf_core.workers import batching
from rlhf_core.workers import critic as critic_module

A = "actor_rollout_ref"
SP = SimpleNamespace(size=2)  # an SP group of 2 ranks: only its size is read before the forward


class _Partitioned(Exception):
    """Raised by the spy once the micro-batches are cut: the test stops before the forward."""

    def __init__(self, groups):
        super().__init__()
        self.groups = groups


def _rows() -> Batch:
    # 2 rows of 12 and 4 valid tokens; the budgets below are 8 tokens per GPU: the first row is 1.5 x the budget.
    # sp=2: budget 8 x 2 = 16 >= 12 + 4, one micro-batch of both rows; sp=1: the 12-token row is refused (verl
    # multiplies the budget by the SP size the same way: 0.9 workers/engine/utils.py)
    mask = torch.tensor([[1] * 12, [1] * 4 + [0] * 8])
    return Batch(tensors={"attention_mask": mask, "input_ids": torch.zeros_like(mask), "position_ids": mask.cumsum(-1),
                          "responses": torch.zeros_like(mask[:, :4]), "response_mask": mask[:, -4:],
                          "old_log_probs": torch.zeros(2, 4), "advantages": torch.zeros(2, 4),
                          "values": torch.zeros(2, 4), "returns": torch.zeros(2, 4)})


def test_token_budget_is_multiplied_by_the_sp_size():
    b = _rows()
    groups = batching.micro_batches(b, None, True, 8, "ppo_max_token_len_per_gpu", sp_size=2)
    assert [g["attention_mask"].sum().item() for g in groups] == [16]
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu=8 is smaller than a sequence of 12 tokens"):
        batching.micro_batches(b, None, True, 8, "ppo_max_token_len_per_gpu")
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu=4 x ulysses_sequence_parallel_size=2: budget=8 "
                                         "is smaller than a sequence of 12 tokens"):
        batching.micro_batches(b, None, True, 4, "ppo_max_token_len_per_gpu", sp_size=2)


@pytest.fixture
def spied(monkeypatch):
    """``gather_rows`` / ``own_rows`` as the identity, and ``batching.micro_batches`` that cuts for real, then
    raises :class:`_Partitioned` with the cut (its token counts per micro-batch)."""
    real = batching.micro_batches

    def spy(*args, **kwargs):
        raise _Partitioned([g["attention_mask"].sum().item() for g in real(*args, **kwargs)])

    for module in (actor_module, critic_module):
        monkeypatch.setattr(module, "gather_rows", lambda batch, sp: batch)
    monkeypatch.setattr(batching, "micro_batches", spy)


def _actor(sp):
    cfg = typed_config("ppo_trainer", f"{A}.actor.use_dynamic_bsz=True", f"{A}.actor.ppo_max_token_len_per_gpu=8")
    model = tiny_lm()
    return actor_module.DataParallelPPOActor(cfg.actor_rollout_ref.actor, model, torch.optim.SGD(model.parameters()),
                                             2, None, use_remove_padding=True, sp=sp)


def _critic(sp):
    cfg = typed_config("ppo_trainer", "critic.use_dynamic_bsz=True", "critic.ppo_max_token_len_per_gpu=8",
                       "critic.forward_max_token_len_per_gpu=8")
    model = tiny_lm()
    return critic_module.DataParallelPPOCritic(cfg.critic, model, torch.optim.SGD(model.parameters()), 2, None,
                                               use_remove_padding=True, sp=sp)


CALLS = {  # each entry point that cuts the SP group's gathered rows by a token budget of 8 per GPU
    "actor.compute_log_prob": (_actor, lambda a, b: a.compute_log_prob(b, None, True, 8),
                               "log_prob_max_token_len_per_gpu"),
    "actor.update_policy": (_actor, lambda a, b: a.update_policy(b), "ppo_max_token_len_per_gpu"),
    "critic.compute_values": (_critic, lambda c, b: c.compute_values(b), "forward_max_token_len_per_gpu"),
    "critic.update_critic": (_critic, lambda c, b: c.update_critic(b), "ppo_max_token_len_per_gpu"),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_actor_and_critic_budgets_count_the_sp_group(spied, name):
    build, call, key = CALLS[name]
    with pytest.raises(_Partitioned) as cut:
        call(build(SP), _rows())
    assert cut.value.groups == [16]  # both rows in one micro-batch of 8 x 2 tokens
    with pytest.raises(ValueError, match=f"{key}=8 is smaller than a sequence of 12 tokens"):
        call(build(None), _rows())


def test_sft_budget_counts_the_sp_group():
    cfg = typed_config("sft_trainer", "data.micro_batch_size_per_gpu=1", "data.use_dynamic_bsz=True",
                       "data.max_token_len_per_gpu=8", "use_remove_padding=True")
    worker = SFTWorker(cfg, 1)
    worker.sp = SP
    assert [m["attention_mask"].sum().item() for m in worker._micro_batches(_rows())] == [16]
    worker.sp = None
    with pytest.raises(ValueError, match="data.max_token_len_per_gpu=8 is smaller than a sequence of 12 tokens"):
        worker._micro_batches(_rows())


def test_actor_and_critic_forward_paths_carry_the_sp_and_no_prefix_grouper():
    # the critic once passed its sp positionally into choose_response_forward's prefix_grouper slot (fixed in
    # b8f58f4): the grouped forward then ran unsplit and the critic's gradient was sp x too large
    actor, critic = _actor(SP), _critic(SP)
    for role in (actor, critic):
        assert role._path.sp is SP and not role._path.prefix_grouper and not role._path.shared_prefix
    actor.ref_model = tiny_lm()
    assert actor._ref_path.sp is SP and not actor._ref_path.prefix_grouper
