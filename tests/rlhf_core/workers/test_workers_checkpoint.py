"""Checkpoint save → load restores weights, optimizer and LR state bit-exactly; the merger makes an HF dir."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.rlhf_core.workers.test_workers_fsdp import ppo_config, training_batch  # noqa: E402

from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402
from rlhf_core.workers.merger import main as merge_main  # noqa: E402


def _optim_state(worker) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    sd = get_optimizer_state_dict(worker.actor_module, worker.optimizer, options=StateDictOptions(full_state_dict=True))
    return {f"{p}.{k}": v.clone() for p, st in sd["state"].items() for k, v in st.items()}


def _new_group(cfg):
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    wg.execute_all("init_model")
    return wg


def test_save_load_roundtrip_and_merge(tiny_model_dir, tmp_path):
    cfg = ppo_config(tiny_model_dir, "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
                     "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]")
    wg = _new_group(cfg)
    batch = training_batch(wg, seed=7)
    wg.execute_dp("update_actor", batch)
    ckpt = str(tmp_path / "global_step_1" / "actor")
    wg.execute_all("save_checkpoint", ckpt, None, 1)
    assert sorted(os.listdir(ckpt)) == ["extra_state_world_size_1_rank_0.pt", "huggingface", "model", "optim"]
    assert not os.path.exists(ckpt + ".tmp")
    saved_w, saved_o = wg.worker.get_state_dict(), _optim_state(wg.worker)
    saved_lr = wg.worker.lr_scheduler.get_last_lr()[0]
    # the run continues: the next update from the saved state is the reference for the resumed one
    m_cont = wg.execute_dp("update_actor", batch)[0]
    w_cont = wg.worker.get_state_dict()

    fresh = _new_group(cfg)
    assert any(not torch.equal(fresh.worker.get_state_dict()[k], saved_w[k]) for k in saved_w)
    fresh.execute_all("load_checkpoint", ckpt)
    w, o = fresh.worker.get_state_dict(), _optim_state(fresh.worker)
    assert all(torch.equal(w[k], saved_w[k]) for k in saved_w)
    assert o.keys() == saved_o.keys() and all(torch.equal(o[k], saved_o[k]) for k in o)
    assert fresh.worker.lr_scheduler.get_last_lr()[0] == saved_lr  # warmup 3: step 1 → 2/4 of the LR
    assert saved_lr == pytest.approx(1e-3 * 2 / 4)
    # the rollout engine was re-synced with the loaded weights
    assert torch.equal(fresh.worker.rollout.module.state_dict()["lm_head.weight"], saved_w["lm_head.weight"])
    m_res = fresh.execute_dp("update_actor", batch)[0]
    assert m_res["actor/pg_loss"] == m_cont["actor/pg_loss"] and m_res["actor/lr"] == m_cont["actor/lr"]
    assert all(torch.equal(fresh.worker.get_state_dict()[k], w_cont[k]) for k in w_cont)

    # merge into a plain HF directory, load it with AutoModelForCausalLM and generate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = str(tmp_path / "merged")
    assert merge_main(["--local-dir", ckpt, "--target-dir", target]) == 0
    model = AutoModelForCausalLM.from_pretrained(target)
    tok = AutoTokenizer.from_pretrained(target)
    merged = model.state_dict()
    assert all(torch.equal(merged[k], saved_w[k]) for k in saved_w)
    ids = tok("Natalia sold clips", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]
    assert merge_main(["--local-dir", str(tmp_path), "--target-dir", target]) == 1  # not a checkpoint folder


def test_async_save_snapshots_the_state_and_writes_in_the_background(tiny_model_dir, tmp_path):
    cfg = ppo_config(tiny_model_dir, "actor_rollout_ref.actor.checkpoint.async_save=True")
    wg = _new_group(cfg)
    batch = training_batch(wg, seed=3)
    wg.execute_dp("update_actor", batch)
    saved_w, saved_o = wg.worker.get_state_dict(), _optim_state(wg.worker)
    ckpt = str(tmp_path / "global_step_1" / "actor")
    wg.execute_all("save_checkpoint", ckpt, None, 1)
    assert wg.worker.ckpt._pending is not None  # returned with the write still handed to the writer thread
    # training goes on while the writer thread works: the files must hold the state *at* save time
    wg.execute_dp("update_actor", batch)
    assert any(not torch.equal(wg.worker.get_state_dict()[k], saved_w[k]) for k in saved_w)
    assert wg.execute_all("wait_checkpoint") == [os.path.abspath(ckpt)]
    assert sorted(os.listdir(ckpt)) == ["extra_state_world_size_1_rank_0.pt", "huggingface", "model", "optim"]
    assert wg.execute_all("wait_checkpoint") == [None]  # nothing pending any more
    fresh = _new_group(cfg)
    fresh.execute_all("load_checkpoint", ckpt)
    w, o = fresh.worker.get_state_dict(), _optim_state(fresh.worker)
    assert all(torch.equal(w[k], saved_w[k]) for k in saved_w)
    assert o.keys() == saved_o.keys() and all(torch.equal(o[k], saved_o[k]) for k in o)
