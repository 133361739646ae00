"""The PPO driver with deterministic fake worker groups: stage order, metric names, checkpoints and resume."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from tests.fixtures.config_fixtures import typed_config

from rlhf_core.protocol import Batch
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer
from rlhf_core.trainer.tracking import read_metrics_jsonl

P, T, VOCAB = 4, 3, 10


class FakeActor:
    """A 'policy' with one scalar parameter ``theta``; generation is a deterministic function of theta, the step
    and the prompt, so two runs that agree on theta and data agree on everything."""

    def __init__(self, log):
        self.theta, self.log = 0.0, log

    def generate_sequences(self, batch: Batch) -> Batch:
        self.log.append(("gen", batch.meta.get("validate", False), list(batch["uid"])))
        b = len(batch)
        seed = int(batch["input_ids"][:, -1].sum()) + int(batch.meta.get("global_steps", 0)) + int(self.theta * 1000)
        gen = torch.Generator().manual_seed(seed)
        responses = torch.randint(1, VOCAB, (b, T), generator=gen)
        lengths = torch.randint(1, T + 1, (b,), generator=gen)
        mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        responses = responses * mask
        return Batch({"prompts": batch["input_ids"], "responses": responses,
                      "input_ids": torch.cat([batch["input_ids"], responses], 1),
                      "attention_mask": torch.cat([batch["attention_mask"], mask], 1),
                      "position_ids": torch.arange(P + T).expand(b, -1).clone(), "response_mask": mask,
                      "rollout_log_probs": torch.full((b, T), -1.1 - self.theta)})

    def compute_log_prob(self, batch):
        self.log.append(("old_log_prob",))
        lp = torch.full(batch["responses"].shape, -1.0 - self.theta)
        return Batch({"old_log_probs": lp, "entropys": torch.full_like(lp, 0.5)})

    def compute_ref_log_prob(self, batch):
        self.log.append(("ref",))
        return Batch({"ref_log_prob": torch.full(batch["responses"].shape, -1.0)})

    def update_actor(self, batch):
        self.log.append(("update_actor", "rollout_is_weights" in batch))
        adv = batch["advantages"]
        self.theta += 0.1 * float(adv.abs().sum()) + 0.01
        return {"actor/pg_loss": [float(adv.mean()), 0.0], "actor/lr": 1e-6}

    def save_checkpoint(self, path, hdfs_path=None, global_step=0):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "state.json"), "w") as fh:
            json.dump({"theta": self.theta}, fh)

    def load_checkpoint(self, path):
        with open(os.path.join(path, "state.json")) as fh:
            self.theta = json.load(fh)["theta"]


class FakeCritic:
    def __init__(self, log):
        self.bias, self.log = 0.0, log

    def compute_values(self, batch):
        self.log.append(("values",))
        return Batch({"values": torch.full(batch["responses"].shape, self.bias)})

    def update_critic(self, batch):
        self.log.append(("update_critic",))
        self.bias += 0.05
        return {"critic/vf_loss": 0.25, "critic/lr": 1e-5}

    def save_checkpoint(self, path, hdfs_path=None, global_step=0):
        os.makedirs(path, exist_ok=True)
        torch.save(self.bias, os.path.join(path, "bias.pt"))

    def load_checkpoint(self, path):
        self.bias = torch.load(os.path.join(path, "bias.pt"))


class FakeGroup:
    """Worker-group interface over one in-process object; ``world_size=2`` shards like RayWorkerGroup. No
    ``in_process`` attribute, as a user's custom group: the trainer then takes it for in-process."""

    def __init__(self, worker, world_size=2):
        self.worker, self.world_size = worker, world_size

    def execute_all(self, method, *args, **kwargs):
        if method == "init_model":
            return [None] * self.world_size
        return [getattr(self.worker, method)(*args, **kwargs)]

    def execute_dp(self, method, batch, **kwargs):
        parts = [getattr(self.worker, method)(s, **kwargs) for s in batch.chunk(self.world_size)]
        return Batch.concat(parts) if isinstance(parts[0], Batch) else parts

    def shutdown(self):
        pass


def reward_fn(batch, return_dict=False):
    """1.0 on the last valid token when the first response token is even, else 0."""
    scores = torch.zeros(batch["responses"].shape)
    last = batch["response_mask"].sum(-1) - 1
    correct = (batch["responses"][:, 0] % 2 == 0).float()
    scores[torch.arange(len(batch)), last] = correct
    return {"reward_tensor": scores, "reward_extra_info": {"acc": correct.tolist()}}


def make_dataset(n=8):
    items = []
    for i in range(n):
        ids = torch.tensor([0, 0, 1 + i % 9, 2 + i % 7])
        items.append({"input_ids": ids, "attention_mask": (ids != 0).long(),
                      "position_ids": torch.clamp((ids != 0).long().cumsum(0) - 1, min=0),
                      "data_source": "toy", "reward_model": {"ground_truth": str(i)}, "index": i})
    return items


class DecodeTok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


def make_config(tmp_path, **trainer):
    cfg = {
        "data": {"train_batch_size": 2, "val_batch_size": None, "shuffle": True, "seed": 7},
        "actor_rollout_ref": {"rollout": {"n": 2, "val_kwargs": {"n": 2, "do_sample": False}},
                              # ppo_mini_batch_size 1 < train_batch_size 2: two mini-batches, old_log_prob is run
                              "actor": {"use_kl_loss": True, "loss_agg_mode": "token-mean", "optim": {},
                                        "ppo_epochs": 1, "ppo_mini_batch_size": 1, "rollout_is": False}},
        "critic": {"optim": {}},
        "algorithm": {"adv_estimator": "grpo", "gamma": 1.0, "lam": 1.0, "use_kl_in_reward": False,
                      "kl_penalty": "kl", "norm_adv_by_std_in_grpo": True,
                      "kl_ctrl": {"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1}},
        "trainer": {"total_epochs": 2, "total_training_steps": None, "project_name": "p", "experiment_name": "e",
                    "logger": ["file"], "log_val_generations": 2, "save_freq": 2, "test_freq": 2,
                    "val_before_train": True, "critic_warmup": 0, "resume_mode": "auto", "resume_from_path": None,
                    "default_local_dir": str(tmp_path / "ckpt"), "default_hdfs_dir": None,
                    "validation_data_dir": str(tmp_path / "val"), "stop_after_step": None, "total_training_seconds": None,
                    "remove_previous_ckpt_in_save": False, "del_local_ckpt_after_load": False,
                    "max_actor_ckpt_to_keep": None, "max_critic_ckpt_to_keep": None},
    }
    cfg["trainer"].update(trainer)
    cfg["trainer"].setdefault("balance_batch", False)  # FakeGroup shards in order; the YAML's True reorders rows
    typed = typed_config("ppo_trainer")  # every other key at the YAML's value
    typed.merge_with(cfg)
    return typed


def run(cfg, log=None):
    log = [] if log is None else log
    actor, critic = FakeActor(log), FakeCritic(log)

    def factory(config):
        groups = {"actor_rollout": FakeGroup(actor)}
        if config.algorithm.adv_estimator == "gae":
            groups["critic"] = FakeGroup(critic)
        return groups

    trainer = RayPPOTrainer(cfg, DecodeTok(), factory, reward_fn, reward_fn, make_dataset(), make_dataset(4))
    final = trainer.fit()
    trainer.shutdown()
    return trainer, final, actor, log


def test_grpo_steps_order_metrics_and_checkpoints(tmp_path):
    cfg = make_config(tmp_path)
    trainer, final, actor, log = run(cfg)
    # 8 prompts / batch 2 = 4 steps per epoch × 2 epochs
    assert trainer.total_training_steps == 8 and trainer.global_steps == 8
    assert cfg.actor_rollout_ref.actor.optim.total_training_steps == 8
    assert cfg.critic.optim.total_training_steps == 8
    # the first training generation: 2 prompts × n=2, interleaved (u1,u1,u2,u2), uids distinct per prompt
    gen_calls = [c for c in log if c[0] == "gen" and not c[1]]
    uids = gen_calls[0][2] + gen_calls[1][2]  # two shards
    assert uids[0] == uids[1] and uids[2] == uids[3] and uids[0] != uids[2]
    stages = [c[0] for c in log if c[0] != "gen"]
    assert stages[:3] == ["old_log_prob", "old_log_prob", "ref"]  # use_kl_loss → ref; 2 shards each
    assert "values" not in stages  # grpo: no critic
    assert actor.theta > 0
    metrics = read_metrics_jsonl(os.path.join(cfg.trainer.default_local_dir, "metrics.jsonl"))
    assert sorted(metrics) == list(range(0, 9))  # step 0: val_before_train
    step2 = metrics[2]
    for name in ("critic/score/mean", "critic/advantages/max", "response_length/mean", "prompt_length/max",
                 "actor/entropy", "actor/pg_loss", "actor/lr", "timing_s/gen", "timing_s/step", "timing_s/testing",
                 "timing_s/save_checkpoint", "timing_per_token_ms/gen", "perf/throughput", "perf/total_num_tokens",
                 "perf/time_per_step", "training/global_step", "training/epoch", "val-core/toy/acc/mean@2"):
        assert name in step2, name
    assert step2["actor/entropy"] == pytest.approx(0.5)
    assert step2["training/global_step"] == 2 and metrics[5]["training/epoch"] == 1
    assert step2["perf/throughput"] == pytest.approx(
        step2["perf/total_num_tokens"] / step2["perf/time_per_step"] / 2, rel=1e-6)
    assert "timing_s/testing" not in metrics[3] and "val-core/toy/acc/mean@2" in metrics[0]
    assert set(os.listdir(cfg.trainer.default_local_dir)) >= {"global_step_2", "global_step_4", "global_step_8",
                                                              "latest_checkpointed_iteration.txt"}
    import pandas as pd

    val = pd.read_parquet(os.path.join(cfg.trainer.validation_data_dir, "val_step_8.parquet"))
    assert len(val) == 8 and set(val["sample_idx"]) == {0, 1}  # 4 prompts × val n=2
    assert {"step", "data_source", "uid", "prompt", "response", "ground_truth", "score", "acc"} <= set(val.columns)
    assert final["training/global_step"] == 8


def test_rollout_is_balance_and_rollout_dump(tmp_path):
    cfg = make_config(tmp_path, total_training_steps=1, val_before_train=False, balance_batch=True,
                      rollout_data_dir=str(tmp_path / "rollouts"))
    cfg.algorithm.rollout_is_threshold = 2.0
    cfg.algorithm.rollout_is = True
    _, final, _, log = run(cfg)
    # log π_old − log π_rollout = 0.1 on every token → w = e^0.1 below the threshold 2
    assert final["rollout_corr/rollout_is_mean"] == pytest.approx(float(np.exp(0.1)), rel=1e-5)
    assert ("update_actor", True) in log
    assert "global_seqlen/balanced_max" in final and "timing_s/dump_rollout_generations" in final
    rows = [json.loads(x) for x in open(tmp_path / "rollouts" / "1.jsonl")]
    assert len(rows) == 4 and {"input", "output", "score", "step", "acc"} <= set(rows[0])
    cfg2 = make_config(tmp_path / "b", total_training_steps=1, val_before_train=False)
    cfg2.algorithm.rollout_is_threshold = 2.0  # metrics only: weights are not applied
    _, final2, _, log2 = run(cfg2)
    assert "rollout_corr/kl" in final2 and ("update_actor", False) in log2
    cfg3 = make_config(tmp_path / "c", total_training_steps=1, val_before_train=False)  # verl 0.9 keys
    rc = cfg3.algorithm.rollout_correction
    rc.rollout_is, rc.rollout_is_threshold, rc.rollout_is_batch_normalize = "sequence", 4.0, True
    rc.rollout_rs, rc.rollout_rs_threshold = "token_k1", 1.5  # ratio e^0.1 in [1/1.5, 1.5]: nothing rejected
    _, final3, _, log3 = run(cfg3)
    # Σ over the row of 0.1 → w = e^{0.1·T} ≤ 4, then ÷ its batch mean: 1
    assert final3["rollout_corr/rollout_is_batch_norm_factor"] > 1.0 and ("update_actor", True) in log3
    assert final3["rollout_corr/rollout_rs_masked_fraction"] == 0.0


def test_gae_uses_critic_and_warmup_delays_actor(tmp_path):
    cfg = make_config(tmp_path, critic_warmup=2, total_training_steps=3, val_before_train=False, test_freq=-1)
    cfg.algorithm.adv_estimator = "gae"
    cfg.actor_rollout_ref.actor.use_kl_loss = False
    trainer, final, actor, log = run(cfg)
    stages = [c[0] for c in log if c[0] != "gen"]
    # SEMANTICS: update_actor once global_step > critic_warmup = 2 → only at step 3 (verl's `<=` would also update
    # at step 2, leaving one warmup step instead of two)
    assert stages.count("update_critic") == 3 * 2 and stages.count("update_actor") == 1 * 2
    assert "ref" not in stages
    metrics = read_metrics_jsonl(os.path.join(cfg.trainer.default_local_dir, "metrics.jsonl"))
    assert "actor/pg_loss" not in metrics[2] and "actor/pg_loss" in metrics[3]
    assert {"critic/vf_loss", "critic/values/mean", "critic/vf_explained_var", "timing_s/values",
            "timing_s/update_critic"} <= set(metrics[1])
    assert os.path.isdir(os.path.join(cfg.trainer.default_local_dir, "global_step_3", "critic"))


def _drop_timing(m):
    return {k: v for k, v in m.items() if not k.startswith(("timing", "perf/time", "perf/throughput"))}


def test_stop_after_step_then_auto_resume_matches_uninterrupted(tmp_path):
    ref_cfg = make_config(tmp_path / "a", total_training_steps=6, save_freq=-1)
    ref_cfg.algorithm.adv_estimator = "gae"
    _, _, ref_actor, _ = run(ref_cfg)
    ref = read_metrics_jsonl(os.path.join(ref_cfg.trainer.default_local_dir, "metrics.jsonl"))

    cfg = make_config(tmp_path / "b", total_training_steps=6, save_freq=-1, stop_after_step=3)
    cfg.algorithm.adv_estimator = "gae"
    trainer, _, _, _ = run(cfg)
    assert trainer.global_steps == 3
    assert os.path.isdir(os.path.join(cfg.trainer.default_local_dir, "global_step_3", "actor"))
    first = read_metrics_jsonl(os.path.join(cfg.trainer.default_local_dir, "metrics.jsonl"))
    assert max(first) == 3
    cfg2 = make_config(tmp_path / "b", total_training_steps=6, save_freq=-1)
    cfg2.algorithm.adv_estimator = "gae"
    trainer2, _, actor2, _ = run(cfg2)
    assert trainer2.global_steps == 6 and actor2.theta == pytest.approx(ref_actor.theta)
    resumed = read_metrics_jsonl(os.path.join(cfg.trainer.default_local_dir, "metrics.jsonl"))
    for step in (4, 5, 6):
        a, b = _drop_timing(ref[step]), _drop_timing(resumed[step])
        assert a.keys() == b.keys()
        for k in a:
            if not k.startswith("val-"):  # uids are random; val metrics per-uid averages still match
                assert b[k] == pytest.approx(a[k], abs=1e-9), (step, k)


def test_adaptive_kl_in_reward_resumes_its_coefficient(tmp_path):
    def cfg_for(root, **kw):
        cfg = make_config(root, total_training_steps=4, save_freq=-1, val_before_train=False, test_freq=-1, **kw)
        cfg.algorithm.use_kl_in_reward = True
        cfg.algorithm.kl_ctrl.type = "adaptive"
        return cfg

    ref_cfg = cfg_for(tmp_path / "a")
    run(ref_cfg)
    ref = read_metrics_jsonl(os.path.join(ref_cfg.trainer.default_local_dir, "metrics.jsonl"))
    run(cfg_for(tmp_path / "b", stop_after_step=2))
    b_cfg = cfg_for(tmp_path / "b")
    run(b_cfg)
    got = read_metrics_jsonl(os.path.join(b_cfg.trainer.default_local_dir, "metrics.jsonl"))
    # β moves every step (adaptive); after the resume it continues from the saved value, not kl_coef
    assert ref[3]["actor/reward_kl_penalty_coeff"] != pytest.approx(0.001)
    for step in (3, 4):
        assert got[step]["actor/reward_kl_penalty_coeff"] == pytest.approx(ref[step]["actor/reward_kl_penalty_coeff"])


def test_resume_path_must_name_a_global_step_dir(tmp_path):
    cfg = make_config(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path / "global_step_3" / "actor"))
    with pytest.raises(ValueError, match="global_step_<N>"):
        run(cfg)


def test_resumed_at_the_end_trains_nothing_and_retention_applies(tmp_path):
    cfg = make_config(tmp_path, total_training_steps=3, save_freq=1, val_before_train=False, test_freq=-1,
                      max_actor_ckpt_to_keep=2)
    run(cfg)
    root = cfg.trainer.default_local_dir
    assert sorted(d for d in os.listdir(root) if d.startswith("global")) == ["global_step_2", "global_step_3"]
    # 8 prompts / 2 = 4 steps per epoch, but the run ends at 3: a resume must not train step 4
    trainer, final, _, log = run(make_config(tmp_path, total_training_steps=3, save_freq=1, val_before_train=False,
                                             test_freq=-1))
    assert trainer.global_steps == 3 and final == {} and not [c for c in log if c[0] == "update_actor"]
    # the same stop_after_step again after resuming there: nothing to do either
    trainer, final, _, log = run(make_config(tmp_path, total_training_steps=8, stop_after_step=3,
                                             val_before_train=False, test_freq=-1))
    assert trainer.global_steps == 3 and not [c for c in log if c[0] == "update_actor"]


class EntropyActor(FakeActor):
    """``compute_log_prob`` gives entropy ``t + 1`` at response position ``t`` and records the masks it saw."""

    def __init__(self, log):
        super().__init__(log)
        self.masks = []

    def compute_log_prob(self, batch):
        self.masks.append(batch["response_mask"].clone())
        lp = super().compute_log_prob(batch)["old_log_probs"]
        return Batch({"old_log_probs": lp, "entropys": (torch.arange(T) + 1.0).expand(len(batch), T).clone()})


def test_actor_entropy_is_the_rollout_batch_entropy_before_the_update(tmp_path):
    # verl: actor/entropy = agg_loss(entropys from compute_log_prob, response_mask, loss_agg_mode) of the rollout
    # batch, before any update (the workers' update metrics carry no actor/entropy to overwrite it).
    cfg = make_config(tmp_path, total_training_steps=1, val_before_train=False, test_freq=-1)
    actor = EntropyActor([])
    trainer = RayPPOTrainer(cfg, DecodeTok(), lambda c: {"actor_rollout": FakeGroup(actor)}, reward_fn, reward_fn,
                            make_dataset(), make_dataset(4))
    final = trainer.fit()
    trainer.shutdown()
    mask = torch.cat(actor.masks[:2]).float()  # step 1's two shards
    # token-mean: Σ (t+1)·mask / Σ mask over the 4 rows; the rows' lengths are 1..3, so the mean lies in [1, 2]
    expected = float(((torch.arange(T) + 1.0) * mask).sum() / mask.sum())
    assert final["actor/entropy"] == pytest.approx(expected, rel=1e-6)
    assert 1.0 <= expected <= 2.0 and "actor/pg_loss" in final


def test_wall_clock_budget_stops_validates_and_checkpoints(tmp_path):
    # A budget of 0 s is spent as soon as the first step ends: step 1 is the last one, and although test_freq and
    # save_freq (5) do not fall on step 1, it validates and checkpoints there, then the loop stops (8 steps planned).
    cfg = make_config(tmp_path, total_training_seconds=0, test_freq=5, save_freq=5, val_before_train=False)
    trainer, final, _, _ = run(cfg)
    assert trainer.total_training_steps == 8 and trainer.global_steps == 1
    assert "val-core/toy/acc/mean@2" in final and "timing_s/save_checkpoint" in final
    assert os.path.isdir(os.path.join(cfg.trainer.default_local_dir, "global_step_1"))
    assert final["timing_s/training_elapsed"] >= 0.0
    # a budget far above the run's length changes nothing: all 8 steps, and step 1 neither validates nor saves
    cfg2 = make_config(tmp_path / "b", total_training_seconds=3600, test_freq=5, save_freq=5, val_before_train=False)
    trainer2, final2, _, _ = run(cfg2)
    assert trainer2.global_steps == 8
    metrics = read_metrics_jsonl(os.path.join(cfg2.trainer.default_local_dir, "metrics.jsonl"))
    assert "timing_s/testing" not in metrics[1] and "timing_s/testing" in metrics[5]


def test_budget_running_out_after_the_steps_check_still_ends_on_a_checkpoint(tmp_path, monkeypatch):
    # The budget is looked at once per step, after the update. A run whose budget ran out just after that look (here:
    # the first look says "not spent", every later one "spent") used to be stopped by a second look in fit, with
    # neither validation nor checkpoint (a 480 s Countdown run ended at step 416 with "checkpoint: None"). Now the
    # step's decision is the only one: step 1 is not last, step 2 is, and it validates and checkpoints.
    looks = iter([False])
    monkeypatch.setattr(RayPPOTrainer, "budget_spent", lambda self: next(looks, True))
    cfg = make_config(tmp_path, total_training_seconds=60, test_freq=5, save_freq=5, val_before_train=False)
    trainer, final, _, _ = run(cfg)
    assert trainer.global_steps == 2
    assert "val-core/toy/acc/mean@2" in final and "timing_s/save_checkpoint" in final
    assert os.path.isdir(os.path.join(cfg.trainer.default_local_dir, "global_step_2"))


class RemoteFakeGroup(FakeGroup):
    """As if the ranks were Ray actors: they compute elsewhere, the driver only keeps the books."""

    in_process = False


@pytest.mark.parametrize("group_cls, threads_while_training", [(FakeGroup, 2), (RemoteFakeGroup, 1)])
def test_driver_of_remote_ranks_keeps_one_thread_until_shutdown(tmp_path, group_cls, threads_while_training):
    # in-process ranks (a group without in_process counts as one) compute on the driver's threads (2 here); remote
    # ones leave it bookkeeping on threads.DRIVER_THREADS = 1, and shutdown gives the driver back the 2 it had
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        actor = FakeActor([])
        trainer = RayPPOTrainer(make_config(tmp_path, total_epochs=1), DecodeTok(),
                                lambda c: {"actor_rollout": group_cls(actor)}, reward_fn, reward_fn, make_dataset(4))
        trainer.init_workers()
        seen.append(torch.get_num_threads())
        trainer.fit()
        seen.append(torch.get_num_threads())
        trainer.shutdown()
        assert seen == [threads_while_training] * 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_async_reward_fn_gives_the_same_training(tmp_path):
    # reward_model.launch_reward_fn_async: the manager runs in a thread during old_log_prob/ref; same scores, same run
    results = []
    for launch_async in (False, True):
        cfg = make_config(tmp_path / str(launch_async))
        cfg.reward_model.launch_reward_fn_async = launch_async
        trainer, final, actor, _ = run(cfg)
        metrics = read_metrics_jsonl(os.path.join(cfg.trainer.default_local_dir, "metrics.jsonl"))
        results.append((actor.theta, [metrics[s]["critic/score/mean"] for s in range(1, 9)]))
    assert results[0] == results[1]
