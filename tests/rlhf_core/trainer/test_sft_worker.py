"""SFT loss: token-mean over the whole batch, independent of micro-batching (same loss, same update)."""
from __future__ import annotations

import json

import pytest
import torch


@pytest.fixture(scope="module")
def sft_batch_and_config(tiny_model_dir, gsm8k_dir, tmp_path_factory):
    from rlhf_core.config import load_config
    from rlhf_core.data.rl_dataset import collate_fn
    from rlhf_core.data.sft_dataset import SFTDataset
    from rlhf_core.models.loading import load_tokenizer

    path = tmp_path_factory.mktemp("sft_unit") / "train.jsonl"
    with open(path, "w") as fh:
        for line in list(open(gsm8k_dir / "train.jsonl"))[:4]:
            r = json.loads(line)
            # different answer lengths → different token counts per row (a per-micro-batch mean would differ)
            fh.write(json.dumps({"question": r["question"][:60], "answer": r["answer"][-(10 + len(r["answer"]) % 30):]}) + "\n")

    def config(micro):
        return load_config("sft_trainer", [
            f"model.partial_pretrain={tiny_model_dir}", f"data.train_files={path}", f"data.val_files={path}",
            "data.train_batch_size=4", f"data.micro_batch_size_per_gpu={micro}", "data.max_length=64",
            "data.truncation=right", "optim.lr=1e-2", "optim.warmup_steps_ratio=0", "trainer.n_gpus_per_node=1",
            "trainer.logger=[console]"])

    ds = SFTDataset(str(path), load_tokenizer(tiny_model_dir), config(1).data)
    return collate_fn([ds[i] for i in range(4)]), config


def _worker(config):
    from rlhf_core.distributed.worker_group import LocalWorkerGroup
    from rlhf_core.trainer.sft_worker import SFTWorker

    return LocalWorkerGroup(SFTWorker, {"config": config, "total_steps": 4})


def test_loss_and_update_do_not_depend_on_micro_batches(sft_batch_and_config):
    from rlhf_core.workers.fsdp_utils import full_state_dict

    batch, config = sft_batch_and_config
    counts = batch["loss_mask"][:, :-1].sum(-1)
    assert len(set(counts.tolist())) > 1  # rows really differ in length
    results, weights = [], []
    for micro in (4, 1):
        wg = _worker(config(micro))
        wg.execute_all("init_model")
        with torch.no_grad():  # reference: one token-mean over the whole batch, computed by hand
            model = wg.worker.model
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        position_ids=batch["position_ids"]).logits[:, :-1].float()
            ce = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), batch["input_ids"][:, 1:].reshape(-1),
                                                   reduction="none").view(4, -1)
            mask = batch["loss_mask"][:, :-1].float()
            expected = float((ce * mask).sum() / mask.sum())
        results.append(wg.execute_dp("train_step", batch)[0])
        assert results[-1]["train/loss"] == pytest.approx(expected, rel=1e-5)
        weights.append({k: v.clone() for k, v in full_state_dict(wg.worker.model).items()})
        wg.shutdown()
    assert results[0]["train/loss"] == pytest.approx(results[1]["train/loss"], rel=1e-6)
    assert results[0]["train/grad_norm"] == pytest.approx(results[1]["train/grad_norm"], rel=1e-4)
    # the AdamW step is ~lr = 1e-2 per weight; float summation order may move a near-zero gradient's
    # normalised step by a few 1e-6, far below a real difference of the update
    for k in weights[0]:
        torch.testing.assert_close(weights[0][k], weights[1][k], rtol=1e-4, atol=1e-5)


def test_train_step_matches_the_pinned_numbers(sft_batch_and_config):
    """Loss, grad norm and weights after one step with 2-row micro-batches, recorded at cced719 (the SFT worker's
    own accumulation loop, before it moved onto ``rlhf_core.workers.update_loop``)."""
    batch, config = sft_batch_and_config
    metrics, checksum = _one_step(config(2), batch)
    assert metrics["train/loss"] == pytest.approx(SFT_PIN["train/loss"], rel=1e-5)
    assert metrics["train/grad_norm"] == pytest.approx(SFT_PIN["train/grad_norm"], rel=1e-5)
    assert metrics["train/lr"] == pytest.approx(SFT_PIN["train/lr"], rel=1e-9)
    # rel 1e-5: AdamW's normalised step on near-zero gradients differs in its last bits between CPU instruction
    # sets (recorded on AVX2, checked on AVX512 too); a real change of the step moves the checksum far more
    assert checksum == pytest.approx(SFT_PIN_CHECKSUM, rel=1e-5)


def test_packed_step_equals_the_padded_one(sft_batch_and_config):
    """``use_remove_padding``: the packed loss (per-sequence attention, cross-entropy on valid positions only) gives
    the padded step's loss, gradient norm and weights (the pinned numbers above), with 2-row micro-batches."""
    from omegaconf import OmegaConf

    batch, config = sft_batch_and_config
    assert (batch["attention_mask"] == 0).any()  # there is padding to remove
    cfg = config(2)
    OmegaConf.update(cfg, "use_remove_padding", True)
    metrics, checksum = _one_step(cfg, batch)
    assert metrics["train/loss"] == pytest.approx(SFT_PIN["train/loss"], rel=1e-5)
    assert metrics["train/grad_norm"] == pytest.approx(SFT_PIN["train/grad_norm"], rel=1e-5)
    assert checksum == pytest.approx(SFT_PIN_CHECKSUM, rel=1e-5)


def _one_step(config, batch) -> tuple[dict, tuple[float, float]]:
    """One ``train_step`` of a fresh worker: its metrics and a checksum of the weights after it (their sum, and
    their dot product with a fixed random vector, in float64)."""
    from rlhf_core.workers.fsdp_utils import full_state_dict

    wg = _worker(config)
    wg.execute_all("init_model")
    metrics = wg.execute_dp("train_step", batch)[0]
    flat = torch.cat([v.reshape(-1).double() for _, v in sorted(full_state_dict(wg.worker.model).items())])
    wg.shutdown()
    w = torch.randn(flat.numel(), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return metrics, (float(flat.sum()), float((flat * w).sum()))


SFT_PIN = {"train/loss": 6.917751789093018, "train/lr": 0.01, "train/grad_norm": 2.5845158100128174}
SFT_PIN_CHECKSUM = (152.79277644935064, 21.18925288331699)


def test_pad_to_length_rounds_the_pack_up_with_the_same_step(sft_batch_and_config, monkeypatch):
    """``engine.pad_to_length``: each packed micro-batch is rounded up to a multiple of the bucket (dummy rows with
    loss_mask 0), and the step is the pinned padded one."""
    from omegaconf import OmegaConf

    from rlhf_core.trainer import sft_worker

    packs = []
    real = sft_worker.packed_next_token_ce
    monkeypatch.setattr(sft_worker, "packed_next_token_ce",
                        lambda m, ids, mask, *a: (packs.append(int(mask.sum())), real(m, ids, mask, *a))[1])
    batch, config = sft_batch_and_config
    cfg = config(2)
    for key, value in (("use_remove_padding", True), ("engine.pad_to_length", True),
                       ("engine.pad_to_length_bucket", 64)):
        OmegaConf.update(cfg, key, value)
    metrics, checksum = _one_step(cfg, batch)
    assert len(packs) == 2 and all(n % 64 == 0 for n in packs)
    assert sum(packs) - int(batch["attention_mask"].sum()) > 0  # dummy tokens were added
    assert metrics["train/loss"] == pytest.approx(SFT_PIN["train/loss"], rel=1e-5)
    assert checksum == pytest.approx(SFT_PIN_CHECKSUM, rel=1e-5)
