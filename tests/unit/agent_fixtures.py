"""A scripted policy (stand-in model emitting fixed turns) and a small ChatML tokenizer for agent-loop tests."""
from __future__ import annotations

import asyncio

from rlhf_core.agent.base import TokenOutput
from rlhf_core.data.prompts import encode
from rlhf_core.models.tiny import train_tokenizer
from rlhf_core.tools.config import build_tool

TEXTS = ["What is 6 times 12? The answer is 72. <tool_call>{\"name\": \"calc_gsm8k_reward\", \"arguments\": "
         "{\"answer\": \"72\"}}</tool_call> Current parsed answer reward tool error timed out failed slept"] * 20


def make_tokenizer():
    return train_tokenizer(TEXTS, vocab_size=400)


class ScriptedPolicy:
    """Returns ``turns[k]`` (encoded) + EOS on its k-th call, cut to ``max_new_tokens``; log-prob of the j-th
    token of a turn is ``-(j + 1) / 10`` so tests can check where each one lands. ``delays[k]`` seconds of
    sleep before answering simulate slow generations. Records every call."""

    def __init__(self, tokenizer, turns, delays=None):
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.delays = list(delays or [0.0] * len(self.turns))
        self.calls = []

    def turn_ids(self, k):
        return encode(self.tokenizer, self.turns[k]) + [self.tokenizer.eos_token_id]

    async def generate(self, prompt_ids, max_new_tokens, request_id):
        k = len(self.calls) % len(self.turns)
        self.calls.append((list(prompt_ids), max_new_tokens, request_id))
        await asyncio.sleep(self.delays[k])
        ids = self.turn_ids(k)[:max_new_tokens]
        return TokenOutput(ids, [-(j + 1) / 10 for j in range(len(ids))])


def make_model(tok):
    """A 2-layer Qwen2 (hidden 32, seed 0, eval mode) over ``tok``'s vocabulary: the agent tests' policy."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=512, tie_word_embeddings=True)).eval()


def tool(class_name, name, config=None):
    entry = {"class_name": class_name, "config": {"type": "native", **(config or {})},
             "tool_schema": {"type": "function", "function": {
                 "name": name, "description": "test tool",
                 "parameters": {"type": "object", "properties": {"x": {"type": "string"}, "answer": {"type": "string"}},
                                "required": []}}}}
    return build_tool(entry, "test")
