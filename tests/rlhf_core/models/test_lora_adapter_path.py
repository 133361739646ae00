"""``model.lora_adapter_path`` (verl 0.9): the actor, critic and SFT start from a saved PEFT adapter (trainable),
and an adapter that is missing or contradicts ``lora_rank`` / ``lora_alpha`` / ``target_modules`` is named before
any model loads."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.fixtures.config_fixtures import typed_config  # noqa: E402

from rlhf_core.models.lora import apply_lora, check_lora_adapter  # noqa: E402

M = "actor_rollout_ref.model"


def _saved_adapter(model, out, seed: int) -> dict[str, torch.Tensor]:
    """Give ``model``'s adapters (and a critic's score head) random non-zero values, save the adapter to ``out``;
    returns the trained tensors (name → value) as the worker's state dict names them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:  # lora_A/B (B starts at 0 in a fresh adapter) and a critic's score head
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(str(out))
    return {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k or "modules_to_save" in k}


@pytest.fixture(scope="module")
def lm_adapter(tiny_model_dir, tmp_path_factory):
    from rlhf_core.models.loading import load_causal_lm

    out = tmp_path_factory.mktemp("adapter") / "lm"
    return str(out), _saved_adapter(apply_lora(load_causal_lm(tiny_model_dir), 4, 8), out, seed=3)


def _assert_loaded(state: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> None:
    assert saved and any("lora_B" in k for k in saved)
    for k, v in saved.items():  # a fresh adapter has lora_B == 0 and other random A's: these would differ
        torch.testing.assert_close(state[k].float(), v.float(), rtol=0, atol=0, msg=k)


def test_actor_and_its_rollout_copy_start_from_the_adapter(tiny_model_dir, lm_adapter):
    from tests.rlhf_core.workers.test_workers_fsdp import ppo_config

    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker

    path, saved = lm_adapter
    cfg = ppo_config(tiny_model_dir, f"{M}.lora_rank=4", f"{M}.lora_alpha=8", f"{M}.lora_adapter_path={path}")
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    try:
        wg.execute_all("init_model")
        _assert_loaded(wg.worker.get_state_dict(), saved)
        _assert_loaded(wg.worker.rollout.module.state_dict(), saved)  # the HF rollout generates with it
        trainable = {n for n, p in wg.worker.actor_module.named_parameters() if p.requires_grad}
        assert trainable and all("lora_" in n for n in trainable)  # is_trainable=True: adapters train, base frozen
    finally:
        wg.shutdown()


def test_critic_starts_from_its_adapter_and_head(tiny_model_dir, tmp_path):
    from tests.rlhf_core.workers.test_workers_fsdp import ppo_config

    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.models.loading import load_value_model
    from rlhf_core.workers.fsdp_workers import CriticWorker

    saved = _saved_adapter(apply_lora(load_value_model(tiny_model_dir), 4, task_type="TOKEN_CLS"), tmp_path / "v", 5)
    assert any("score" in k for k in saved)  # the value head is saved with the adapter (modules_to_save)
    cfg = ppo_config(tiny_model_dir, "critic.model.lora_rank=4", f"critic.model.lora_adapter_path={tmp_path / 'v'}")
    wg = LocalWorkerGroup(CriticWorker, {"config": cfg})
    try:
        wg.execute_all("init_model")
        _assert_loaded(wg.worker.get_state_dict(), saved)
    finally:
        wg.shutdown()


def test_missing_or_contradicting_adapter_is_named(tiny_model_dir, lm_adapter, tmp_path):
    path, _ = lm_adapter
    ok = typed_config("ppo_trainer", f"{M}.lora_rank=4", f"{M}.lora_alpha=8", f"{M}.lora_adapter_path={path}")
    assert check_lora_adapter(ok.actor_rollout_ref.model)["r"] == 4
    assert check_lora_adapter(typed_config("ppo_trainer").actor_rollout_ref.model) is None
    with pytest.raises(FileNotFoundError, match=rf"{M}.lora_adapter_path='{tmp_path}/nope'"):
        check_lora_adapter(typed_config("ppo_trainer", f"{M}.lora_adapter_path={tmp_path}/nope").actor_rollout_ref.model)
    with pytest.raises(FileNotFoundError, match=r"adapter_config.json is missing"):  # a folder, but no adapter
        check_lora_adapter(typed_config("ppo_trainer", f"{M}.lora_rank=4", f"{M}.lora_adapter_path={tiny_model_dir}"
                                        ).actor_rollout_ref.model)
    bad = {"rank r=4, but critic.model.lora_rank=8": ["critic.model.lora_rank=8"],
           "rank r=4, but critic.model.lora_rank=0": [],
           "lora_alpha=8, but critic.model.lora_alpha=16": ["critic.model.lora_rank=4"],
           r"but critic.model.target_modules=\['q_proj'\]": ["critic.model.lora_rank=4", "critic.model.lora_alpha=8",
                                                             "critic.model.target_modules=[q_proj]"]}
    for message, overrides in bad.items():
        cfg = typed_config("ppo_trainer", f"critic.model.lora_adapter_path={path}", *overrides)
        with pytest.raises(ValueError, match=rf"critic.model.lora_adapter_path='{path}': .*{message}"):
            check_lora_adapter(cfg.critic.model)


def test_driver_refuses_a_missing_adapter_before_ray(tiny_model_dir, tmp_path):
    from rlhf_core.trainer.main_ppo import check_model_paths

    base = [f"{M}.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}"]
    check_model_paths(typed_config("ppo_trainer", *base))
    with pytest.raises(FileNotFoundError, match=rf"{M}.lora_adapter_path='{tmp_path}/gone'"):
        check_model_paths(typed_config("ppo_trainer", *base, f"{M}.lora_adapter_path={tmp_path}/gone"))
    # the critic's adapter is checked when the critic is in use (algorithm.adv_estimator=gae: the default)
    with pytest.raises(FileNotFoundError, match=rf"critic.model.lora_adapter_path='{tmp_path}/gone'"):
        check_model_paths(typed_config("ppo_trainer", *base, f"critic.model.lora_adapter_path={tmp_path}/gone"))
