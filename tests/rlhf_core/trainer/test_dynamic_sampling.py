"""DAPO dynamic sampling (algorithm.filter_groups): the group filter as pure functions, the gen-batch loop, and the
PPO driver with deterministic fake workers (steps of exactly train_batch_size kept groups, resume, validation)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, FakeActor, FakeGroup, make_config, make_dataset

from rlhf_core.config.validate import ppo_static_errors
from rlhf_core.protocol import Batch
from rlhf_core.trainer.dynamic_sampling import (OutOfData, collect_kept_groups, kept_group_rows, metric_values,
                                                prompts_per_batch)
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer
from rlhf_core.trainer.tracking import read_metrics_jsonl


def test_kept_group_rows_drops_zero_spread_groups_in_batch_order():
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "e", "e", "e"], dtype=object)
    values = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 3.0, 2.0, 2.0, 2.0])
    # a: std(1, 0) = 0.5 > 0 kept; b: (1, 1) std 0 dropped; c: (0, 0.5) kept; d: one sample, kept (nothing to
    # compare, as verl); e: (2, 2, 2) std 0 dropped
    kept, rows = kept_group_rows(uids, values)
    assert kept == ["a", "c", "d"]
    assert rows.tolist() == [0, 1, 4, 5, 6] and rows.dtype == np.int64
    # interleaved rows (after balancing) keep their batch order; groups listed by first appearance
    kept, rows = kept_group_rows(np.array(["b", "a", "b", "a"], dtype=object), np.array([0.0, 1.0, 0.0, 0.0]))
    assert kept == ["a"] and rows.tolist() == [1, 3]
    with pytest.raises(ValueError, match="3 uids but 2"):
        kept_group_rows(np.array(["a", "a", "b"]), np.array([1.0, 2.0]))


def _scored(scores, **extra):
    """Rows whose token_level_scores (B, 2) hold the given per-token scores."""
    return Batch({"token_level_scores": torch.tensor(scores, dtype=torch.float32)},
                 {k: np.asarray(v, dtype=object) for k, v in extra.items()})


def test_metric_values_reads_scores_or_a_reward_extra_info_field():
    b = _scored([[0.0, 1.0], [0.5, 0.25]], acc=[True, False], pred=["x", "y"])
    assert metric_values(b, "reward").tolist() == [1.0, 0.75]  # Σ_t: 0 + 1, 0.5 + 0.25
    assert metric_values(b, "seq_reward").tolist() == [1.0, 0.75]
    assert metric_values(b, "seq_final_reward").tolist() == [1.0, 0.75]  # no token_level_rewards yet: the scores
    assert metric_values(b, "acc").tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"metric='score' is not a reward_extra_info field.*\['acc', 'pred'\]"):
        metric_values(b, "score")
    with pytest.raises(ValueError, match="metric='pred': its values are not numbers"):
        metric_values(b, "pred")


def _rollout_from(table, n=2):
    """A fake [gen]+[reward]: prompt p's n samples score table[p] (a list of n numbers); uid = the prompt id."""
    def rollout(prompts):
        ids = [int(p) for p in prompts["pid"] for _ in range(n)]
        scores = [[0.0, float(table[p][j])] for p in prompts["pid"] for j in range(n)]
        out = _scored(scores, uid=[str(p) for p in ids])
        return out.merge(Batch({"attention_mask": torch.ones(len(ids), 3, dtype=torch.long)}))
    return rollout


def _prompts(*pids):
    return Batch({}, {"pid": np.asarray(pids, dtype=object)})


def test_collect_accumulates_gen_batches_then_cuts_to_train_batch_size():
    table = {0: [1, 1], 1: [0, 0], 2: [0, 1], 3: [1, 1], 4: [1, 0], 5: [0, 1], 6: [1, 0], 7: [0, 0]}
    more = iter([_prompts(2, 3), _prompts(4, 5), _prompts(6, 7)])
    batch, m = collect_kept_groups(_prompts(0, 1), more, _rollout_from(table), "reward", train_batch_size=2, n=2,
                                   max_num_gen_batches=0)
    # batch 1 (0, 1): both zero spread; batch 2 (2, 3): 2 kept; batch 3 (4, 5): 4 and 5 kept → 3 ≥ 2, cut to (2, 4)
    assert list(batch["uid"]) == ["2", "2", "4", "4"]
    assert m == {"train/num_gen_batches": 3.0, "train/num_kept_groups": 3.0, "train/num_gen_groups": 6.0}
    assert batch.meta["global_token_num"] == [3, 3, 3, 3]
    assert [list(b["pid"]) for b in more] == [[6, 7]]  # the loop stopped drawing once the batch was full


def test_collect_stops_at_max_num_gen_batches_and_when_data_runs_out():
    table = {p: [1, 1] for p in range(6)}
    with pytest.raises(RuntimeError, match="max_num_gen_batches=2 gen batches kept only 0 of the "
                                           "data.train_batch_size=2"):
        collect_kept_groups(_prompts(0, 1), iter([_prompts(2, 3), _prompts(4, 5)]), _rollout_from(table),
                            "reward", 2, 2, max_num_gen_batches=2)
    with pytest.raises(OutOfData, match="ran out after 3 gen batches with 0 of"):  # 0 = no limit
        collect_kept_groups(_prompts(0, 1), iter([_prompts(2, 3), _prompts(4, 5)]), _rollout_from(table),
                            "reward", 2, 2, max_num_gen_batches=0)


def test_config_rules_and_the_dataloader_batch_size(tmp_path):
    cfg = make_config(tmp_path)
    cfg.data.gen_batch_size = 4
    assert prompts_per_batch(cfg) == 2  # filtering off: gen_batch_size is not read (a warning says so)
    cfg.algorithm.filter_groups.enable = True
    assert prompts_per_batch(cfg) == 4
    cfg.data.gen_batch_size = None
    assert prompts_per_batch(cfg) == 2
    cfg.data.gen_batch_size = 0
    cfg.algorithm.filter_groups.metric = "seq_final_reward"
    cfg.algorithm.use_kl_in_reward = True
    cfg.algorithm.filter_groups.max_num_gen_batches = -1
    errors = "\n".join(ppo_static_errors(cfg))
    assert "data.gen_batch_size=0 must be > 0" in errors
    assert "algorithm.filter_groups.max_num_gen_batches=-1 must be >= 0" in errors
    cfg.data.gen_batch_size = 2
    assert "metric=seq_final_reward with algorithm.use_kl_in_reward=True" in "\n".join(ppo_static_errors(cfg))


# ---- the driver ------------------------------------------------------------------------------------------------
def spread_reward(hard):
    """A reward manager: prompts (dataset ``index``) in ``hard`` score 0 on every sample (zero spread, always
    dropped); the others score j on their j-th sample (0, 1, ...), so their groups always have a spread.
    'acc' = score > 0."""
    def reward_fn(batch, return_dict=False):
        seen: dict[str, int] = {}
        scores = torch.zeros(batch["responses"].shape)
        last = batch["response_mask"].sum(-1) - 1
        for i, (uid, index) in enumerate(zip(batch["uid"], batch["index"])):
            j = seen.get(str(uid), 0)
            seen[str(uid)] = j + 1
            scores[i, last[i]] = 0.0 if int(index) in hard else float(j)
        return {"reward_tensor": scores, "reward_extra_info": {"acc": (scores.sum(-1) > 0).tolist()}}
    return reward_fn


class RecordingActor(FakeActor):
    def __init__(self, log):
        super().__init__(log)
        self.updates = []  # per update call: the prompt indices of its rows

    def update_actor(self, batch):
        self.updates.append([int(i) for i in batch["index"]])
        return super().update_actor(batch)


def run_dapo(tmp_path, gen_batch_size, hard=(0, 1, 2, 5), **trainer):
    cfg = make_config(tmp_path, test_freq=2, save_freq=-1, **trainer)
    cfg.data.shuffle = False  # epoch order 0..7: the expected steps below are derived by hand
    cfg.data.gen_batch_size = gen_batch_size
    cfg.algorithm.filter_groups.enable = True
    cfg.algorithm.filter_groups.metric = "acc"
    log: list = []
    actor = RecordingActor(log)
    reward_fn = spread_reward(set(hard))
    t = RayPPOTrainer(cfg, DecodeTok(), lambda c: {"actor_rollout": FakeGroup(actor)}, reward_fn, reward_fn,
                      make_dataset(8), make_dataset(4))
    t.fit()
    t.shutdown()
    return t, actor, log, read_metrics_jsonl(os.path.join(cfg.trainer.default_local_dir, "metrics.jsonl"))


def _step_prompts(actor, step):
    """The prompt indices of global step ``step``'s update (FakeGroup splits it into 2 calls), one per group."""
    rows = actor.updates[2 * (step - 1)] + actor.updates[2 * (step - 1) + 1]
    return rows[::2]


def test_driver_trains_on_exactly_train_batch_size_kept_groups(tmp_path):
    t, actor, log, metrics = run_dapo(tmp_path, gen_batch_size=2)
    # gen batches (0,1) (2,3) (4,5) (6,7) per epoch, hard = {0,1,2,5}: step 1 keeps 3 then 4 after 3 gen batches,
    # step 2 keeps 6, 7 from one; epoch 1 repeats and uses the last batch, so the run ends after 4 of the 8
    # planned steps (total_training_steps counts dataloader batches, as verl's DAPO trainer)
    assert t.global_steps == 4 and t.total_training_steps == 8
    assert [_step_prompts(actor, s) for s in (1, 2, 3, 4)] == [[3, 4], [6, 7], [3, 4], [6, 7]]
    assert [metrics[s]["train/num_gen_batches"] for s in (1, 2, 3, 4)] == [3.0, 1.0, 3.0, 1.0]
    assert [metrics[s]["training/epoch"] for s in (1, 2, 3, 4)] == [0, 0, 1, 1]
    # every row of a trained group has a spread; each step has train_batch_size × n = 4 rows
    assert all(len(actor.updates[i]) + len(actor.updates[i + 1]) == 4 for i in range(0, 8, 2))
    # validation is untouched: all 4 validation prompts × val n = 2, at steps 0 (before training), 2 and 4
    val_gens = [c for c in log if c[0] == "gen" and c[1]]
    assert sum(len(c[2]) for c in val_gens) == 3 * 4 * 2
    assert "val-core/toy/acc/mean@2" in metrics[2] and "val-core/toy/acc/mean@2" in metrics[4]


def test_driver_cuts_surplus_groups_and_resumes_exactly(tmp_path):
    ref, ref_actor, _, ref_metrics = run_dapo(tmp_path / "a", gen_batch_size=4, total_training_steps=3)
    # gen batches (0..3) (4..7): step 1 keeps 3 from the first, 4, 6, 7 from the second → cut to (3, 4); the
    # surplus 6, 7 is dropped, not carried. Step 2 (epoch 1) does the same; no data is left for step 3
    assert [_step_prompts(ref_actor, s) for s in (1, 2)] == [[3, 4], [3, 4]]
    assert ref_metrics[1]["train/num_gen_batches"] == 2.0 and ref_metrics[1]["train/num_kept_groups"] == 4.0
    assert ref.global_steps == 2 and max(ref_metrics) == 2

    first, _, _, _ = run_dapo(tmp_path / "b", gen_batch_size=4, total_training_steps=3, stop_after_step=1)
    assert first.global_steps == 1
    resumed, actor, _, metrics = run_dapo(tmp_path / "b", gen_batch_size=4, total_training_steps=3)
    assert resumed.global_steps == 2 and actor.theta == pytest.approx(ref_actor.theta, abs=1e-12)
    assert _step_prompts(actor, 1) == [3, 4]  # the resumed run's first update is global step 2
    for k in ("train/num_gen_batches", "critic/score/mean", "actor/pg_loss", "training/epoch"):
        assert metrics[2][k] == pytest.approx(ref_metrics[2][k], abs=1e-9), k


def test_driver_carries_groups_across_epochs_and_stops_when_the_data_runs_out(tmp_path):
    _, actor, _, metrics = run_dapo(tmp_path, gen_batch_size=2, hard=(0, 1, 2, 5, 7), total_epochs=3)
    # kept per epoch: 3 (from (2,3)), 4 (from (4,5)), 6 (from (6,7)). Step 1: (0,1) (2,3) (4,5) → 3, 4.
    # Step 2: (6,7) of epoch 0 then (0,1) (2,3) of epoch 1 → 6, 3. Step 3: (4,5) (6,7) → 4, 6. Step 4: epoch 2's
    # (0,1) (2,3) (4,5) → 3, 4. Step 5: (6,7) keeps 6, then the data ends: not trained, the run stops at step 4
    assert [_step_prompts(actor, s) for s in (1, 2, 3, 4)] == [[3, 4], [6, 3], [4, 6], [3, 4]]
    assert len(actor.updates) == 8 and max(metrics) == 4
    assert [metrics[s]["train/num_gen_batches"] for s in (1, 2, 3, 4)] == [3.0, 3.0, 2.0, 3.0]
    assert [metrics[s]["training/epoch"] for s in (1, 2, 3, 4)] == [0, 0, 1, 2]  # the epoch of the first gen batch
