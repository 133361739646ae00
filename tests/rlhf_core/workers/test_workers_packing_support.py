"""Which models ``use_remove_padding`` packs (``packing.PACKED_MODEL_TYPES``), checked rather than assumed.

Every listed model type, built tiny from its own config class, gives the padded forward's logits packed (SDPA and
eager attention), so the list is re-proven against the installed transformers on every run. OPT (learned positions
computed from the attention mask) gives other logits packed and is refused, as is a forward without
``position_ids`` (``FalconForSequenceClassification``); the workers refuse such a model at start-up, naming the key.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect

import pytest
import torch

from rlhf_core.kernels import model_support as kernel_support
from rlhf_core.kernels import packing, support

_SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=64, n_positions=64, pad_token_id=0,
              sliding_window=None, ffn_dim=64, word_embed_proj_dim=32)


def _tiny(model_type: str, attn: str = "sdpa", cls=None):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type)
    for key, value in _SMALL.items():
        # each config class names its sizes its own way (attribute_map), and some refuse a few of these
        with contextlib.suppress(AttributeError, ValueError, TypeError):
            setattr(cfg, key, value)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return (cls or AutoModelForCausalLM).from_config(cfg).eval()


def _rows():
    """4 rows of 7, 1, 12 and 5 valid tokens in 14 columns, alternately right- and left-padded."""
    mask = torch.zeros(4, 14, dtype=torch.long)
    for i, n in enumerate([7, 1, 12, 5]):
        if i % 2:
            mask[i, 14 - n:] = 1
        else:
            mask[i, :n] = 1
    ids = torch.randint(3, 90, (4, 14), generator=torch.Generator().manual_seed(0)) * mask
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", sorted(packing.PACKED_MODEL_TYPES))
def test_every_listed_model_type_packs_to_the_padded_logits(model_type, attn):
    model = _tiny(model_type, attn)
    assert packing.packing_unsupported(model) is None
    ids, mask, pos = _rows()
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        packed = packing.packed_logits(model, ids, mask, pos)
    # valid positions only: the packed path leaves 0 at pads; logits are O(0.1-1), a row attending across the pack
    # differed by 2e-1 (OPT, below)
    torch.testing.assert_close(packed * mask[..., None], padded * mask[..., None], rtol=1e-5, atol=1e-6)


def test_opt_packs_wrong_and_is_refused():
    model = _tiny("opt")
    ids, mask, pos = _rows()
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        refused = support(model)
        kernel_support._SUPPORT[model] = dataclasses.replace(refused, packing_refusal=None)  # the unchecked path
        packed = packing.packed_logits(model, ids, mask, pos)
        kernel_support._SUPPORT[model] = refused
    assert float(((packed - padded) * mask[..., None]).abs().max()) > 1e-2  # why it is not listed
    assert "model_type 'opt' is not one whose packed forward was checked" in packing.packing_unsupported(model)
    with pytest.raises(ValueError, match=r"critic.model.use_remove_padding=True: model_type 'opt' .* Set "
                                         r"critic.model.use_remove_padding=False"):
        packing.check_packing_support(model, "critic.model.use_remove_padding")
    with pytest.raises(ValueError, match="use_remove_padding=True: model_type 'opt'"):
        packing.packed_logits(model, ids, mask, pos)


def test_a_forward_without_position_ids_is_refused():
    from transformers import AutoModelForSequenceClassification

    model = _tiny("falcon", cls=AutoModelForSequenceClassification)
    assert packing.packing_unsupported(model) == ("FalconForSequenceClassification.forward takes no position_ids, "
                                                  "which carry where each packed sequence starts")


def test_a_peft_wrapper_is_judged_by_its_base_model():
    from rlhf_core.models.lora import apply_lora

    model = apply_lora(_tiny("qwen2"), 4, 8, "all-linear")
    assert "position_ids" not in inspect.signature(model.forward).parameters  # peft's own forward
    assert packing.packing_unsupported(model) is None


def test_the_reward_model_worker_refuses_an_unchecked_model_at_start_up(tiny_model_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlhf_core.distributed import LocalWorkerGroup
    from rlhf_core.workers.reward_model import RewardModelWorker
    from tests.rlhf_core.workers.test_workers_fsdp import ppo_config

    rm = _tiny("opt", cls=AutoModelForSequenceClassification)
    rm.config.num_labels, rm.config.vocab_size = 1, AutoTokenizer.from_pretrained(tiny_model_dir).vocab_size
    AutoModelForSequenceClassification.from_config(rm.config).save_pretrained(tmp_path / "rm")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "rm")
    cfg = ppo_config(tiny_model_dir, "reward_model.enable=True", f"reward_model.model.path={tmp_path / 'rm'}",
                     "reward_model.micro_batch_size_per_gpu=2", "reward_model.model.use_remove_padding=True")
    wg = LocalWorkerGroup(RewardModelWorker, {"config": cfg})
    with pytest.raises(ValueError, match="reward_model.model.use_remove_padding=True: model_type 'opt'"):
        wg.execute_all("init_model")
