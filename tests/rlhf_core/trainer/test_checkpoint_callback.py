"""trainer.checkpoint_callback_class (verl 0.9): a class, named by dotted path, built with the config; its on_save
runs on the driver after each checkpoint save completes (the fake-worker PPO loop of test_trainer_ppo.py)."""
from __future__ import annotations

import os

import pytest

from rlhf_core.trainer.checkpoint_callback import CheckpointCallback
from tests.rlhf_core.trainer.test_trainer_ppo import make_config, run

EVENTS: list[tuple] = []


class Recorder(CheckpointCallback):
    def on_save(self, trainer, global_step, checkpoint_dir, async_save=False, **kwargs):
        tracker = os.path.join(os.path.dirname(checkpoint_dir), "latest_checkpointed_iteration.txt")
        with open(tracker) as fh:  # the save (tracker included) is complete when the hook runs
            latest = int(fh.read())
        EVENTS.append((global_step, os.path.basename(checkpoint_dir), latest, async_save,
                       self.config.trainer.experiment_name, trainer.global_steps))


def test_on_save_runs_after_each_save(tmp_path):
    EVENTS.clear()
    cfg = make_config(tmp_path, total_training_steps=4, val_before_train=False,
                      checkpoint_callback_class=f"{__name__}.Recorder")
    run(cfg)
    # save_freq 2 over 4 steps: saves at 2 and 4, each followed by its hook
    assert EVENTS == [(2, "global_step_2", 2, False, "e", 2), (4, "global_step_4", 4, False, "e", 4)]


@pytest.mark.parametrize("path,message", [("Recorder", "dotted path"), ("no_such_pkg_x.Cb", "does not import"),
                                          (f"{__name__}.Missing", "has no 'Missing'"),
                                          ("os.path", "has no on_save")])
def test_a_bad_class_path_fails_when_the_trainer_is_built(tmp_path, path, message):
    with pytest.raises(ValueError, match=f"trainer.checkpoint_callback_class=.*{message}"):
        run(make_config(tmp_path, total_training_steps=1, checkpoint_callback_class=path))
