"""A user's explicit value is never rewritten, and defaults come from rlhf_core/configs/*.yaml only.

Before the typed config, ``int(data.get("seed", 1) or 1)`` turned ``data.seed=0`` and ``trainer.seed=0`` into 1, and
code defaults had drifted from the YAML (``balance_batch`` False vs True, ``data.seed`` 1 vs 42, ``rollout.name``
"hf" vs "vllm"). (``optim.stable_ratio=0`` is in test_lr_schedule.py.)
"""
from __future__ import annotations

import torch

from rlhf_core.trainer.ppo_trainer import RayPPOTrainer
from rlhf_core.trainer.sft_trainer import SFTTrainer

from tests.fixtures.config_fixtures import typed_config
from tests.rlhf_core.trainer.test_trainer_ppo import DecodeTok, make_config, make_dataset, reward_fn, run


def _ppo_trainer(cfg):
    return RayPPOTrainer(cfg, DecodeTok(), lambda config: {}, reward_fn, None, make_dataset())


def test_data_seed_zero_stays_zero_and_the_default_is_the_yamls(tmp_path):
    cfg = make_config(tmp_path)
    cfg.data.seed = 0
    assert _ppo_trainer(cfg).train_dataloader.seed == 0  # was 1 (`or 1`)
    cfg = make_config(tmp_path)
    cfg.data.seed = typed_config("ppo_trainer").data.seed  # what a loaded config holds when the user sets nothing
    assert _ppo_trainer(cfg).train_dataloader.seed == 42  # the YAML's default (the code said 1)


def test_sft_trainer_seed_zero_stays_zero(tmp_path):
    cfg = typed_config("sft_trainer", "trainer.seed=0", "data.train_batch_size=2", "trainer.n_gpus_per_node=1",
                       f"trainer.default_local_dir={tmp_path}")
    items = [{"input_ids": torch.tensor([i])} for i in range(4)]
    trainer = SFTTrainer(cfg, items)
    assert trainer.train_loader.seed == 0  # was 1 (`or 1`)
    assert trainer.total_steps == 2 * cfg.trainer.total_epochs  # 4 rows / batch 2, total_training_steps null


def test_drifted_defaults_are_the_schemas():
    cfg = typed_config("ppo_trainer")
    assert cfg.trainer.balance_batch is True and cfg.data.seed == 42
    assert cfg.actor_rollout_ref.rollout.name == "vllm"


def test_balance_batch_at_the_yaml_default_balances(tmp_path):
    # make_config turns balancing off for the order-sensitive tests; the YAML's value (True) balances:
    # the balancing metrics appear.
    default = typed_config("ppo_trainer").trainer.balance_batch
    cfg = make_config(tmp_path, total_training_steps=1, val_before_train=False, balance_batch=default)
    _, final, _, _ = run(cfg)
    assert "global_seqlen/balanced_max" in final


def test_deprecated_global_micro_batch_sizes_reach_their_per_gpu_keys():
    # the deprecated global keys have their effect through load_config's conversion (÷ world size), which is
    # why no worker reads them (tests/integration/test_config_reads_e2e.py EFFECT_TESTS points here)
    import warnings

    from rlhf_core.config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        sft = load_config("sft_trainer", ["trainer.n_gpus_per_node=2", "data.train_batch_size=8",
                                          "data.micro_batch_size_per_gpu=null", "data.micro_batch_size=4"])
        ppo = load_config("ppo_trainer", ["trainer.n_gpus_per_node=2", "data.train_batch_size=8",
                                          "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                          "critic.forward_micro_batch_size=8"])
    assert sft.data.micro_batch_size_per_gpu == 2 and sft.data.micro_batch_size is None  # 4 / world 2
    assert ppo.critic.forward_micro_batch_size_per_gpu == 4 and ppo.critic.forward_micro_batch_size is None
