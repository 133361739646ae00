"""PPO driver keys with the fake worker groups of test_trainer_ppo: data.validation_shuffle, data.sampler (curriculum
update), datagen's on_batch_end, skip.rollout.enable/dump_dir, rollout.over_sample_rate, global_profiler and
the role profiler blocks (tool torch), checkpoint.async_save."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from omegaconf import OmegaConf

from tests.rlhf_core.trainer.test_trainer_ppo import (  # noqa: E402
    DecodeTok, FakeActor, FakeGroup, make_config, make_dataset, reward_fn)

from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.trainer.checkpoint_manager import TRACKER_FILE, find_latest_checkpoint  # noqa: E402
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer  # noqa: E402
from rlhf_core.trainer.rollout_control import abort_slowest  # noqa: E402
from rlhf_core.workers.profiler import ProfiledWorker  # noqa: E402


class PadTok(DecodeTok):
    pad_token_id = 0


class IndexActor(FakeActor):
    """Records the dataset ``index`` of every generated row and the response masks it trained on."""

    def __init__(self, log):
        super().__init__(log)
        self.indices, self.trained_masks = [], []

    def generate_sequences(self, batch: Batch) -> Batch:
        if not batch.meta.get("validate", False):
            self.indices.append([int(i) for i in batch["index"]])
        return super().generate_sequences(batch)

    def update_actor(self, batch):
        self.trained_masks.append(batch["response_mask"].clone())
        return super().update_actor(batch)


def _fit(cfg, actor, train=None, val=None):
    trainer = RayPPOTrainer(cfg, PadTok(), lambda c: {"actor_rollout": FakeGroup(actor, world_size=1)}, reward_fn,
                            reward_fn, train if train is not None else make_dataset(), val)
    trainer.fit()
    trainer.shutdown()
    return trainer


def _steps(tmp_path, n, **trainer):
    return make_config(tmp_path, total_training_steps=n, val_before_train=False, test_freq=-1, save_freq=-1,
                       **trainer)


def test_validation_shuffle_is_seeded_by_data_seed(tmp_path):
    cfg = make_config(tmp_path)
    trainer = RayPPOTrainer(cfg, PadTok(), lambda c: {}, reward_fn, reward_fn, make_dataset(), make_dataset(6))
    assert [int(i) for i in next(iter(trainer.val_dataloader))["index"]] == list(range(6))  # default False
    cfg.data.validation_shuffle = True
    trainer = RayPPOTrainer(cfg, PadTok(), lambda c: {}, reward_fn, reward_fn, make_dataset(), make_dataset(6))
    expected = torch.randperm(6, generator=torch.Generator().manual_seed(7)).tolist()  # data.seed = 7
    assert [int(i) for i in next(iter(trainer.val_dataloader))["index"]] == expected != list(range(6))


CURRICULUM = '''
from rlhf_core.data.sampler import AbstractCurriculumSampler

class RepeatFirst(AbstractCurriculumSampler):
    """Sequential order; after each step, that step's first prompt is queued again right away."""
    def __init__(self, data_source, data_config):
        self.queue, self.n, self.seen = list(range(len(data_source))), len(data_source), []

    def __iter__(self):
        while self.queue:
            yield self.queue.pop(0)

    def __len__(self):
        return self.n

    def update(self, batch):
        self.seen.append((len(batch), "token_level_scores" in batch, "advantages" in batch))
        self.queue.insert(0, int(batch["index"][0]))
'''


def test_curriculum_sampler_gets_each_step_and_reorders_the_next(tmp_path):
    (tmp_path / "cur.py").write_text(CURRICULUM)
    cfg = _steps(tmp_path, 3)
    cfg.data.sampler.merge_with({"class_path": str(tmp_path / "cur.py"), "class_name": "RepeatFirst"})
    actor = IndexActor([])
    trainer = _fit(cfg, actor)
    # update(batch) after every step with the step's whole batch: 2 prompts × n=2, scored, with advantages
    assert trainer.train_dataloader.sampler.seen == [(4, True, True)] * 3
    # the sampler's order (not the seeded shuffle), each step starting with the previous step's first prompt
    assert actor.indices == [[0, 0, 1, 1], [0, 0, 2, 2], [0, 0, 3, 3]]


class GrowingData(list):
    """A dataset with verl's ``on_batch_end`` hook (what data.datagen gives the trainer)."""

    def __init__(self, items):
        super().__init__(items)
        self.calls = []

    def on_batch_end(self, batch):
        self.calls.append(len(batch))


def test_dataset_on_batch_end_is_called_after_every_step(tmp_path):
    data = GrowingData(make_dataset())
    _fit(_steps(tmp_path, 3), IndexActor([]), train=data)
    assert data.calls == [4, 4, 4]


def test_skip_rollout_dumps_then_replays_each_steps_generation(tmp_path):
    cfg = _steps(tmp_path, 2)
    cfg.skip.rollout.enable = True
    cfg.skip.rollout.dump_dir = str(tmp_path / "dump")
    first = IndexActor([])
    _fit(cfg, first)
    folder = tmp_path / "dump" / "e_p_GBS2__N2"  # experiment e, project p, train_batch_size 2, n 2
    assert sorted(os.listdir(folder)) == ["step_1.pt", "step_2.pt"]
    dumped = torch.load(folder / "step_2.pt", weights_only=False)["tensors"]["responses"]
    # a second run whose engine would answer differently (theta shifted) replays the dumps instead
    cfg.trainer.default_local_dir = str(tmp_path / "ckpt2")
    second = IndexActor([])
    second.theta = 5.0
    _fit(cfg, second)
    assert second.indices == []  # the engine was never asked for a training generation
    assert first.indices  # ...while the first run did generate
    trained = second.trained_masks[1]
    assert torch.equal(trained, torch.load(folder / "step_2.pt", weights_only=False)["tensors"]["response_mask"])
    assert dumped.shape == (4, 3)


def test_abort_slowest_pads_the_longest_responses():
    # lengths 3, 1, 2, 3: finishing order by (length, row) = rows 1, 2, 0, 3
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    out = Batch({"responses": torch.full((4, 3), 7) * mask, "response_mask": mask.clone(),
                 "attention_mask": torch.cat([torch.ones(4, 2, dtype=torch.long), mask], 1),
                 "input_ids": torch.cat([torch.full((4, 2), 5), torch.full((4, 3), 7) * mask], 1)})
    quarter, n = abort_slowest(out, 0.25, pad_token_id=0)  # keep int(4 × 0.75) = 3: row 3 aborted
    assert n == 1 and quarter["response_mask"].sum(-1).tolist() == [3, 1, 2, 0]
    assert quarter["responses"][3].tolist() == [0, 0, 0] and quarter["attention_mask"][3].tolist() == [1, 1, 0, 0, 0]
    assert quarter["input_ids"][3].tolist() == [5, 5, 0, 0, 0]
    half, n = abort_slowest(out, 0.5, pad_token_id=0)  # keep 2: rows 0 and 3 (length 3) aborted
    assert n == 2 and half["response_mask"].sum(-1).tolist() == [0, 1, 2, 0]
    assert abort_slowest(out, 0.0, 0)[1] == 0 and torch.equal(out["response_mask"], mask)  # input untouched


def test_over_sample_rate_outside_0_1_fails_at_load():
    import pytest

    from rlhf_core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"over_sample_rate=1.0 must be in \[0, 1\)"):
        load_config("ppo_trainer", ["actor_rollout_ref.rollout.over_sample_rate=1.0"])


def test_over_sample_rate_masks_rows_out_of_the_update(tmp_path):
    cfg = _steps(tmp_path, 1)
    cfg.actor_rollout_ref.rollout.over_sample_rate = 0.5
    actor = IndexActor([])
    _fit(cfg, actor)
    rows_with_tokens = int((actor.trained_masks[0].sum(-1) > 0).sum())
    assert rows_with_tokens == 2  # 4 responses, int(4 × 0.5) = 2 kept


class ProfiledActor(ProfiledWorker, IndexActor):
    profiler_role, profiler_key = "actor", "actor_rollout_ref.actor.profiler"

    def __init__(self, log, config):
        IndexActor.__init__(self, log)
        self.config = config

    def update_actor(self, batch):
        torch.randn(64, 64) @ torch.randn(64, 64)  # something for the trace to show
        return super().update_actor(batch)


def _profiler_cfg(tmp_path, steps, continuous=False, enable=True):
    cfg = _steps(tmp_path, 4)
    cfg.global_profiler.merge_with({"tool": "torch", "steps": steps, "profile_continuous_steps": continuous,
                                    "save_path": str(tmp_path / "prof")})
    cfg.actor_rollout_ref.actor.profiler.merge_with({"tool": "torch", "enable": enable, "all_ranks": False,
                                                     "ranks": [], "save_path": str(tmp_path / "prof")})
    return cfg


def test_torch_profiler_writes_a_chrome_trace_per_listed_step(tmp_path):
    cfg = _profiler_cfg(tmp_path, [2, 3])
    _fit(cfg, ProfiledActor([], cfg))
    assert sorted(os.listdir(tmp_path / "prof")) == ["step_2", "step_3"]
    trace = json.loads((tmp_path / "prof" / "step_2" / "actor_rank_0.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "aten::mm" in names  # the update's matmul, recorded on the worker


def test_continuous_steps_make_one_trace_and_disabled_roles_none(tmp_path):
    cfg = _profiler_cfg(tmp_path, [2, 3, 4], continuous=True)
    _fit(cfg, ProfiledActor([], cfg))
    assert os.listdir(tmp_path / "prof") == ["step_2"]  # steps 2-4 in one trace, named by its first step
    cfg = _profiler_cfg(tmp_path / "off", [2], enable=False)
    _fit(cfg, ProfiledActor([], cfg))
    assert not (tmp_path / "off" / "prof").exists()  # actor.profiler.enable False: the worker records nothing


def test_continuous_trace_is_written_when_the_budget_ends_the_run_inside_it(tmp_path):
    # steps 1-3 profiled as one trace; a budget of 0 s makes step 1 the last: the trace must still be stopped and
    # written (the loop used to tell the profiler only about the step count, so the trace was never stopped)
    cfg = _profiler_cfg(tmp_path, [1, 2, 3], continuous=True)
    cfg.trainer.total_training_seconds = 0
    _fit(cfg, ProfiledActor([], cfg))
    assert os.listdir(tmp_path / "prof") == ["step_1"]
    assert (tmp_path / "prof" / "step_1" / "actor_rank_0.json").is_file()


class AsyncActor(IndexActor):
    """save_checkpoint returns at once; the files appear only in wait_checkpoint (like the DCP writer thread)."""

    def __init__(self, log, root):
        super().__init__(log)
        self.root, self.pending = root, None

    def save_checkpoint(self, path, hdfs_path=None, global_step=0):
        self.pending = (path, self.theta, global_step)
        self.log.append(("save", global_step))

    def wait_checkpoint(self):
        if self.pending is None:
            return None
        path, theta, step = self.pending
        assert find_latest_checkpoint(self.root) != os.path.dirname(path)  # tracker not yet pointing here
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "state.json"), "w") as fh:
            json.dump({"theta": theta}, fh)
        self.log.append(("wait", step))
        self.pending = None
        return path


def test_async_save_writes_the_tracker_only_after_the_files(tmp_path):
    cfg = make_config(tmp_path, total_training_steps=4, val_before_train=False, test_freq=-1, save_freq=2)
    cfg.actor_rollout_ref.actor.checkpoint.async_save = True
    log = []
    actor = AsyncActor(log, cfg.trainer.default_local_dir)
    _fit(cfg, actor)
    events = [e for e in log if e[0] in ("save", "wait")]
    # step 2's files are waited for when step 4 saves; step 4's at the end of fit
    assert events == [("save", 2), ("wait", 2), ("save", 4), ("wait", 4)]
    assert (Path(cfg.trainer.default_local_dir) / TRACKER_FILE).read_text().strip() == "4"
    assert json.loads((Path(cfg.trainer.default_local_dir) / "global_step_4" / "actor" / "state.json").read_text())
    assert OmegaConf.select(cfg, "critic.checkpoint.async_save") is False
