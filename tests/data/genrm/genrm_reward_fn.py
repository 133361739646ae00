"""A generative-reward-model reward function written as verl 0.9's (tests/experimental/reward_loop/reward_fn.py:
``compute_score_gsm8k``): it receives ``reward_router_address`` and ``reward_model_tokenizer``, posts an OpenAI chat
request with aiohttp to ``http://<address>/v1/chat/completions`` and reads the judge's reply as ``openai``'s
``ChatCompletion``, as verl's does. One difference from verl's file, for this test only: the score is the count of
digits in the reply, so that a tiny judge's greedy reply gives a known number (verl's parses the reply's last
paragraph as an integer)."""
import json

import aiohttp
from openai.types.chat import ChatCompletion

GRM_PROMPT_TEMPLATE = """
You are given a problem and a proposed solution.

Problem:
{problem}

Solution:
{solution}

Please evaluate how well the solution addresses the problem. Give a score from 1 to 10.
""".strip()


async def chat_complete(router_address: str, chat_complete_request: dict) -> ChatCompletion:
    url = f"http://{router_address}/v1/chat/completions"
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
    try:
        async with session.post(url, json=chat_complete_request) as resp:
            return ChatCompletion(**json.loads(await resp.text()))
    finally:
        await session.close()


def parse_score(reply: str) -> int:
    """The number of digits in the judge's reply."""
    return sum(c.isdigit() for c in reply)


async def compute_score_genrm(data_source, solution_str, ground_truth, extra_info, reward_router_address,
                              reward_model_tokenizer):
    question = (extra_info or {}).get("question", "")
    grm_prompt = GRM_PROMPT_TEMPLATE.format(problem=question, solution=solution_str)
    request = {"messages": [{"role": "user", "content": grm_prompt}], "temperature": 0.0, "max_tokens": 12}
    result = await chat_complete(reward_router_address, request)
    reply = result.choices[0].message.content
    return {"score": parse_score(reply), "genrm_response": reply,
            "judge_vocab": len(reward_model_tokenizer)}


def compute_score_wrong_signature(data_source, solution_str, ground_truth, extra_info):
    """A rule-style function: no reward_router_address / reward_model_tokenizer."""
    return 0.0
