"""Partial rollouts on the HF engine (verl 0.9 ``fully_async_policy`` with ``async_training.partial_rollout=True``):
a generation that a parameter sync can interrupt at a token boundary and that resumes, with the weights loaded
meanwhile, from its prompts plus the tokens sampled so far.

A :class:`PartialGeneration` holds one call's state on the rollout rank: the prompts, the response and log-prob
buffers ``(B, T)``, the number of positions generated so far (the decode runs its rows in lockstep, so one count
for all rows; a row that ended holds padding after its EOS, as in an uninterrupted call), which rows are still
open, and the RNG state. A *segment* is one decode over the open rows: the first
(:meth:`PartialGeneration.run_segment` right after construction) starts from the prompts with the call's seed,
exactly as :meth:`HFRollout.generate_sequences` does; each later one feeds ``prompt + tokens so far`` (no padding
between them: an open row has no EOS yet) and continues the saved RNG stream. So:

* without an interrupt the tokens, masks and log-probs are those of ``generate_sequences`` (same seed, same
  decode call; ``tests/rlhf_core/workers/test_hf_partial.py``);
* each token's ``rollout_log_probs`` entry is log-softmax(logits / temperature) of the weights loaded when it was
  sampled: the prefix keeps the old weights' values, the continuation gets the new ones (the behaviour policy of
  that token, which rollout correction's per-token ratios need);
* ``rollout_last_segment (B,)`` int64: the segment of each row's last token (0: never resumed), from which the
  driver derives verl's per-sample ``min_global_steps`` / ``max_global_steps`` (parameter versions).

The resumed prefill recomputes the prefix's keys and values under the new weights (verl's vLLM resume does the
same: the KV cache is dropped at the sync).
"""
from __future__ import annotations

from typing import Callable

import torch

from rlhf_core.protocol import Batch
from rlhf_core.workers.rollout.postprocess import (build_rollout_batch, response_mask_from, sampling_call_index,
                                                   sampling_params)


def _rng_devices() -> list[int]:
    return [torch.cuda.current_device()] if torch.cuda.is_available() else []


class PartialGeneration:
    """One interruptible ``generate_sequences`` call of ``engine`` (an :class:`~rlhf_core.workers.rollout.hf_rollout.
    HFRollout`) on ``batch`` (``input_ids/attention_mask (B, P)`` left-padded, ``meta`` as ``generate_sequences``).
    Consumes one training call index of the engine's counter, as ``generate_sequences`` does."""

    def __init__(self, engine, batch: Batch) -> None:
        cfg = engine.config
        self.engine, self.batch = engine, batch
        self.params = sampling_params(cfg, batch.meta)
        self.T = int(cfg.response_length)
        self.ignore_eos = bool(cfg.ignore_eos)
        self.calc_lp = bool(cfg.calculate_log_probs)
        call, counted = sampling_call_index(engine.calls, batch.meta)
        engine.calls += int(counted)
        self.seed = engine.seed + 7919 * engine.rank + call
        B = len(batch)
        self.responses = torch.full((B, self.T), engine.pad_token_id, dtype=torch.long)
        self.log_probs = torch.zeros((B, self.T), dtype=torch.float32) if self.calc_lp else None
        self.filled = 0  # positions generated so far, the same for every row
        self.open = torch.ones(B, dtype=torch.bool)
        self.last_segment = torch.zeros(B, dtype=torch.long)
        self.segment = -1
        self.rng: tuple | None = None  # (cpu state, cuda states) after the last segment

    @property
    def done(self) -> bool:
        """Every row ended (EOS or ``response_length`` tokens)."""
        return not bool(self.open.any())

    @torch.no_grad()
    def run_segment(self, should_stop: Callable[[], bool] | None = None) -> bool:
        """Decode the open rows until they end or ``should_stop()`` (asked after each token: at least one token per
        open row) says stop; returns :attr:`done`. The first segment seeds the RNG as ``generate_sequences``; later
        ones continue its stream."""
        if self.done:
            return True
        self.segment += 1
        engine, rows = self.engine, self.open.nonzero().squeeze(-1)
        prompt_ids, prompt_mask = self.batch["input_ids"][rows], self.batch["attention_mask"][rows]
        ids = torch.cat([prompt_ids, self.responses[rows, :self.filled]], dim=-1)
        mask = torch.cat([prompt_mask.long(), torch.ones((len(rows), self.filled), dtype=torch.long)], dim=-1)
        was_training = engine.module.training
        engine.module.eval()
        devices = _rng_devices()
        try:
            with torch.random.fork_rng(devices=devices):
                if self.rng is None:
                    torch.manual_seed(self.seed)
                else:
                    torch.set_rng_state(self.rng[0])
                    for dev, state in zip(devices, self.rng[1]):
                        torch.cuda.set_rng_state(state, dev)
                gen, lp = engine.decode_tokens(ids, mask, self.T - self.filled, self.params, self.calc_lp,
                                               self.ignore_eos, should_stop)
                self.rng = (torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices])
        finally:
            engine.module.train(was_training)  # also when the decode raised
        gen, m = gen.cpu(), gen.shape[-1]
        self.responses[rows, self.filled:self.filled + m] = gen
        if self.calc_lp:
            self.log_probs[rows, self.filled:self.filled + m] = lp.cpu()
        self.last_segment[rows] = self.segment
        self.filled += m
        if not self.ignore_eos and engine.eos_ids:
            self.open[rows] = ~torch.isin(gen, torch.tensor(engine.eos_ids)).any(-1)
        if self.filled >= self.T:
            self.open[:] = False
        return self.done

    def result(self) -> Batch:
        """The rollout batch of ``generate_sequences`` plus ``rollout_last_segment (B,)`` int64.

        Raises:
            RuntimeError: rows are still open (resume the generation first).
        """
        if not self.done:
            raise RuntimeError(f"partial generation: {int(self.open.sum())} rows are still open; resume it first")
        engine = self.engine
        lengths = torch.full((len(self.batch),), self.filled, dtype=torch.long)
        mask = response_mask_from(self.responses, lengths, engine.eos_ids, self.ignore_eos)
        out = build_rollout_batch(self.batch, self.responses, mask, engine.pad_token_id, self.log_probs)
        out.tensors["rollout_last_segment"] = self.last_segment.clone()
        out.meta.update({"do_sample": self.params["do_sample"], "temperature": self.params["temperature"]})
        return out
