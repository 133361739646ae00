"""An output place where nothing can be written is refused in one line naming the key and value, before the model
loads or Ray starts: ``trainer.default_local_dir`` of ``rlhf ppo`` and ``rlhf sft``, ``data.output_path`` of
``rlhf generate`` (found by a user's trial: each used to fail only at its first write, ``rlhf generate`` after
generating every response). The file system is real: a tmpfs mounted read-only; the tests skip where this process
may not mount."""
from __future__ import annotations

import pytest

from rlhf_core.config import ConfigError, load_config
from rlhf_core.storage import unwritable_output
from tests.reliability.test_full_disk_stores import mounted_tmpfs


@pytest.fixture
def read_only_disk(tmp_path):
    """A fresh tmpfs mounted read-only at ``tmp_path/ro`` (unmounted afterwards)."""
    yield from mounted_tmpfs(tmp_path / "ro", "size=1m,ro")


def _refused(key: str, path) -> str:
    return (f"{key}={str(path)!r}: nothing can be written there (Read-only file system); give a writable folder, "
            "checked before any model loads")


def test_unwritable_output_names_the_key_for_a_folder_to_be_created_on_a_read_only_disk(read_only_disk, tmp_path):
    # a folder that does not exist yet is judged by its nearest existing folder (the read-only mount)
    assert unwritable_output("k", read_only_disk / "a" / "b") == _refused("k", read_only_disk / "a" / "b")
    assert unwritable_output("k", tmp_path / "new" / "folder") is None  # a writable place: no complaint


def _no(what: str):
    def fail(*args, **kwargs):
        raise AssertionError(f"{what} ran before the output place was checked")
    return fail


def test_rlhf_ppo_refuses_a_read_only_default_local_dir_before_models_and_ray(read_only_disk, tmp_path, monkeypatch):
    import rlhf_core.trainer.main_ppo as main_ppo

    monkeypatch.setattr(main_ppo, "check_model_paths", _no("the model check"))
    monkeypatch.setattr(main_ppo, "init_ray", _no("ray.init"))
    ckpt = read_only_disk / "ckpt"
    config = load_config("ppo_trainer", [
        "actor_rollout_ref.model.path=/nonexistent/model", "data.train_files=/nonexistent/train.parquet",
        "data.val_files=null", "trainer.n_gpus_per_node=1", "data.train_batch_size=4", "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", f"trainer.default_local_dir={ckpt}"])
    with pytest.raises(ConfigError) as info:
        main_ppo.run_ppo(config)
    assert str(info.value) == _refused("trainer.default_local_dir", ckpt)


def test_rlhf_generate_refuses_a_read_only_output_path_before_the_model(read_only_disk, tmp_path, monkeypatch):
    import rlhf_core.trainer.main_generation as gen

    monkeypatch.setattr(gen, "_check_model", _no("the model check"))
    monkeypatch.setattr(gen, "load_causal_lm", _no("the model load"))
    out = read_only_disk / "responses.parquet"
    config = load_config("generation", ["data.path=/nonexistent/prompts.parquet", "model.path=/nonexistent/model",
                                        f"data.output_path={out}", "trainer.device=cpu"])
    with pytest.raises(ConfigError) as info:
        gen.run_generation(config)
    assert str(info.value) == _refused("data.output_path", out)


def test_rlhf_sft_refuses_a_read_only_default_local_dir_before_the_model(read_only_disk, monkeypatch):
    import rlhf_core.trainer.sft_trainer as sft

    monkeypatch.setattr(sft, "check_local_path", _no("the model check"))
    ckpt = read_only_disk / "sft"
    config = load_config("sft_trainer", ["data.train_files=/nonexistent/sft.parquet", "data.val_files=null",
                                         "model.partial_pretrain=/nonexistent/model", "trainer.n_gpus_per_node=1",
                                         f"trainer.default_local_dir={ckpt}"])
    with pytest.raises(ConfigError) as info:
        sft.run_sft(config)
    assert str(info.value) == _refused("trainer.default_local_dir", ckpt)
