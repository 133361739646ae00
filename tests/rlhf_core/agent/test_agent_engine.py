"""The request scheduler: continuous vs static batching (step counts), same tokens under either schedule,
greedy equal to HF ``generate``, sampling filters; the manager packing a batch of tool-agent rows."""
from __future__ import annotations

import asyncio
import math

import pytest
import torch

from rlhf_core.agent.base import MultiTurnSettings
from rlhf_core.agent.engine import SamplingParams, StepEngine, sample_token
from rlhf_core.agent.manager import AgentLoopManager
from rlhf_core.agent.registry import load_agent_loop_specs
from rlhf_core.protocol import Batch
from tests.fixtures.agent_fixtures import make_model, make_tokenizer, tool


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return make_model(tok)


async def _gather(engine, budgets, prompts):
    return await asyncio.gather(*(engine.generate(p, b, f"r{i}") for i, (p, b) in enumerate(zip(prompts, budgets))))


def test_finished_requests_free_their_slot(model):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    budgets = [20, 2, 2]
    steps = {}
    for schedule in ("continuous", "static"):
        engine = StepEngine(model, [], 0, SamplingParams(), seed=3, max_num_seqs=2, schedule=schedule)
        outs = asyncio.run(_gather(engine, budgets, prompts))
        assert [len(o.token_ids) for o in outs] == budgets  # no EOS: every request uses its whole budget
        steps[schedule] = (engine.steps, engine.row_steps)
    # continuous: r0 runs 20 steps; r1 runs steps 1-2, r2 takes its slot for steps 3-4 → 20 steps, 24 rows
    # static: {r0, r1} until r0 ends (20 steps, r1's slot idle after step 2), then r2 alone (2) → 22 steps
    assert steps == {"continuous": (20, 24), "static": (22, 24)}


def test_same_tokens_under_either_schedule(model):
    prompts = [[5 + i, 6, 7 + i] for i in range(6)]
    budgets = [30, 3, 17, 5, 25, 1]
    eos = [11, 40, 77]  # frequent enough that some requests end early, at different steps
    results = {}
    for schedule, slots in (("continuous", 2), ("static", 4), ("static", 6)):
        engine = StepEngine(model, eos, 0, SamplingParams(temperature=0.9, top_k=50, top_p=0.95), seed=11,
                            max_num_seqs=slots, schedule=schedule)
        outs = asyncio.run(_gather(engine, budgets, prompts))
        results[(schedule, slots)] = [(o.token_ids, [round(x, 4) for x in o.log_probs]) for o in outs]
    first = results[("continuous", 2)]
    assert all(r == first for r in results.values())
    assert len({len(t) for t, _ in first}) > 2  # the lengths really differ
    assert all(t[-1] in eos or len(t) == b for (t, _), b in zip(first, budgets))


def test_greedy_matches_hf_generate(model):
    prompt = [5, 6, 7, 8]
    engine = StepEngine(model, [], 0, SamplingParams(do_sample=False), max_num_seqs=4)
    ours = asyncio.run(engine.generate(prompt, 12, "g")).token_ids
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                         pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref


def test_sample_token_filters():
    logits = torch.tensor([0.0, 2.0, 1.0, -1.0])
    g = torch.Generator().manual_seed(0)
    # top_k=1 and a tiny top_p both leave only the argmax (token 1)
    assert sample_token(logits, SamplingParams(top_k=1), g)[0] == 1
    assert sample_token(logits, SamplingParams(top_p=0.01), g)[0] == 1
    token, logprob = sample_token(logits, SamplingParams(do_sample=False, temperature=2.0), g)
    # log-softmax of logits / 2 at token 1: 1 - log(e^0 + e^1 + e^0.5 + e^-0.5)
    expected = 1.0 - torch.logsumexp(logits / 2, dim=0).item()
    assert token == 1 and logprob == pytest.approx(expected, abs=1e-6)
    # top_p=0.7: softmax = [.087, .644, .237, .032]; .644 < .7 so token 2 stays in, tokens 0 and 3 never drawn
    draws = {sample_token(logits, SamplingParams(top_p=0.7), g)[0] for _ in range(200)}
    assert draws == {1, 2}


def test_manager_packs_tool_agent_rows(tok, model):
    tools = {"calc_gsm8k_reward": tool("verl.tools.gsm8k_tool.Gsm8kTool", "calc_gsm8k_reward")}
    engine = StepEngine(model, [tok.eos_token_id], tok.pad_token_id, SamplingParams(), seed=1)
    manager = AgentLoopManager(engine, tok, MultiTurnSettings(response_length=16), tools,
                               load_agent_loop_specs(None), "single_turn_agent", tok.pad_token_id)
    rows = {"raw_prompt": [[{"role": "user", "content": "What is 6 times 12?"}]] * 2,
            "raw_prompt_ids": [[5, 6, 7]] * 2,
            "agent_name": ["tool_agent", None],
            "extra_info": [{"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}}, {}]}
    batch = Batch({"input_ids": torch.zeros((2, 3), dtype=torch.long)}, rows)
    out = manager.generate_sequences(batch)
    assert out["responses"].shape == (2, 16) and out["response_mask"].shape == (2, 16)
    assert out["prompts"][1, -3:].tolist() == [5, 6, 7]  # the single-turn row used raw_prompt_ids
    assert out.meta["metrics"]["num_turns/min"] >= 2
    bad = Batch({"input_ids": torch.zeros((1, 3), dtype=torch.long)},
                {"raw_prompt_ids": [[1]], "extra_info": [{"tools_kwargs": {"nope": {}}}]})
    with pytest.raises(ValueError, match=r"batch row 0: extra_info.tools_kwargs names unknown tools \['nope'\]"):
        manager.generate_sequences(bad)


def test_sample_token_reports_logprobs_mode():
    # logits ln 6, ln 3, ln 1 at temperature 0.5 → 36 : 9 : 1; top_k=2 leaves tokens 0 and 1 (36 : 9), so a draw
    # of token 1 reports ln(9/45) processed, ln(3/10) raw, its logit ln 3 raw and 2 ln 3 processed
    logits = torch.log(torch.tensor([6.0, 3.0, 1.0]))
    want = {"processed_logprobs": math.log(0.2), "raw_logprobs": math.log(0.3), "raw_logits": math.log(3.0),
            "processed_logits": 2 * math.log(3.0)}
    for mode, value in want.items():
        g = torch.Generator().manual_seed(0)
        draws = [sample_token(logits, SamplingParams(temperature=0.5, top_k=2, logprobs_mode=mode), g)
                 for _ in range(40)]
        assert {t for t, _ in draws} == {0, 1}
        assert [v for t, v in draws if t == 1][0] == pytest.approx(value, abs=1e-5), mode
