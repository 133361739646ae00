"""SFT end to end on the tiny model (one in-process FSDP2 rank): loss falls, LR schedule, checkpoints, resume,
and the final Hugging Face directory loads with ``from_pretrained``."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

from rlhf_core.trainer.tracking import read_metrics_jsonl


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory, gsm8k_dir):
    out = tmp_path_factory.mktemp("sft_data")
    rows = [json.loads(line) for line in open(gsm8k_dir / "train.jsonl")][:8]
    for name, part in (("train", rows), ("val", rows[:4])):
        with open(out / f"{name}.jsonl", "w") as fh:
            for r in part:
                # short answers keep the tiny run fast; the loss still has to fall on them
                fh.write(json.dumps({"question": r["question"][:120], "answer": r["answer"][-40:]}) + "\n")
    return out / "train.jsonl", out / "val.jsonl"


def sft_config(tiny_model_dir, sft_files, out_dir, *extra):
    from rlhf_core.config import load_config

    train, val = sft_files
    return load_config("sft_trainer", [
        f"model.partial_pretrain={tiny_model_dir}", f"data.train_files={train}", f"data.val_files={val}",
        "data.train_batch_size=4", "data.micro_batch_size_per_gpu=2", "data.max_length=96", "data.truncation=right",
        "optim.lr=3e-3", "optim.warmup_steps_ratio=0.25", "optim.min_lr_ratio=0.1", "trainer.total_epochs=4",
        "trainer.n_gpus_per_node=1", "trainer.logger=[file]", f"trainer.default_local_dir={out_dir}",
        "trainer.device=cpu", "trainer.test_freq=4", *extra])


@pytest.mark.slow
def test_sft_loss_decreases_schedule_and_hf_output(tiny_model_dir, sft_files, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from rlhf_core.trainer.sft_trainer import run_sft

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    out = tmp_path / "sft"
    result = run_sft(sft_config(tiny_model_dir, sft_files, out, "trainer.save_freq=4"))
    assert result["global_step"] == 8  # 8 rows / 4 per step × 4 epochs
    m = read_metrics_jsonl(str(out / "metrics.jsonl"))
    assert sorted(m) == list(range(1, 9))
    losses = [m[s]["train/loss"] for s in range(1, 9)]
    assert losses[-1] < losses[0] - 0.3, losses
    # W = int(0.25 × 8) = 2: 3e-4 (min ratio × lr), then peak 3e-3 at update index 2; the last update (p = 5/6)
    # at 3e-3 · (0.1 + 0.9 · ½(1 + cos(5π/6)))
    lr = [m[s]["train/lr"] for s in range(1, 9)]
    assert lr[0] == pytest.approx(3e-4) and lr[1] == pytest.approx(3e-4 + 2.7e-3 / 2) and lr[2] == pytest.approx(3e-3)
    assert lr[7] == pytest.approx(3e-3 * (0.1 + 0.45 * (1 + math.cos(5 * math.pi / 6))))
    assert "val/loss" in m[4] and "val/loss" in m[8] and "val/loss" not in m[3]
    assert sorted(os.listdir(out / "global_step_4")) == ["actor", "checkpoint_manifest.json", "data.pt"]
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "8"
    model = AutoModelForCausalLM.from_pretrained(result["hf_model_dir"])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    changed = [n for (n, p), (_, q) in zip(model.named_parameters(), base.named_parameters()) if not torch.equal(p, q)]
    assert changed, "SFT did not change any weight in the saved model"
    assert os.path.exists(os.path.join(result["hf_model_dir"], "tokenizer.json"))


@pytest.mark.slow
def test_sft_resume_continues_exactly(tiny_model_dir, sft_files, tmp_path, monkeypatch):
    from rlhf_core.trainer.sft_trainer import run_sft

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    import shutil

    from rlhf_core.trainer.checkpoint_manager import write_tracker

    full = tmp_path / "full"
    run_sft(sft_config(tiny_model_dir, sft_files, full, "trainer.total_epochs=2", "trainer.test_freq=-1",
                       "trainer.save_freq=2"))
    # a run that died after step 2: its directory holds global_step_2 and a tracker naming it
    part = tmp_path / "part"
    part.mkdir()
    shutil.copytree(full / "global_step_2", part / "global_step_2")
    write_tracker(str(part), 2)
    result = run_sft(sft_config(tiny_model_dir, sft_files, part, "trainer.total_epochs=2", "trainer.test_freq=-1",
                                "trainer.save_freq=2"))
    assert result["global_step"] == 4
    a, b = read_metrics_jsonl(str(full / "metrics.jsonl")), read_metrics_jsonl(str(part / "metrics.jsonl"))
    for step in (3, 4):
        assert b[step]["train/lr"] == pytest.approx(a[step]["train/lr"], rel=1e-9)
        assert b[step]["train/loss"] == pytest.approx(a[step]["train/loss"], rel=1e-5)


@pytest.mark.slow
def test_sft_two_ray_workers_match_one(tiny_model_dir, sft_files, tmp_path, monkeypatch):
    """The same global batches on 2 FSDP2 ranks (Ray, gloo) give the same losses as on 1 in-process rank."""
    from rlhf_core.trainer.sft_trainer import run_sft

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    losses = {}
    for world in (1, 2):
        out = tmp_path / f"w{world}"
        run_sft(sft_config(tiny_model_dir, sft_files, out, "trainer.total_epochs=1", "trainer.test_freq=-1",
                           f"trainer.n_gpus_per_node={world}", "data.micro_batch_size_per_gpu=1",
                           "ray_init.num_cpus=2"))
        m = read_metrics_jsonl(str(out / "metrics.jsonl"))
        losses[world] = [m[s]["train/loss"] for s in sorted(m)]
    assert len(losses[1]) == 2
    assert losses[2] == pytest.approx(losses[1], rel=1e-4)
