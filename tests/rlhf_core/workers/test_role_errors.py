"""Errors about a model path, ``fsdp_size``, micro-batch keys or a worker's return name the role and the full key."""
from __future__ import annotations

import pytest
import torch

from rlhf_core.protocol import Batch
from rlhf_core.config.structured import full_key
from rlhf_core.workers.fsdp_utils import mesh_shape
from rlhf_core.workers.model_setup import build_model, micro_per_rank

from tests.fixtures.config_fixtures import typed_config


def test_worker_return_of_the_wrong_size_names_the_role():
    batch, out = Batch({"a": torch.zeros(4, 1)}), Batch({"values": torch.zeros(3, 1)})
    with pytest.raises(ValueError, match="critic compute_values returned 3 rows for a batch of 4"):
        batch.merge(out, "critic compute_values")


@pytest.mark.parametrize("section, role, word", [
    ("actor_rollout_ref", "actor", "actor"), ("actor_rollout_ref", "ref", "reference"),
    ("critic", "critic", "critic")])
def test_missing_model_path_names_role_and_key(tmp_path, section, role, word):
    cfg = typed_config("ppo_trainer", f"actor_rollout_ref.model.path={tmp_path}/nope",
                       f"critic.model.path={tmp_path}/nope")
    fsdp = cfg.actor_rollout_ref.actor.fsdp_config if section != "critic" else cfg.critic.fsdp
    with pytest.raises(FileNotFoundError, match=rf"^{word}: {section}.model.path='{tmp_path}/nope'"):
        build_model(cfg[section].model, fsdp, role, value_head=role == "critic")


def test_fsdp_size_error_names_role_and_key():
    cfg = typed_config("ppo_trainer")
    key = full_key(cfg.critic.fsdp, "fsdp_size")
    assert key == "critic.fsdp.fsdp_size"
    with pytest.raises(ValueError, match="^critic: critic.fsdp.fsdp_size=3 must divide the world size 4"):
        mesh_shape(3, 4, key, "critic")
    assert mesh_shape(2, 4, key, "critic") == (2, 2) and mesh_shape(-1, 4) == (4,) and mesh_shape(8, 4) == (4,)


def test_micro_batch_errors_name_the_full_keys():
    cfg = typed_config("ppo_trainer", "actor_rollout_ref.ref.log_prob_micro_batch_size=4",
                       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2")
    with pytest.raises(ValueError, match="set only one of actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu "
                                         "and the deprecated actor_rollout_ref.ref.log_prob_micro_batch_size"):
        micro_per_rank(cfg.actor_rollout_ref.ref, "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size",
                       False)
