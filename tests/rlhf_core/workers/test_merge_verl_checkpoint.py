"""``rlhf merge`` reads verl 0.6 FSDP checkpoints (per-rank ``model_world_size_W_rank_R.pt`` + ``huggingface/``)."""
from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf_core.workers.merger import main as merge_main
from rlhf_core.workers.merger import merge_checkpoint
from rlhf_core.workers.verl_checkpoint import load_verl_fsdp_state_dict
from tests.fixtures.verl_ckpt_fixtures import write_verl_fsdp_checkpoint


def _assert_same_weights(a_dir: str, b_dir: str) -> None:
    a = AutoModelForCausalLM.from_pretrained(a_dir, torch_dtype=torch.float32).state_dict()
    b = AutoModelForCausalLM.from_pretrained(b_dir, torch_dtype=torch.float32).state_dict()
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k  # bit-exact: merging only re-joins shards, no arithmetic


def test_two_rank_fsdp2_checkpoint_merges_to_the_original_weights(tiny_model_dir, tmp_path):
    ckpt = write_verl_fsdp_checkpoint(tiny_model_dir, str(tmp_path / "global_step_3" / "actor"), world_size=2)
    # each rank holds half of every dim-0-sharded weight: the pieces are really split
    rank0 = torch.load(os.path.join(ckpt, "model_world_size_2_rank_0.pt"), weights_only=False)
    emb = rank0["model.embed_tokens.weight"]
    full_rows = AutoModelForCausalLM.from_pretrained(tiny_model_dir).model.embed_tokens.weight.shape[0]
    assert emb._local_tensor.shape[0] == full_rows // 2
    out = str(tmp_path / "merged")
    assert merge_main(["--backend", "fsdp", "--local_dir", ckpt, "--target_dir", out]) == 0
    _assert_same_weights(tiny_model_dir, out)
    assert os.path.exists(os.path.join(out, "tokenizer.json"))  # tokenizer carried over from huggingface/


def test_single_rank_plain_tensor_checkpoint_merges(tiny_model_dir, tmp_path):
    ckpt = write_verl_fsdp_checkpoint(tiny_model_dir, str(tmp_path / "actor"), world_size=1, plain=True)
    _assert_same_weights(tiny_model_dir, merge_checkpoint(ckpt, str(tmp_path / "merged")))


def test_missing_rank_and_wrong_shape_are_named(tiny_model_dir, tmp_path):
    ckpt = write_verl_fsdp_checkpoint(tiny_model_dir, str(tmp_path / "actor"), world_size=1, plain=True)
    # a 2-rank run whose rank-1 shard was not copied over
    os.rename(os.path.join(ckpt, "model_world_size_1_rank_0.pt"), os.path.join(ckpt, "model_world_size_2_rank_0.pt"))
    with open(os.path.join(ckpt, "fsdp_config.json"), "w") as f:
        f.write('{"FSDP_version": 2, "world_size": 2}')
    with pytest.raises(FileNotFoundError, match=r"missing for ranks \[1\]"):
        load_verl_fsdp_state_dict(ckpt)
    assert merge_main(["--local_dir", ckpt, "--target_dir", str(tmp_path / "m")]) == 1
    os.rename(os.path.join(ckpt, "model_world_size_2_rank_0.pt"), os.path.join(ckpt, "model_world_size_1_rank_0.pt"))
    os.remove(os.path.join(ckpt, "fsdp_config.json"))  # world size then comes from the file names
    with pytest.raises(ValueError, match="model.norm.weight has shape"):
        load_verl_fsdp_state_dict(ckpt, {"model.norm.weight": torch.Size([3])})
