"""Partial rollouts of agent loops (rlhf_core/agent/pause.py): a weight load between two decoding steps of the
engine, the trajectories going on with the new weights; per-token log-probs of the weights that sampled each token,
per-request (first, last) weight versions; no load: the same result as the engine without a gate."""
from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import torch

from rlhf_core.agent.engine import SamplingParams, StepEngine, request_seed, sample_token
from rlhf_core.agent.pause import WeightGate
from rlhf_core.workers.rollout.agent_rollout import AgentRollout, _row_versions
from rlhf_core.workers.rollout.hf_rollout import HFRollout
from tests.fixtures.agent_fixtures import make_model, make_tokenizer
from tests.rlhf_core.agent.test_agent_rollout import _batch, _rollout_cfg

PARAMS = SamplingParams(temperature=0.9)
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 15]]
BUDGETS = [8, 3, 3, 2]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def models(tok):
    old = make_model(tok)
    new = copy.deepcopy(old)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return old, new


class _LoadAfter(torch.nn.Module):
    """``inner``'s forward; during forward call ``k`` a thread interrupts ``gate`` and loads ``weights`` (it waits
    for that forward to end: the gate holds the step; step k+1 waits for the load)."""

    def __init__(self, inner, gate: WeightGate, k: int, weights: dict) -> None:
        super().__init__()
        self.inner, self.gate, self.k, self.weights, self.calls = inner, gate, k, weights, 0
        self.loader: threading.Thread | None = None

    def forward(self, **kwargs):
        self.calls += 1
        if self.calls == self.k:
            self.gate.interrupt()
            self.loader = threading.Thread(target=self.gate.load,
                                           args=(lambda: self.inner.load_state_dict(self.weights),))
            self.loader.start()
        return self.inner(**kwargs)


async def _run(engine):
    return await asyncio.gather(*(engine.generate(p, b, f"r{i}") for i, (p, b) in enumerate(zip(PROMPTS, BUDGETS))))


def _replay(models, prompt, tokens, versions, rid):
    """The tokens and log-probs a request samples when token t comes from ``models[versions[t]]`` (one row, its own
    seeded generator, as the engine)."""
    gen = torch.Generator().manual_seed(request_seed(3, rid))
    engines = [StepEngine(m, [], 0, PARAMS) for m in models]
    out, lps = [], []
    for v in versions:
        logits = engines[v]._last_logits([prompt + out])[0]
        token, lp = sample_token(logits, PARAMS, gen)
        out.append(token)
        lps.append(lp)
    return out, lps


def test_load_between_steps_resumes_with_new_weights(models):
    old, new = models
    gate = WeightGate()
    module = _LoadAfter(copy.deepcopy(old), gate, 4, new.state_dict())
    engine = StepEngine(module, [], 0, PARAMS, seed=3, max_num_seqs=2, gate=gate)
    outs = asyncio.run(_run(engine))
    module.loader.join()
    # no EOS, 2 slots: steps 1-3 {r0, r1}; r1 ends at 3, r2 runs steps 4-6; r3 steps 7-8 beside r0 (8 tokens);
    # the load lands after forward 4: tokens of steps 1-4 from the old weights (version 0), 5-8 from the new (1)
    versions = {"r0": [0, 0, 0, 0, 1, 1, 1, 1], "r1": [0, 0, 0], "r2": [0, 1, 1], "r3": [1, 1]}
    assert engine.steps == 8 and gate.version == 1
    assert engine.request_versions == {"r0": (0, 1), "r1": (0, 0), "r2": (0, 1), "r3": (1, 1)}
    for i, out in enumerate(outs):
        tokens, lps = _replay(models, PROMPTS[i], out.token_ids, versions[f"r{i}"], f"r{i}")
        assert out.token_ids == tokens, i
        assert torch.allclose(torch.tensor(out.log_probs), torch.tensor(lps), atol=1e-5), i
    # the new weights matter: r0's last 4 log-probs are not the old weights' of the same tokens
    _, old_lps = _replay((old, old), PROMPTS[0], outs[0].token_ids, [0] * 8, "r0")
    assert not torch.allclose(torch.tensor(outs[0].log_probs[4:]), torch.tensor(old_lps[4:]), atol=1e-3)


def test_gate_without_load_equals_no_gate(models):
    old, _ = models
    runs = []
    for gate in (None, WeightGate()):
        engine = StepEngine(old, [11, 40], 0, PARAMS, seed=3, max_num_seqs=2, gate=gate)
        runs.append(([(o.token_ids, o.log_probs) for o in asyncio.run(_run(engine))], engine.steps))
        assert set(engine.request_versions.values()) == {(0, 0)}
    assert runs[0] == runs[1]


def test_agent_rollout_reports_versions_only_when_asked(tmp_path, tok, models):
    old, _ = models
    cfg = _rollout_cfg(tmp_path, mode="async", max_num_seqs=4)
    plain = AgentRollout(HFRollout(old, tok, cfg, seed=5), tok, cfg).generate_sequences(_batch())
    batch = _batch()
    batch.meta["report_weight_versions"] = True
    asked = AgentRollout(HFRollout(old, tok, cfg, seed=5), tok, cfg).generate_sequences(batch)
    assert set(asked.tensors) - set(plain.tensors) == {"rollout_min_version", "rollout_max_version"}
    for key in plain.tensors:  # no load during the chunk: the non-partial agent loop's result
        assert torch.equal(plain[key], asked[key]), key
    assert asked["rollout_min_version"].tolist() == [0] * 6 == asked["rollout_max_version"].tolist()


def test_row_versions_cover_every_turn_of_a_row():
    # row 0: turn0 under load 1, turn1 under loads 1-3; row 1: one request (single_turn_agent's id) under 2;
    # row 2: a repeat continuation (collabllm ids) 0-2; row 10 must not count as row 1
    got = _row_versions({"0/0/turn0": (1, 1), "0/0/turn1": (1, 3), "0/1": (2, 2), "0/2/repeat0/turn1": (0, 2),
                         "0/10": (5, 5)}, 0, 3)
    assert [t.tolist() for t in got] == [[1, 2, 0], [3, 2, 2]]


def test_a_failed_load_releases_the_interrupt_and_release_needs_no_load():
    gate = WeightGate()
    gate.interrupt()
    with pytest.raises(RuntimeError, match="boom"):
        gate.load(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    with gate.step() as version:  # not blocked: the failed load cleared the interrupt, counted no version
        assert version == 0
    gate.interrupt()
    gate.release()  # the trainer's path when the weights never reach the load
    done = threading.Event()
    threading.Thread(target=lambda: (gate.step().__enter__(), done.set()), daemon=True).start()
    assert done.wait(10) and gate.version == 0
