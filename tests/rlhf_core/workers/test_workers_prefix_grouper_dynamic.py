"""``use_prefix_grouper`` with rows that verl's example produces: dynamic batch sizes (``use_dynamic_bsz``,
``log_prob_use_dynamic_bsz``), ``actor.shuffle``, groups cut over micro-batches. A micro-batch's rows of one uid are
grouped wherever they sit and come back in its row order; a group cut over two micro-batches is two smaller groups.
Log-probs, entropies and gradients equal the plain forward's (same tolerances as test_workers_prefix_grouper.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.rlhf_core.workers.test_workers_fsdp import P as FP, T as FT, ppo_config, prompt_batch  # noqa: E402
from tests.rlhf_core.workers.test_workers_prefix_grouper import A, P, T, uneven_batch  # noqa: E402
from tests.rlhf_core.workers.test_workers_shared_prefix import tiny_lm  # noqa: E402

from rlhf_core.algos.utils import entropy_from_logits, logprobs_from_logits  # noqa: E402
from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.kernels.prefix_grouper import prefix_grouped_logits  # noqa: E402
from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.workers import actor as actor_module  # noqa: E402
from rlhf_core.workers.batching import split_to_count, token_budget_partition  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402


def _pick(b: dict, rows: list[int]) -> dict:
    return {k: v[rows] for k, v in b.items()}


def _grouped_vs_plain(model, b: dict, micro: list[list[int]]):
    """(log-probs, entropies, grads) of the plain forward over the whole batch and of the grouped forward over the
    micro-batches ``micro`` (row lists), put back in the batch's row order; the loss Σ (lp + 0.1·ent) · mask is
    a sum over rows, so its gradient does not depend on how the rows are cut."""
    got = []
    for grouped in (False, True):
        model.zero_grad()
        lps, ents = torch.zeros(b["responses"].shape), torch.zeros(b["responses"].shape)
        for rows in (micro if grouped else [list(range(len(b["uid"])))]):
            mb = _pick(b, rows)
            if grouped:
                logits = prefix_grouped_logits(model, mb["input_ids"], mb["attention_mask"], mb["position_ids"], T,
                                               mb["uid"])
            else:
                logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                               position_ids=mb["position_ids"]).logits[:, P - 1:-1]
            lp, ent = logprobs_from_logits(logits.float(), mb["responses"]), entropy_from_logits(logits.float())
            ((lp + 0.1 * ent) * mb["response_mask"]).sum().backward()
            lps[rows], ents[rows] = lp.detach(), ent.detach()
        got.append((lps, ents, {k: p.grad.clone() for k, p in model.named_parameters()}))
    return got


def _assert_equal(got, mask):
    (lp0, e0, g0), (lp1, e1, g1) = got
    valid = mask.bool()
    torch.testing.assert_close(lp1[valid], lp0[valid], rtol=0, atol=1e-5)
    torch.testing.assert_close(e1[valid], e0[valid], rtol=0, atol=1e-5)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-6, msg=k)


def test_a_micro_batch_whose_uid_rows_are_not_consecutive():
    # uneven_batch's groups u0 = rows 0-2, u1 = 3-6, u2 = 7, interleaved: u0 u1 u2 u0 u1 u0 u1 u1. The grouped
    # forward still runs 3 groups in one call (3 rows of P + 4·T columns: whole groups, not 6 runs) and gives each
    # row its own log-probs in the micro-batch's order
    model, b = tiny_lm(), uneven_batch()
    order = [0, 3, 7, 1, 4, 2, 5, 6]
    mixed = _pick(b, order)
    assert mixed["uid"].tolist() == ["u0", "u1", "u2", "u0", "u1", "u0", "u1", "u1"]
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    try:
        got = _grouped_vs_plain(model, mixed, [list(range(8))])
    finally:
        hook.remove()
    assert seen == [(8, P + T), (3, P + 4 * T)]  # the plain forward, then the grouped one
    _assert_equal(got, mixed["response_mask"])


def test_a_group_cut_over_two_micro_batches():
    # u1 (rows 3-6) cut after row 4: micro-batch 1 holds u0 and u1's first two rows, micro-batch 2 u1's last two
    # and u2; each piece runs as its own group (forwards of 2 rows of P + 3·T and 2 rows of P + 2·T columns)
    model, b = tiny_lm(), uneven_batch(seed=1)
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    try:
        got = _grouped_vs_plain(model, b, [[0, 1, 2, 3, 4], [5, 6, 7]])
    finally:
        hook.remove()
    assert seen[1:] == [(2, P + 3 * T), (2, P + 2 * T)]
    _assert_equal(got, b["response_mask"])


def test_the_token_budget_keeps_uid_runs_whole_where_it_can():
    # a run of one uid that fits the budget moves whole to the next micro-batch: tokens 11 10 | 9 8 for uids a a | c c
    # at budget 30: a (21), then c (17) would make 38 -> [0, 1], [2, 3]; rows alone fill greedily: 11 + 10 + 9 = 30
    assert token_budget_partition([11, 10, 9, 8], 30, uids=list("aacc")) == [[0, 1], [2, 3]]
    assert token_budget_partition([11, 10, 9, 8], 30) == [[0, 1, 2], [3]]
    # a run longer than the budget is cut where it fills, as rows alone: tokens 11 10 9 8 | 14 10 13 9 for
    # a x 4 | b x 4 at budget 30: a (38) -> [0, 1, 2] (30) and 8; b (46) fills on: 8 + 14 = 22 -> [3, 4];
    # 10 + 13 = 23 -> [5, 6]; [7] (the worker test's log-prob pass)
    lens, uids = [11, 10, 9, 8, 14, 10, 13, 9], list("aaaabbbb")
    assert token_budget_partition(lens, 30, uids=uids) == token_budget_partition(lens, 30) == [[0, 1, 2], [3, 4],
                                                                                              [5, 6], [7]]
    # splitting to a count cuts between two uids when the micro-batch holds such a boundary, even off the token
    # midpoint: 11 10 9 | 8 for a a a | c -> [0, 1, 2], [3]; rows alone cut at the midpoint (21 | 17) -> [0, 1], [2, 3]
    assert split_to_count([[0, 1, 2, 3]], [11, 10, 9, 8], 2, uids=list("aaac")) == [[0, 1, 2], [3]]
    assert split_to_count([[0, 1, 2, 3]], [11, 10, 9, 8], 2) == [[0, 1], [2, 3]]
    assert split_to_count([[0, 1, 2, 3]], [11, 10, 9, 8], 2, uids=list("aaaa")) == [[0, 1], [2, 3]]  # no boundary


def _worker_batch() -> Batch:
    """2 prompts (prompt_batch: prompt 0 has 5 tokens, prompt 1 8) x 4 responses of 6 5 4 3 | 6 2 5 1 tokens:
    row tokens 11 10 9 8 | 14 10 13 9, uids p0 x 4, p1 x 4, random advantages."""
    g = torch.Generator().manual_seed(7)
    prompts = prompt_batch(2, seed=5)
    lens = torch.tensor([6, 5, 4, 3, 6, 2, 5, 1])
    rmask = (torch.arange(FT)[None, :] < lens[:, None]).long()
    responses = torch.randint(3, 500, (8, FT), generator=g) * rmask
    pmask = prompts["attention_mask"].repeat_interleave(4, 0)
    mask = torch.cat([pmask, rmask], 1)
    return Batch({"input_ids": torch.cat([prompts["input_ids"].repeat_interleave(4, 0), responses], 1),
                  "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                  "responses": responses, "response_mask": rmask,
                  "advantages": torch.randn(8, FT, generator=g)},
                 {"uid": np.array(["p0"] * 4 + ["p1"] * 4, dtype=object)}, meta={"temperature": 1.0})


def test_worker_with_dynamic_bsz_and_shuffle_equals_the_plain_forward(tiny_model_dir, monkeypatch):
    # verl's example's settings through the FSDP2 worker (activation checkpointing on): a token budget of 30 for
    # the log-prob pass (micro-batches [0, 1, 2], [3, 4], [5, 6], [7]: p0 is cut, one micro-batch holds p0 and
    # p1) and of 45 for the update with actor.shuffle (rows permuted: micro-batches hold a uid's rows apart).
    # Old log-probs, grad norm and weights after the update equal the plain forward's
    b = _worker_batch()
    assert b["attention_mask"].sum(-1).tolist() == [11, 10, 9, 8, 14, 10, 13, 9]
    calls, results = [], []

    def recording(*args, **kwargs):
        calls.append([str(u) for u in args[5]])
        return prefix_grouped_logits(*args, **kwargs)

    monkeypatch.setattr(actor_module, "prefix_grouped_logits", recording)
    for grouped in (True, False):
        if not grouped:
            monkeypatch.setattr(actor_module, "shared_prefix_logits", lambda *a, **k: None)
        wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(
            tiny_model_dir, f"{A}actor.use_prefix_grouper={grouped}", f"{A}rollout.n=4", "data.train_batch_size=2",
            f"{A}actor.ppo_mini_batch_size=2", f"{A}actor.use_dynamic_bsz=True",
            f"{A}actor.ppo_max_token_len_per_gpu=45", f"{A}rollout.log_prob_use_dynamic_bsz=True",
            f"{A}rollout.log_prob_max_token_len_per_gpu=30", f"{A}actor.shuffle=True",
            "critic.ppo_mini_batch_size=2", f"{A}model.enable_gradient_checkpointing=True"), "role": "actor_rollout"})
        wg.execute_all("init_model")
        lp = wg.execute_dp("compute_log_prob", b)["old_log_probs"]
        metrics = wg.execute_dp("update_actor", b.merge(Batch({"old_log_probs": lp})))[0]
        results.append((lp, metrics, wg.worker.get_state_dict()))
        wg.shutdown()
    # the log-prob pass: p0 cut over two micro-batches, one micro-batch with both uids
    assert calls[:4] == [["p0"] * 3, ["p0", "p1"], ["p1"] * 2, ["p1"]]
    # the update's micro-batches over the shuffled rows (seeded: data_loader_seed, call 0, epoch 0): both uids
    # apart in the first two, p0 cut over two micro-batches and p1 over three
    assert calls[4:] == [["p1", "p0", "p1"], ["p0", "p0", "p1", "p0"], ["p1"]]
    (lp_g, m_g, sd_g), (lp_p, m_p, sd_p) = results
    mask = b["response_mask"].bool()
    torch.testing.assert_close(lp_g[mask], lp_p[mask], rtol=0, atol=1e-5)
    assert m_g["actor/grad_norm"] == pytest.approx(m_p["actor/grad_norm"], rel=1e-5)
    for k in sd_p:
        torch.testing.assert_close(sd_g[k], sd_p[k], rtol=1e-4, atol=1e-5, msg=k)
