"""Build a *tiny* causal LM and tokenizer from a task's own text, saved as an ordinary HF directory.

Tests and the CPU demo never download a model: they train a byte-level BPE tokenizer on the task's
text and save it next to a small random-initialised Qwen2-style config, then load both back through
the same ``from_pretrained`` path as a real model.

The tokenizer uses Qwen2's own normaliser and pre-tokenizer (NFC, Qwen2's split regex, ByteLevel without
regex). In transformers 5, ``AutoTokenizer`` re-loads a tokenizer that sits next to a ``model_type: qwen2``
config as ``Qwen2Tokenizer``, which rebuilds the pre-tokenizer; because ours is the same, the ids
round-trip exactly (see FIELD-NOTES.md and ``tests/rlhf_core/models/test_tiny_model.py``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from rlhf_core.atomic import atomic_directory

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# Qwen2's pre-tokenizer split pattern (tokenization_qwen2.py).
QWEN2_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# ChatML, as Qwen2 uses it. Assistant turns are wrapped in {% generation %} so that
# ``apply_chat_template(..., return_assistant_tokens_mask=True)`` marks them for SFT.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2000):
    """Train a byte-level BPE with Qwen2's pre-tokenizer on ``texts``.

    Args:
        texts: training text (e.g. GSM8K questions and answers).
        vocab_size: target vocabulary size in tokens, special tokens included.

    Returns:
        ``transformers.PreTrainedTokenizerFast`` with ``pad_token = <|endoftext|>``,
        ``eos_token = <|im_end|>`` and a ChatML ``chat_template``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(
    texts: Iterable[str],
    out_dir: str | os.PathLike,
    vocab_size: int = 2000,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = True,
    seed: int = 0,
) -> str:
    """Train a tokenizer on ``texts`` and save it with a random-initialised Qwen2 causal LM in ``out_dir``.

    The directory is written atomically (into a temporary sibling, then renamed), so a crash never leaves a
    half-written model that a later run would trust. An existing complete ``out_dir`` is replaced.

    Args:
        texts: training text for the BPE.
        out_dir: target directory.
        vocab_size: BPE vocabulary size in tokens (the model's embedding has exactly ``len(tokenizer)`` rows).
        hidden_size, intermediate_size, num_layers, num_attention_heads, num_key_value_heads: Qwen2 sizes.
        max_position_embeddings: context length in tokens.
        tie_word_embeddings: share the input embedding and ``lm_head`` weights.
        seed: ``torch`` seed for the random initialisation (same seed and text → same weights).

    Returns:
        ``out_dir`` as a string; load it with ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir).expanduser().resolve()
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    with atomic_directory(out) as tmp_dir:
        tmp = Path(tmp_dir)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "tiny_model.json").write_text(json.dumps({"built_by": "rlhf_core.models.tiny",
                                                         "vocab": len(tokenizer)}))
    return str(out)


def chat_texts(messages: Iterable[Mapping[str, Any]]) -> list[str]:
    """Training text for :func:`train_tokenizer` from one chat: each message's role and content, and the role of
    the turn the model writes (``assistant``).

    :data:`CHAT_TEMPLATE` writes every role name into the token stream (``<|im_start|>user``); a BPE that never saw
    them spells them a character each (13 of the 42 tokens of a Countdown prompt with a 400-token vocabulary,
    31 with them learned).

    Args:
        messages: ``{"role": str, "content": str}`` mappings (a verl ``prompt`` or SFT ``messages``).

    Returns:
        ``[role, content, ..., "assistant"]`` as strings.
    """
    texts: list[str] = []
    for message in messages:
        texts += [str(message["role"]), str(message["content"])]
    return texts + ["assistant"]


def gsm8k_texts(gsm8k_dir: str | os.PathLike, split: str = "train", limit: int | None = None) -> list[str]:
    """Questions and answers of a GSM8K jsonl split, as training text for :func:`train_tokenizer`.

    Raises:
        FileNotFoundError: when ``<gsm8k_dir>/<split>.jsonl`` is missing.
    """
    path = Path(gsm8k_dir) / f"{split}.jsonl"
    texts: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if limit is not None and i >= limit:
                break
            row = json.loads(line)
            texts.extend([row["question"], row["answer"]])
    return texts
