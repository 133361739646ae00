"""A rollout rank's continuous-batching session (rlhf_core/workers/rollout/hf_stream.py): rows come back as soon as
they end; a batch run through it equals ``generate_sequences`` on it row for row (same call seed), also with another
batch in flight; a weight load moves the open rows' last-token load count and continues them under the new
weights."""
from __future__ import annotations

import torch

from rlhf_core.workers.rollout.hf_stream import RolloutStream
from tests.rlhf_core.workers.test_hf_partial import T, _batch, _engine, _teacher_forced, weights  # noqa: F401


def _drain(stream, on_rows=None):
    parts, order = [], []
    while stream.open:
        rows = stream.advance()
        if rows is not None:
            parts.append(rows)
            order.append(stream.decoder.step_index)
            if on_rows is not None:
                on_rows(rows)
    return parts, order


def _by_row(parts, n):
    """Rows of the first submitted batch, by their index in it (``stream_row``)."""
    out = {}
    for p in parts:
        for j in range(len(p)):
            out.setdefault(int(p["stream_row"][j]), p.index([j]))
    return [out[i] for i in range(n)]


def test_a_batch_through_the_stream_equals_generate_sequences(weights):
    model, _ = weights
    ref = _engine(model).generate_sequences(_batch())
    engine = _engine(model)
    stream = RolloutStream(engine, slots=3)
    stream.submit(_batch())
    assert engine.calls == 1  # one call index, as generate_sequences
    parts, steps = _drain(stream)
    assert (ref["response_mask"].sum(1) < T).any() and (ref["response_mask"].sum(1) == T).any()  # EOS mid-batch
    assert len(parts) > 1 and steps == sorted(steps)  # rows came back in several returns, as they ended
    rows = _by_row(parts, len(ref))
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids", "prompts"):
        got = torch.cat([r[key] for r in rows])
        assert torch.equal(got, ref[key]), key
    # log-probs: the same tokens under the same weights; different batch composition -> float rounding
    got = torch.cat([r["rollout_log_probs"] for r in rows])
    torch.testing.assert_close(got, ref["rollout_log_probs"], rtol=0, atol=1e-5)
    assert all(int(r["rollout_first_load"]) == int(r["rollout_last_load"]) == 0 for r in rows)


def test_rows_end_and_return_before_the_longest_one(weights):
    model, _ = weights
    engine = _engine(model)
    stream = RolloutStream(engine, slots=4)
    stream.submit(_batch())
    first = None
    while first is None:
        first = stream.advance()
    # the first rows back ended with EOS before T tokens, while others are still open
    assert int(first["response_mask"].sum(1).max()) < T and stream.open > 0


def test_a_weight_load_mid_stream_continues_open_rows_under_the_new_weights(weights):
    model, state_b = weights
    engine = _engine(model)
    stream = engine.stream = RolloutStream(engine, slots=10)
    stream.submit(_batch())
    for _ in range(3):  # 3 tokens of every row under A (no row ends before its 6th token: fixture)
        assert not stream.decoder.step()
    engine.sync_weights(state_b)
    parts, _ = _drain(stream)
    rows = torch.cat([r["rollout_last_load"] for r in _by_row(parts, 10)])
    assert (torch.cat([r["rollout_first_load"] for r in _by_row(parts, 10)]) == 0).all() and (rows == 1).all()
    out = _by_row(parts, 10)
    temp = out[0].meta["temperature"]
    for r in out:
        lp = r["rollout_log_probs"][0]
        a = _teacher_forced(model, None, r, temp)[0]
        b = _teacher_forced(model, state_b, r, temp)[0]
        n = int(r["response_mask"].sum())
        # each token's log-prob under the weights that drew it: A for the first 3, B after (the cache recomputed)
        torch.testing.assert_close(lp[:3], a[:3], rtol=0, atol=1e-5)
        torch.testing.assert_close(lp[3:n], b[3:n], rtol=0, atol=1e-5)
