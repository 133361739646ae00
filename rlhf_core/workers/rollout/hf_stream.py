"""A rollout rank's continuous-batching session (:class:`RolloutStream`): the rank side of a rollouter that submits
prompts as they come and takes each response back as soon as it ends (verl's fully async rollouter over an async
engine), on :class:`~rlhf_core.workers.rollout.hf_continuous.ContinuousDecoder`.

* :meth:`RolloutStream.submit` queues a batch of rows (left-padded prompts, ``generate_sequences``' input). Each
  submitted batch is one sampling call of the engine: it consumes one call index (``HFRollout.calls``, as
  ``generate_sequences`` does) and its rows draw the uniforms that call's seeded ``decode`` would
  (:func:`~rlhf_core.workers.rollout.hf_continuous.call_uniforms`), so a batch submitted alone and run to the end gives
  ``generate_sequences``' responses, masks and log-probs row for row, whatever the slots and the other batches
  in flight (``tests/rlhf_core/workers/test_hf_stream.py``).
* :meth:`RolloutStream.advance` decodes until at least one row ends (or ``should_stop`` says stop, or nothing is
  open) and returns the rows that ended, as ``generate_sequences``' output rows plus ``rollout_first_load`` /
  ``rollout_last_load (m,)`` int64 (the engine's weight loads before the row's first / last token: a driver maps
  them to parameter versions) and ``stream_row (m,)`` int64 (the row's index in its submitted batch).
* A weight load (``HFRollout.sync_weights``) while rows are open makes them continue under the new weights from
  ``prompt + tokens so far`` (their caches recomputed, as ``hf_partial.py`` resumes; the tokens already drawn keep
  their log-probs under the weights that drew them).

Slots: one source of truth with the sub-batches it replaces: ``async_training.concurrent_samples_per_replica`` ×
``rollout.n`` rows per rank (a replica's ``k`` prompts with their ``n`` samples each).
"""
from __future__ import annotations

from typing import Callable

import torch

from rlhf_core.protocol import Batch
from rlhf_core.workers.rollout.hf_continuous import ContinuousDecoder, Finished, call_uniforms
from rlhf_core.workers.rollout.hf_decode import token_log_probs
from rlhf_core.workers.rollout.postprocess import (build_rollout_batch, response_mask_from, sampling_call_index,
                                                   sampling_params)


class RolloutStream:
    """One rank's session over ``engine`` (an :class:`~rlhf_core.workers.rollout.hf_rollout.HFRollout` whose model
    :class:`ContinuousDecoder` accepts) with ``slots`` rows decoded at once. Every submitted batch must share the
    first one's sampling settings (``sampling_params`` of its meta).

    Raises:
        ValueError: from :class:`ContinuousDecoder` (slots < 1, a model it cannot run); a later batch with other
            sampling settings."""

    def __init__(self, engine, slots: int) -> None:
        self.engine, self.slots = engine, int(slots)
        self.decoder: ContinuousDecoder | None = None
        self.params: dict | None = None
        self.rows: list[tuple[int, int]] = []  # request index -> (submission, row)
        self.batches: list[Batch] = []
        self.cfg = engine.config
        self.T = int(self.cfg.response_length)
        self.ignore_eos = bool(self.cfg.ignore_eos)
        self.calc_lp = bool(self.cfg.calculate_log_probs)

    def _decoder(self, params: dict) -> ContinuousDecoder:
        if self.decoder is None:
            self.params = params
            mode = str(self.cfg.logprobs_mode) if self.engine.logprobs_mode is None else self.engine.logprobs_mode

            def logprob_fn(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
                return token_log_probs(logits[:, None], tokens[:, None], mode, params["do_sample"],
                                       params["temperature"], params["top_k"], params["top_p"])[:, 0]

            self.decoder = ContinuousDecoder(self.engine.module, self.slots, [] if self.ignore_eos else
                                             self.engine.eos_ids, params["do_sample"], params["temperature"],
                                             params["top_k"], params["top_p"],
                                             logprob_fn=logprob_fn if self.calc_lp else None)
        elif params != self.params:
            raise ValueError(f"a rollout stream samples with one setting: {params} after {self.params}")
        return self.decoder

    @property
    def open(self) -> int:
        """Rows submitted and not yet returned."""
        return 0 if self.decoder is None else self.decoder.open

    def submit(self, batch: Batch) -> None:
        """Queue ``batch``'s rows (``input_ids/attention_mask (B, P)`` left-padded, ``meta`` as
        ``generate_sequences``); one call index of the engine's counter, as ``generate_sequences``."""
        engine = self.engine
        decoder = self._decoder(sampling_params(self.cfg, batch.meta))
        call, counted = sampling_call_index(engine.calls, batch.meta)
        engine.calls += int(counted)
        dev = next(engine.module.parameters()).device
        u = call_uniforms(engine.seed + 7919 * engine.rank + call, len(batch), self.T, dev)
        self.batches.append(batch)
        for i in range(len(batch)):
            prompt = batch["input_ids"][i][batch["attention_mask"][i].bool()]
            decoder.submit(prompt, self.T, uniforms=u[i])
            self.rows.append((len(self.batches) - 1, i))

    def weights_loaded(self) -> None:
        """The engine loaded new weights: open rows continue under them (caches recomputed), their later tokens
        recorded with the next load count."""
        if self.decoder is not None:
            self.decoder.version += 1
            self.decoder.reprefill()

    @torch.no_grad()
    def advance(self, should_stop: Callable[[], bool] | None = None) -> Batch | None:
        """Decode until a row ends, ``should_stop()`` (asked after each step) is True, or nothing is open; the rows
        that ended (module docstring), or None when none did."""
        if self.decoder is None:
            return None
        module = self.engine.module
        was_training = module.training
        module.eval()
        finished: list[Finished] = []
        try:
            while self.decoder.open and not finished:
                finished = self.decoder.step()
                if should_stop is not None and should_stop():
                    break
        finally:
            module.train(was_training)
        return self._rows(finished) if finished else None

    def _rows(self, finished: list[Finished]) -> Batch:
        pad = self.engine.pad_token_id
        parts = []
        for f in finished:
            b, i = self.rows[f.request]
            prompt = self.batches[b].index([i])
            responses = torch.full((1, self.T), pad, dtype=torch.long)
            responses[0, :len(f.tokens)] = f.tokens
            mask = response_mask_from(responses, torch.tensor([len(f.tokens)]), self.engine.eos_ids, self.ignore_eos)
            lp = None
            if self.calc_lp:
                lp = torch.zeros((1, self.T), dtype=torch.float32)
                lp[0, :len(f.tokens)] = f.log_probs
            out = build_rollout_batch(prompt, responses, mask, pad, lp)
            out.tensors.update({"rollout_first_load": torch.tensor([f.versions[0]]),
                                "rollout_last_load": torch.tensor([f.versions[1]]),
                                "stream_row": torch.tensor([i])})
            out.meta.update({"do_sample": self.params["do_sample"], "temperature": self.params["temperature"]})
            parts.append(out)
        return Batch.concat(parts)
