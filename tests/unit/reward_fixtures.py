"""Helpers for reward-manager tests: a character-level fake tokenizer and a padded generated batch."""
from __future__ import annotations

import torch

from rlhf_core.protocol import Batch

PAD, EOS = 0, 3


class CharTokenizer:
    """id = ord(char); 0 is the pad token and 3 the EOS token (both skipped with ``skip_special_tokens``)."""

    pad_token_id, eos_token_id = PAD, EOS

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in (PAD, EOS)]
        return "".join(chr(i) for i in ids)


def make_batch(
    tokenizer, prompts: list[str], responses: list[str], truths: list[str], data_sources: list[str],
    p_len: int = 12, t_len: int = 40, eos: bool = True,
) -> Batch:
    """Prompts left-padded to ``p_len``, responses (+EOS) right-padded to ``t_len`` (as rollout produces)."""
    b = len(prompts)
    prompt_ids = torch.full((b, p_len), tokenizer.pad_token_id, dtype=torch.long)
    response_ids = torch.full((b, t_len), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, p_len + t_len), dtype=torch.long)
    response_mask = torch.zeros((b, t_len), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        pi = tokenizer.encode(p)[-p_len:]
        ri = (tokenizer.encode(r) + ([tokenizer.eos_token_id] if eos else []))[:t_len]
        prompt_ids[i, p_len - len(pi):] = torch.tensor(pi)
        attention[i, p_len - len(pi):p_len] = 1
        response_ids[i, : len(ri)] = torch.tensor(ri)
        response_mask[i, : len(ri)] = 1
        attention[i, p_len : p_len + len(ri)] = 1
    return Batch.from_dict({
        "prompts": prompt_ids, "responses": response_ids, "response_mask": response_mask,
        "attention_mask": attention, "input_ids": torch.cat([prompt_ids, response_ids], 1),
        "data_source": list(data_sources),
        "reward_model": [{"style": "rule", "ground_truth": t} for t in truths],
        "extra_info": [{"index": i} for i in range(b)],
    })
