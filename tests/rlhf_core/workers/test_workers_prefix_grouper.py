"""``actor_rollout_ref.actor.use_prefix_grouper`` (``rlhf_core/kernels/prefix_grouper.py``): each uid group runs as one
sequence with a block attention mask; log-probs, entropies and gradients equal the plain forward's, directly and
through the FSDP2 worker's log-prob pass and update; what it needs is refused by name."""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.rlhf_core.workers.test_workers_fsdp import ppo_config, prompt_batch  # noqa: E402
from tests.rlhf_core.workers.test_workers_shared_prefix import tiny_lm  # noqa: E402

from rlhf_core.algos.utils import entropy_from_logits, logprobs_from_logits  # noqa: E402
from rlhf_core.config import ConfigError, load_config  # noqa: E402
from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.kernels.prefix_grouper import block_mask, group_layout, prefix_grouped_logits, uid_groups  # noqa: E402
from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.trainer.driver_utils import balance_batch  # noqa: E402
from rlhf_core.workers import actor as actor_module  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402

A = "actor_rollout_ref."
P, T, V = 6, 4, 64


def uneven_batch(seed: int = 0) -> dict:
    """3 uid groups of 3, 4 and 1 rows (8 rows): prompts left-padded by 0, 2 and 1 tokens, responses right-padded to
    4, 3, 2, 1, 4, 3, 2, 1 valid tokens (each group has responses of different lengths)."""
    g = torch.Generator().manual_seed(seed)
    sizes, pads = (3, 4, 1), (0, 2, 1)
    prompts = torch.randint(3, V, (3, P), generator=g)
    pmask = torch.ones(3, P, dtype=torch.long)
    for i, pad in enumerate(pads):
        pmask[i, :pad] = 0
        prompts[i, :pad] = 0
    rows = torch.tensor([i for i, s in enumerate(sizes) for _ in range(s)])
    b = len(rows)
    rmask = (torch.arange(T)[None, :] < (T - torch.arange(b) % 4)[:, None]).long()
    responses = torch.randint(3, V, (b, T), generator=g) * rmask
    mask = torch.cat([pmask[rows], rmask], 1)
    return {"input_ids": torch.cat([prompts[rows], responses], 1), "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "responses": responses, "response_mask": rmask,
            "uid": np.array([f"u{i}" for i in rows.tolist()], dtype=object)}


def test_block_mask_of_a_two_response_group_by_hand():
    # prompt [pad, p1, p2] (P=3), responses a = [a0, a1, a2], b = [b0, b1, pad] (T=3): one row of 3 + 2·3 columns
    # [pad p1 p2 | a0 a1 a2 | b0 b1 pad]. Query q attends key k when k <= q, k holds a token, and k is a prompt
    # column or in q's slot: p1 sees p1; p2 sees p1 p2; a_t sees p1 p2 a0..a_t; b_t sees p1 p2 b0..b_t, never a.
    ids = torch.tensor([[0, 11, 12, 20, 21, 22], [0, 11, 12, 30, 31, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    groups = uid_groups(torch.cat([ids[:, :3], mask[:, :3], pos[:, :3]], 1), ["x", "x"])
    assert groups == [[0, 1]]
    lay_ids, valid, lay_pos, slot, m = group_layout(ids, mask, pos, 3, groups)
    assert m == 2 and lay_ids.tolist() == [[0, 11, 12, 20, 21, 22, 30, 31, 0]]
    assert lay_pos.tolist() == [[0, 0, 1, 2, 3, 4, 2, 3, 3]]  # each response keeps its own positions 2, 3, ...
    expected = torch.tensor([
        # pad p1 p2 a0 a1 a2 b0 b1 pad  <- keys
        [0, 0, 0, 0, 0, 0, 0, 0, 0],  # pad (a fully masked query: its output is never used)
        [0, 1, 0, 0, 0, 0, 0, 0, 0],  # p1
        [0, 1, 1, 0, 0, 0, 0, 0, 0],  # p2
        [0, 1, 1, 1, 0, 0, 0, 0, 0],  # a0
        [0, 1, 1, 1, 1, 0, 0, 0, 0],  # a1
        [0, 1, 1, 1, 1, 1, 0, 0, 0],  # a2
        [0, 1, 1, 0, 0, 0, 1, 0, 0],  # b0
        [0, 1, 1, 0, 0, 0, 1, 1, 0],  # b1
        [0, 1, 1, 0, 0, 0, 1, 1, 0],  # pad after b1 (its output is never used)
    ], dtype=torch.bool)
    assert torch.equal(block_mask(valid, slot)[0, 0], expected)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_log_probs_entropies_and_gradients_equal_the_plain_forward(impl):
    # float32, groups of 3, 4 and 1 rows with different left pads and response lengths. Tolerance 1e-5 on log-probs
    # and entropies, 1e-5 relative on gradients: the same keys, values and positions enter every valid query's
    # softmax, so only the summation order differs (float32 rounding, ~1e-7 relative per op over 2 layers);
    # a mask letting a response see a sibling or a pad, or a shifted position, moves log-probs by ~1e-2.
    model, b = tiny_lm(), uneven_batch()
    model.set_attn_implementation(impl)
    got = []
    for grouped in (False, True):
        model.zero_grad()
        if grouped:
            logits = prefix_grouped_logits(model, b["input_ids"], b["attention_mask"], b["position_ids"], T, b["uid"])
        else:
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                           position_ids=b["position_ids"]).logits[:, P - 1:-1]
        lp, ent = logprobs_from_logits(logits.float(), b["responses"]), entropy_from_logits(logits.float())
        ((lp + 0.1 * ent) * b["response_mask"]).sum().backward()
        got.append((lp.detach(), ent.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    (lp0, e0, g0), (lp1, e1, g1) = got
    valid = b["response_mask"].bool()
    torch.testing.assert_close(lp1[valid], lp0[valid], rtol=0, atol=1e-5)
    torch.testing.assert_close(e1[valid], e0[valid], rtol=0, atol=1e-5)
    assert torch.isfinite(lp1).all() and torch.isfinite(e1).all()  # pads: finite, masked by response_mask
    for k in g0:  # the one prompt pass receives the gradients of all the group's responses
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-6, msg=k)


def test_one_forward_of_the_grouped_rows():
    # 8 rows of 10 columns become 3 rows of 6 + 4·4 = 22 columns (the largest group has 4 rows)
    model, b = tiny_lm(), uneven_batch()
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    try:
        with torch.no_grad():
            prefix_grouped_logits(model, b["input_ids"], b["attention_mask"], b["position_ids"], T, b["uid"])
    finally:
        hook.remove()
    assert seen == [(3, P + 4 * T)]


def test_groups_that_break_the_layout_are_refused():
    model, b = tiny_lm(), uneven_batch()
    args = (b["input_ids"], b["attention_mask"], b["position_ids"], T)
    uid = b["uid"].copy()
    uid[3] = "u0"  # row 3 holds prompt 1 under uid u0 (rows 0-2)
    with pytest.raises(ValueError, match="rows 0 and 3 of a micro-batch share uid 'u0' but not their prompt"):
        prefix_grouped_logits(model, *args, uid)
    right = b["attention_mask"].clone()
    right[0, P - 1] = 0
    with pytest.raises(ValueError, match="every prompt must end in its last column"):
        prefix_grouped_logits(model, b["input_ids"], right, b["position_ids"], T, b["uid"])
    flash = tiny_lm()
    flash.config._attn_implementation = "flash_attention_2"  # takes no 4-D mask: refused when the actor is built
    with pytest.raises(ValueError, match="use_prefix_grouper=True needs an attention implementation that takes a "
                                         "4-D mask.*'flash_attention_2'"):
        actor_module.choose_response_forward(flash, False, None, True)
    sp = SimpleNamespace(size=2)  # an SP group of 2 (only its size is read before the refusal)
    with pytest.raises(ValueError, match="use_prefix_grouper=True with ulysses_sequence_parallel_size=2: the grouped "
                                         "forward is not split over the SP group"):
        actor_module.choose_response_forward(tiny_lm(), True, None, True, sp)
    assert actor_module.choose_response_forward(model, True, None, False, sp).sp is sp  # SP alone is accepted
    # without a uid column the rows of equal prompts are the groups, wherever they sit
    key = torch.cat([b["input_ids"][:, :P], b["attention_mask"][:, :P]], 1)
    assert uid_groups(key, None) == [[0, 1, 2], [3, 4, 5, 6], [7]]
    assert uid_groups(key[[3, 0, 7, 4, 1]], None) == [[0, 3], [1, 4], [2]]


def test_config_refuses_only_what_the_grouped_forward_cannot_run(tiny_model_dir):
    on = A + "actor.use_prefix_grouper=True"
    with pytest.raises(ConfigError) as info:
        ppo_config(tiny_model_dir, on, A + "model.use_remove_padding=True")
    assert f"{A}model.use_remove_padding=True: the grouped forward runs the padded layout" in str(info.value)
    # what only cuts groups (each piece exact, its prompt once): dynamic bsz (verl's example sets all three),
    # shuffle, micro-batches of 2 rows with rollout.n=4, 3 prompts x 2 responses over 2 ranks (3 + 3 rows)
    cfg = ppo_config(tiny_model_dir, on, A + "actor.shuffle=True", A + "rollout.n=4",
                     A + "actor.use_dynamic_bsz=True", A + "rollout.log_prob_use_dynamic_bsz=True",
                     A + "ref.log_prob_use_dynamic_bsz=True", A + "actor.use_kl_loss=True")
    assert cfg.actor_rollout_ref.actor.use_prefix_grouper and cfg.actor_rollout_ref.actor.shuffle
    assert ppo_config(tiny_model_dir, on, A + "rollout.n=4").actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 2
    assert ppo_config(tiny_model_dir, on, "trainer.n_gpus_per_node=2", A + "actor.ppo_mini_batch_size=3",
                      A + "actor.ppo_micro_batch_size_per_gpu=3", "data.train_batch_size=3", A + "rollout.n=2",
                      "algorithm.adv_estimator=grpo").trainer.n_gpus_per_node == 2


def test_balance_batch_moves_whole_groups():
    # 4 groups of 2 rows over 2 ranks; tokens per group 10, 2, 8, 4 -> greedy by group: {g0, g1} / {g2, g3}
    lens = [5, 5, 1, 1, 4, 4, 2, 2]
    mask = (torch.arange(6)[None, :] < torch.tensor(lens)[:, None]).long()
    batch = Batch({"attention_mask": mask, "row": torch.arange(8)}, {"uid": ["a", "a", "b", "b", "c", "c", "d", "d"]})
    out, metrics = balance_batch(batch, 2, keep_groups=True)
    assert out["row"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # (10 + 2 | 8 + 4): groups whole and consecutive
    assert metrics["global_seqlen/balanced_max"] == 12.0
    per_row, _ = balance_batch(batch, 2)  # rows moved one by one split the groups
    assert per_row["row"].tolist() != out["row"].tolist()
    # 3 groups of 2 rows do not fill 2 shards of 3 rows (verl raises): the last group (2 tokens) is cut, a row each
    three = Batch({"attention_mask": mask[:6], "row": torch.arange(6)}, {"uid": ["a", "a", "b", "b", "c", "c"]})
    out, metrics = balance_batch(three, 2, keep_groups=True)
    # by tokens: a (10) -> shard 0, c (8) -> shard 1; b (2 rows) fits neither (one row free each): cut, its row 2
    # to the shard with fewer tokens (1: 8 < 10), row 3 to shard 0 -> shards [0, 1, 3] (11) | [2, 4, 5] (9)
    assert out["row"].tolist() == [0, 1, 3, 2, 4, 5] and out.non_tensors["uid"].tolist() == list("aabbcc")
    assert metrics["global_seqlen/balanced_min"] == 9.0 and metrics["global_seqlen/balanced_max"] == 11.0


def test_worker_log_probs_and_update_equal_the_plain_forward(tiny_model_dir, monkeypatch):
    # through the FSDP2 worker, with activation checkpointing (where the KV-cache shared prefix cannot run):
    # rollout.n = 4, 2 prompts, one micro-batch of 8 rows; old log-probs, grad norm and weights after the update
    # equal the plain forward's (the shared prefix switched off for that run)
    calls, results = [], []

    def counting(*args, **kwargs):
        calls.append(args[1].shape)
        return prefix_grouped_logits(*args, **kwargs)

    monkeypatch.setattr(actor_module, "prefix_grouped_logits", counting)
    for grouped in (True, False):
        if not grouped:
            monkeypatch.setattr(actor_module, "shared_prefix_logits", lambda *a, **k: None)
        wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": ppo_config(
            tiny_model_dir, f"{A}actor.use_prefix_grouper={grouped}", f"{A}rollout.n=4", "data.train_batch_size=2",
            f"{A}actor.ppo_mini_batch_size=2", f"{A}actor.ppo_micro_batch_size_per_gpu=8",
            f"{A}rollout.log_prob_micro_batch_size_per_gpu=8", "critic.ppo_mini_batch_size=2",
            f"{A}model.enable_gradient_checkpointing=True"), "role": "actor_rollout"})
        wg.execute_all("init_model")
        if grouped:
            prompts = prompt_batch(2, seed=5)
            batch = wg.execute_dp("generate_sequences",
                                  Batch({k: v.repeat_interleave(4, 0) for k, v in prompts.tensors.items()}))
            batch.non_tensors["uid"] = np.array(["p0"] * 4 + ["p1"] * 4, dtype=object)
            batch.tensors["advantages"] = torch.randn(batch["responses"].shape,
                                                      generator=torch.Generator().manual_seed(5))
        lp = wg.execute_dp("compute_log_prob", batch)["old_log_probs"]
        metrics = wg.execute_dp("update_actor", batch.merge(Batch({"old_log_probs": lp})))[0]
        results.append((lp, metrics, wg.worker.get_state_dict()))
        wg.shutdown()
    assert len(calls) == 2 and all(s[0] == 8 for s in calls)  # the log-prob pass and the update, 8 rows each
    (lp_g, m_g, sd_g), (lp_p, m_p, sd_p) = results
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(lp_g[mask], lp_p[mask], rtol=0, atol=1e-5)
    assert m_g["actor/grad_norm"] == pytest.approx(m_p["actor/grad_norm"], rel=1e-5)
    for k in sd_p:
        torch.testing.assert_close(sd_g[k], sd_p[k], rtol=1e-4, atol=1e-5, msg=k)
