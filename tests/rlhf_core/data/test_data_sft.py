"""SFTDataset: loss-mask exactness (single and multi-turn), padding, nested keys, truncation, bad input."""
from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures.data_fixtures import sft_data_cfg, write_jsonl, write_parquet  # noqa: E402

from rlhf_core.data import DataError  # noqa: E402
from rlhf_core.data.sft_dataset import SFTDataset, create_sft_dataset, loss_mask_from_labels  # noqa: E402


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def predicted(item) -> list[int]:
    """The tokens the loss is taken on: input_ids[i + 1] for every i with loss_mask[i] == 1."""
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
    return [ids[i + 1] for i in range(len(ids) - 1) if mask[i]]


def test_shift_rule_on_the_semantics_example():
    # input_ids = P1 P2 P3 R1 R2 EOS: positions of P3, R1, R2 predict R1, R2, EOS; EOS predicts nothing.
    assert loss_mask_from_labels([0, 0, 0, 1, 1, 1]) == [0, 0, 1, 1, 1, 0]


def test_single_turn_loss_mask_exact(tiny_tokenizer, tmp_path):
    path = write_parquet(tmp_path / "s.parquet", [{"question": "What is 2+3?", "answer": "2+3 = 5\n#### 5"}])
    item = SFTDataset(path, tiny_tokenizer, sft_data_cfg(max_length=96))[0]
    prompt = enc(tiny_tokenizer, tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=False))
    response = enc(tiny_tokenizer, "2+3 = 5\n#### 5" + tiny_tokenizer.eos_token)
    p, r = len(prompt), len(response)
    assert response[-1] == tiny_tokenizer.eos_token_id
    pad = tiny_tokenizer.pad_token_id
    assert item["input_ids"].tolist() == prompt + response + [pad] * (96 - p - r)  # right-padded
    assert item["attention_mask"].tolist() == [1] * (p + r) + [0] * (96 - p - r)
    assert item["position_ids"].tolist()[: p + r] == list(range(p + r))
    # positions p-1 .. p+r-2 predict the r response tokens (the last one EOS); nothing else counts
    assert item["loss_mask"].tolist() == [0] * (p - 1) + [1] * r + [0] * (96 - p - r + 1)
    assert predicted(item) == response
    assert all(v.dtype == torch.int64 and v.shape == (96,) for v in item.values())


def test_nested_keys_and_jsonl(tiny_tokenizer, tmp_path):
    row = {"q": {"body": {"text": "Hi?"}}, "a": {"text": "Hello"}}
    path = write_jsonl(tmp_path / "n.jsonl", [row])
    cfg = sft_data_cfg(prompt_key="q", prompt_dict_keys=["body", "text"], response_key="a",
                       response_dict_keys=["text"], max_length=64)
    assert predicted(SFTDataset(path, tiny_tokenizer, cfg)[0]) == enc(tiny_tokenizer, "Hello<|im_end|>")
    cfg.response_dict_keys = ["missing"]
    with pytest.raises(DataError, match=r"n.jsonl line 1: field 'a' has no key 'missing'"):
        SFTDataset(path, tiny_tokenizer, cfg)


def test_multiturn_only_assistant_tokens(tiny_tokenizer, tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"},
                {"role": "assistant", "content": "2"}, {"role": "user", "content": "times 3?"},
                {"role": "assistant", "content": "6"}]
    path = write_parquet(tmp_path / "m.parquet", [{"messages": messages}])
    cfg = sft_data_cfg(multiturn={"enable": True, "messages_key": "messages"}, max_length=128)
    item = SFTDataset(path, tiny_tokenizer, cfg)[0]
    full = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    n = int(item["attention_mask"].sum())
    assert tiny_tokenizer.decode(item["input_ids"][:n].tolist()) == full
    # ChatML: each assistant turn contributes its content and "<|im_end|>\n"; headers and user turns do not
    assert tiny_tokenizer.decode(predicted(item)) == "2<|im_end|>\n6<|im_end|>\n"
    assert item["loss_mask"][n - 1] == 0  # the last token predicts nothing


def test_truncation_and_all_masked(tiny_tokenizer, tmp_path):
    long_q = "How many " + "apples and pears " * 20 + "?"
    path = write_jsonl(tmp_path / "t.jsonl", [{"question": "Hi?", "answer": "Yes"},
                                              {"question": long_q, "answer": "Many"}])
    with pytest.raises(DataError, match=r"t.jsonl line 2: sample has \d+ tokens, more than data.max_length=32"):
        SFTDataset(path, tiny_tokenizer, sft_data_cfg(max_length=32))[1]
    # right truncation cuts the whole response off: no label left is an error, not a silent loss of 0
    with pytest.raises(DataError, match=r"t.jsonl line 2: no response token left"):
        SFTDataset(path, tiny_tokenizer, sft_data_cfg(max_length=32, truncation="right"))[1]
    item = SFTDataset(path, tiny_tokenizer, sft_data_cfg(max_length=32, truncation="left"))[1]
    assert item["attention_mask"].sum() == 32  # the last 32 tokens kept, response intact
    assert predicted(item) == enc(tiny_tokenizer, "Many<|im_end|>")


@pytest.mark.parametrize(
    "row, cfg, needle",
    [
        ({"answer": "x"}, {}, r"line 1: missing column 'question'"),
        ({"question": 3, "answer": "x"}, {}, r"line 1: field 'question' must be a string"),
        ({"messages": [{"role": "user"}]}, {"multiturn": {"enable": True}}, r"field 'messages'\[0\] has no 'content'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, {"multiturn": {"enable": True}}, "no assistant message"),
        ({"chat": []}, {"multiturn": {"enable": True}}, r"missing column 'messages'"),
    ],
)
def test_bad_rows(tiny_tokenizer, tmp_path, row, cfg, needle):
    path = write_jsonl(tmp_path / "b.jsonl", [row])
    with pytest.raises(DataError, match=needle):
        SFTDataset(path, tiny_tokenizer, sft_data_cfg(**cfg))


def test_custom_cls_and_bad_truncation(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"question": "a", "answer": "b"}])
    (tmp_path / "mine.py").write_text(
        "from torch.utils.data import Dataset\n"
        "class Mine(Dataset):\n"
        "    def __init__(self, parquet_files, tokenizer, config):\n        self.files = parquet_files\n"
        "    def __len__(self):\n        return 1\n"
        "    def __getitem__(self, i):\n        return {}\n")
    ds = create_sft_dataset(path, tiny_tokenizer, sft_data_cfg(custom_cls={"path": str(tmp_path / "mine.py"),
                                                                            "name": "Mine"}))
    assert type(ds).__name__ == "Mine" and ds.files == path
    assert isinstance(create_sft_dataset(path, tiny_tokenizer, sft_data_cfg()), SFTDataset)
    with pytest.raises(ValueError, match="truncation"):
        SFTDataset(path, tiny_tokenizer, sft_data_cfg(truncation="middle"))


def test_gsm8k_jsonl_trains_on_answers(tiny_tokenizer, gsm8k_dir):
    ds = SFTDataset(str(gsm8k_dir / "test.jsonl"), tiny_tokenizer, sft_data_cfg(max_length=512))
    first = json.loads((gsm8k_dir / "test.jsonl").read_text().splitlines()[0])
    assert len(ds) == 1319
    assert tiny_tokenizer.decode(predicted(ds[0])) == first["answer"] + "<|im_end|>"
