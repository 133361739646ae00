"""The tiny model factory: the tokenizer round-trips through AutoTokenizer and the model generates."""
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from rlhf_core.models.tiny import IM_END, PAD_TOKEN


def test_autotokenizer_round_trips_the_custom_bpe(tiny_model_dir):
    # transformers 5 reloads a tokenizer beside a qwen2 config as Qwen2Tokenizer; ids must not change.
    auto = AutoTokenizer.from_pretrained(tiny_model_dir)
    fast = PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)
    texts = [
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72",
        "  leading spaces, café, naïve, ÅNGSTRÖM\r\n tabs\tand 1,000,000.50 $",
        "Let's think step by step and output the final answer after \"####\".",
    ]
    for text in texts:
        ids = auto(text, add_special_tokens=False)["input_ids"]
        assert ids == fast(text, add_special_tokens=False)["input_ids"]
        assert auto.decode(ids) == text  # NFC text decodes back to itself


def test_special_tokens_and_chat_template(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.pad_token == PAD_TOKEN and tok.eos_token == IM_END
    assert tok.pad_token_id != tok.eos_token_id
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    # special tokens are single ids, not split into bytes
    assert len(tok("<|im_start|>", add_special_tokens=False)["input_ids"]) == 1


def test_model_loads_and_generates(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.vocab_size == len(tok)
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    ids = tok("Weng earns $12", return_tensors="pt", add_special_tokens=False)["input_ids"]
    out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape == (1, ids.shape[1] + 5) or (out[0, -1] == tok.eos_token_id)
    assert torch.equal(out[0, : ids.shape[1]], ids[0])


def test_chat_texts_teach_the_bpe_the_template_role_names():
    from rlhf_core.models.tiny import chat_texts, train_tokenizer

    chat = [{"role": "user", "content": "Numbers: 51 17. Target: 68."}]
    assert chat_texts(chat) == ["user", "Numbers: 51 17. Target: 68.", "assistant"]
    contents = [f"Numbers: {a} {b}. Target: {a + b}." for a in range(1, 30) for b in range(1, 30)]
    plain = train_tokenizer(contents, vocab_size=300)
    taught = train_tokenizer(contents + chat_texts(chat) * 50, vocab_size=300)
    text = plain.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    # with them each role name is one token; without them the BPE (whose text has neither) spells them in pieces
    assert [len(taught(w, add_special_tokens=False)["input_ids"]) for w in ("user", "assistant")] == [1, 1]
    assert all(len(plain(w, add_special_tokens=False)["input_ids"]) > 1 for w in ("user", "assistant"))
    n_plain = len(plain(text, add_special_tokens=False)["input_ids"])
    n_taught = len(taught(text, add_special_tokens=False)["input_ids"])
    assert n_taught < n_plain
