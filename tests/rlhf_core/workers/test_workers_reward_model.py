"""RewardModelWorker (single-rank FSDP2, LocalWorkerGroup) against a direct HF sequence-classification forward.

The tiny RM is ``AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)`` (a seeded
random score head). HF's own forward on an *unpadded* sequence pools at its last token, which is exactly the
last valid token the worker must read, so each expected score is one plain HF call per row.
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rlhf_core.distributed import LocalWorkerGroup  # noqa: E402
from rlhf_core.protocol import Batch  # noqa: E402
from rlhf_core.workers.reward_model import RewardModelWorker  # noqa: E402
from tests.rlhf_core.workers.test_workers_fsdp import P, T, ppo_config, prompt_batch  # noqa: E402

# A template unlike the policy's ChatML: "role: content" lines, no special tokens.
RM_TEMPLATE = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
LENGTHS = [5, 3, 1, 4]  # valid response tokens per row (row 0 also has 3 left pads in its prompt)


def _save_rm(tiny_model_dir, out_dir, chat_template=None) -> str:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    rm.config.pad_token_id = tok.pad_token_id
    if chat_template is not None:
        tok.chat_template = chat_template
    rm.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return str(out_dir)


@pytest.fixture(scope="module")
def rm_dirs(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    return {"same": _save_rm(tiny_model_dir, root / "same"),
            "other": _save_rm(tiny_model_dir, root / "other", RM_TEMPLATE)}


def _rm_group(tiny_model_dir, rm_dir, *overrides):
    cfg = ppo_config(tiny_model_dir, "reward_model.enable=True", f"reward_model.model.path={rm_dir}",
                     f"reward_model.model.input_tokenizer={tiny_model_dir}", "reward_model.micro_batch_size_per_gpu=3",
                     *overrides)
    wg = LocalWorkerGroup(RewardModelWorker, {"config": cfg})
    wg.execute_all("init_model")
    return wg


def _generated_batch(tokenizer) -> Batch:
    """4 left-padded prompts + right-padded responses of ``LENGTHS`` (ending in EOS), as the rollout returns them."""
    prompts = prompt_batch()
    questions = ["What is 6 times 7?", "Add 2 and 3.", "Is 9 odd?", "Halve 10."]
    answers = ["It is 5", "5", "", "It is 5"]  # "It is 5" is 4 tokens: row 0 = those + EOS
    responses = torch.full((4, T), tokenizer.pad_token_id)
    for i, (ans, n) in enumerate(zip(answers, LENGTHS)):
        ids = (tokenizer(ans, add_special_tokens=False)["input_ids"] * T)[: n - 1] + [tokenizer.eos_token_id]
        responses[i, :n] = torch.tensor(ids)
    mask = (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).long()
    attn = torch.cat([prompts["attention_mask"], mask], 1)
    raw = [[{"role": "user", "content": q}] for q in questions]
    return Batch({"prompts": prompts["input_ids"], "responses": responses, "response_mask": mask,
                  "input_ids": torch.cat([prompts["input_ids"], responses], 1), "attention_mask": attn,
                  "position_ids": torch.clamp(attn.cumsum(-1) - 1, min=0)}, {"raw_prompt": raw})


def _hf_score(rm_dir, ids: list[int]) -> float:
    from transformers import AutoModelForSequenceClassification

    rm = AutoModelForSequenceClassification.from_pretrained(rm_dir, num_labels=1).eval()
    with torch.no_grad():
        return float(rm(input_ids=torch.tensor([ids])).logits[0, 0])


def _assert_on_last_response_token(scores: torch.Tensor, expected: list[float]):
    assert scores.shape == (4, T) and scores.dtype == torch.float32
    for i, n in enumerate(LENGTHS):
        assert float(scores[i, n - 1]) == pytest.approx(expected[i], abs=1e-5)
        others = torch.cat([scores[i, : n - 1], scores[i, n:]])
        assert torch.all(others == 0)


def _base_model_input_shapes(wg) -> list[tuple[int, ...]]:
    """The ``input_ids`` shapes the RM's decoder will see, recorded by a forward pre-hook."""
    shapes = []
    wg.worker.module.model.register_forward_pre_hook(
        lambda _m, args, kwargs: shapes.append(tuple((args[0] if args else kwargs["input_ids"]).shape)),
        with_kwargs=True)
    return shapes


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "use_remove_padding"])
def test_same_tokenizer_scores_the_policy_ids(tiny_model_dir, tiny_tokenizer, rm_dirs, packed):
    wg = _rm_group(tiny_model_dir, rm_dirs["same"], f"reward_model.model.use_remove_padding={packed}")
    assert not wg.worker.switch_chat_template  # same vocabulary, specials and template: the ids are used as they are
    batch = _generated_batch(tiny_tokenizer)
    shapes = _base_model_input_shapes(wg)
    out = wg.execute_dp("compute_rm_score", batch)["rm_scores"]
    # micro-batches of 3 rows: rows 0-2, then row 3; packed, one sequence of each micro-batch's valid tokens
    valid = batch["attention_mask"].sum(-1).tolist()
    width = batch["input_ids"].shape[1]
    assert shapes == ([(1, sum(valid[:3])), (1, valid[3])] if packed else [(3, width), (1, width)])
    # the valid tokens of a row (left pads and right pads dropped) as one unpadded sequence
    expected = [_hf_score(rm_dirs["same"], batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist())
                for i in range(4)]
    assert len(set(round(e, 4) for e in expected)) == 4  # distinct scores, so a row mix-up would show
    _assert_on_last_response_token(out, expected)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "use_remove_padding"])
def test_other_chat_template_is_re_templated(tiny_model_dir, tiny_tokenizer, rm_dirs, packed):
    from transformers import AutoTokenizer

    wg = _rm_group(tiny_model_dir, rm_dirs["other"], f"reward_model.model.use_remove_padding={packed}")
    assert wg.worker.switch_chat_template
    batch = _generated_batch(tiny_tokenizer)
    inputs = wg.worker.rm_inputs(batch)
    rm_tok = AutoTokenizer.from_pretrained(rm_dirs["other"])
    texts = []
    for i in range(4):
        ids = inputs["input_ids"][i][inputs["attention_mask"][i].bool()].tolist()
        texts.append(rm_tok.decode(ids))
    # the response decoded by the policy tokenizer, its EOS text removed, re-rendered by the RM's template
    assert texts[0] == "user: What is 6 times 7?\nassistant: It is 5\n"
    assert texts[2] == "user: Is 9 odd?\nassistant: \n"  # EOS-only response: empty assistant turn
    out = wg.execute_dp("compute_rm_score", batch)["rm_scores"]
    expected = [_hf_score(rm_dirs["other"], rm_tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    _assert_on_last_response_token(out, expected)
    # max_length keeps the first tokens (verl truncation='right'); the score is then read on the last kept one
    short = _rm_group(tiny_model_dir, rm_dirs["other"], "reward_model.max_length=5",
                      f"reward_model.model.use_remove_padding={packed}")
    cut = short.execute_dp("compute_rm_score", batch)["rm_scores"]
    first5 = rm_tok(texts[0], add_special_tokens=False)["input_ids"][:5]
    assert float(cut[0, LENGTHS[0] - 1]) == pytest.approx(_hf_score(rm_dirs["other"], first5), abs=1e-5)


def test_packed_rm_refuses_a_row_without_tokens(tiny_model_dir, tiny_tokenizer, rm_dirs):
    wg = _rm_group(tiny_model_dir, rm_dirs["same"], "reward_model.model.use_remove_padding=True")
    batch = _generated_batch(tiny_tokenizer)
    batch["attention_mask"][1] = 0  # row 1: nothing to score; the padded forward would score a pad
    with pytest.raises(ValueError, match="row 1 of the micro-batch has no valid token"):
        wg.execute_dp("compute_rm_score", batch)


def test_re_templating_needs_the_raw_chat(tiny_model_dir, tiny_tokenizer, rm_dirs):
    wg = _rm_group(tiny_model_dir, rm_dirs["other"])
    batch = _generated_batch(tiny_tokenizer)
    del batch.non_tensors["raw_prompt"]
    with pytest.raises(ValueError, match="data.return_raw_chat=True"):
        wg.execute_dp("compute_rm_score", batch)


def test_fsdp_config_keys_shape_the_sharding(tiny_model_dir, rm_dirs, monkeypatch):
    """reward_model.model.fsdp_config: wrap_policy.min_num_params=1 (verl 0.6's spelling) wraps every smallest
    module holding a parameter, not just the decoder layers; reshard_after_forward=False keeps the gathered
    parameters after forward (no post-forward mesh); fsdp_size=0 is refused (it must divide the world size).
    One rank runs the plain module (fsdp_utils.needs_fsdp2), so the sharding is forced here as on several ranks."""
    from torch.distributed.fsdp import FSDPModule

    from rlhf_core.workers import fsdp_utils

    monkeypatch.setattr(fsdp_utils, "needs_fsdp2", lambda kwargs, single_rank=False: True)

    def wrapped(wg):
        return [m for m in wg.worker.module.modules() if isinstance(m, FSDPModule)]

    default = wrapped(_rm_group(tiny_model_dir, rm_dirs["same"]))
    custom = wrapped(_rm_group(tiny_model_dir, rm_dirs["same"], "reward_model.model.fsdp_config.wrap_policy.min_num_params=1",
                               "reward_model.model.fsdp_config.reshard_after_forward=False"))
    assert len(custom) > len(default) >= 2  # default: the decoder layers and the root
    assert all(m._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None
               for m in default if m._get_fsdp_state()._fsdp_param_group is not None)
    assert all(m._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is None
               for m in custom if m._get_fsdp_state()._fsdp_param_group is not None)
    with pytest.raises(ValueError, match="fsdp_size=0 must divide the world size 1"):
        _rm_group(tiny_model_dir, rm_dirs["same"], "reward_model.model.fsdp_config.fsdp_size=0")
