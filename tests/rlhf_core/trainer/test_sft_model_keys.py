"""SFT's verl 0.9 ``model.*`` keys: ``hf_config_path``, ``override_config``, ``tokenizer_path``,
``lora_adapter_path``, ``exclude_modules``, ``tiled_mlp`` (the pinned step's numbers, tiled) and
``enable_activation_offload`` (the update's micro-batches run under the offload context)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.rlhf_core.trainer.test_sft_worker import (SFT_PIN, _worker, sft_batch_and_config)  # noqa: F401

from rlhf_core.trainer.sft_worker import sft_tokenizer_path


def _lora_modules(model) -> set[str]:
    return {name.split(".")[-1] for name, mod in model.named_modules() if hasattr(mod, "lora_A")}


def _with(cfg, **values):
    for k, v in values.items():
        OmegaConf.update(cfg, k, v, merge=False)
    return cfg


def test_config_tokenizer_and_overrides_come_from_their_keys(sft_batch_and_config, tiny_model_dir, tmp_path):
    _, config = sft_batch_and_config
    tok, conf = tmp_path / "tok", tmp_path / "conf"
    tok.mkdir()
    conf.mkdir()
    for name in os.listdir(tiny_model_dir):
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(os.path.join(tiny_model_dir, name), tok / name)
    hf = json.loads(Path(tiny_model_dir, "config.json").read_text())
    assert hf["rms_norm_eps"] != 0.25 and hf.get("initializer_range") != 0.5
    (conf / "config.json").write_text(json.dumps({**hf, "rms_norm_eps": 0.25}))
    cfg = _with(config(2), **{"model.hf_config_path": str(conf), "model.tokenizer_path": str(tok),
                              "model.override_config": {"initializer_range": 0.5}})
    assert sft_tokenizer_path(cfg.model) == str(tok)  # run_sft's tokenizer (the dataset's)
    wg = _worker(cfg)
    try:
        wg.execute_all("init_model")
        assert wg.worker.model.config.rms_norm_eps == 0.25  # config.json from hf_config_path
        assert wg.worker.model.config.initializer_range == 0.5  # override_config
        assert wg.worker._tokenizer().name_or_path == str(tok)  # the tokenizer saved with checkpoints / HF output
    finally:
        wg.shutdown()
    assert sft_tokenizer_path(config(2).model) == tiny_model_dir


def test_lora_adapter_path_and_exclude_modules(sft_batch_and_config, tiny_model_dir, tmp_path):
    from tests.rlhf_core.models.test_lora_adapter_path import _assert_loaded, _saved_adapter

    from rlhf_core.models.loading import load_causal_lm
    from rlhf_core.models.lora import apply_lora
    from rlhf_core.workers.fsdp_utils import full_state_dict

    _, config = sft_batch_and_config
    saved = _saved_adapter(apply_lora(load_causal_lm(tiny_model_dir), 4, 8), tmp_path / "a", seed=7)
    wg = _worker(_with(config(2), **{"model.lora_rank": 4, "model.lora_alpha": 8,
                                     "model.lora_adapter_path": str(tmp_path / "a")}))
    try:
        wg.execute_all("init_model")
        _assert_loaded(full_state_dict(wg.worker.model), saved)
        # the final HF model rebuilds the same adapters to merge them: it computes what the worker's model does
        from transformers import AutoModelForCausalLM

        wg.execute_all("save_hf_model", str(tmp_path / "hf"))
        ids = torch.arange(3, 15).view(1, 12)
        with torch.no_grad():
            torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))(input_ids=ids).logits,
                                       wg.worker.model(input_ids=ids).logits, rtol=0, atol=1e-5)
    finally:
        wg.shutdown()
    wg = _worker(_with(config(2), **{"model.lora_rank": 4, "model.exclude_modules": ["v_proj", "down_proj"]}))
    try:
        wg.execute_all("init_model")
        adapters = _lora_modules(wg.worker.model)
        assert "q_proj" in adapters and not adapters & {"v_proj", "down_proj"}
    finally:
        wg.shutdown()


def test_tiled_mlp_step_gives_the_pinned_numbers_and_offload_wraps_each_micro_batch(sft_batch_and_config,
                                                                                     monkeypatch):
    from rlhf_core.workers import update_loop

    batch, config = sft_batch_and_config
    offloads = []
    real = update_loop.activation_offload
    monkeypatch.setattr(update_loop, "activation_offload", lambda on: offloads.append(on) or real(on))
    cfg = _with(config(2), **{"model.tiled_mlp.enabled": True, "model.tiled_mlp.num_shards": 3,
                              "model.enable_activation_offload": True})
    wg = _worker(cfg)
    try:
        wg.execute_all("init_model")
        mlp = next(m for m in wg.worker.model.modules() if hasattr(m, "gate_proj") and hasattr(m, "down_proj"))
        seen = []
        mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[-2]))
        metrics = wg.execute_dp("train_step", batch)[0]
    finally:
        wg.shutdown()
    L = batch["input_ids"].shape[1]
    assert seen[:3] == [len(t) for t in torch.arange(L).chunk(3)]  # the first micro-batch's forward, in 3 tiles
    # the same step as untiled (test_sft_worker's pinned numbers): the tiles change memory, not results
    assert metrics["train/loss"] == pytest.approx(SFT_PIN["train/loss"], rel=1e-5)
    assert metrics["train/grad_norm"] == pytest.approx(SFT_PIN["train/grad_norm"], rel=1e-5)
    assert offloads == [True, True]  # 4 rows in micro-batches of 2, each under the offload context (CPU: a no-op)
