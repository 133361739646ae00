"""Hugging Face ``generate`` rollout (verl ``HFRollout``), hybrid-engine style.

The engine keeps a full, unsharded copy of the policy; :meth:`HFRollout.sync_weights` loads the actor's
gathered FSDP weights into it after every update (and at start-up). Sampling is reproducible: every call
seeds a forked RNG with ``seed + 7919·rank + call index`` (the training-call counter, or a validation index from
the global step: :func:`~rlhf_core.workers.rollout.postprocess.sampling_call_index`).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

import torch
from torch import nn
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from rlhf_core import kernels
from rlhf_core.progress import progress
from rlhf_core.workers.rollout.hf_decode import decode, supports_lean_decode, token_log_probs
from rlhf_core.workers.rollout.hf_partial import PartialGeneration
from rlhf_core.protocol import Batch
from rlhf_core.workers.rollout.postprocess import (build_rollout_batch, response_mask_from, sampling_call_index,
                                                   sampling_params)


def eos_ids_of(module: nn.Module, tokenizer) -> list[int]:
    """EOS ids: the tokenizer's plus the model generation config's (either may be a list)."""
    ids: set[int] = set()
    for v in (getattr(tokenizer, "eos_token_id", None), getattr(getattr(module, "generation_config", None), "eos_token_id", None)):
        if v is None:
            continue
        ids.update([int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)])
    return sorted(ids)


class _StopWhen(StoppingCriteria):
    """``generate``'s stopping criterion for every row at once when ``flag()`` is True (asked after each token)."""

    def __init__(self, flag: Callable[[], bool]) -> None:
        self.flag = flag

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), bool(self.flag()), dtype=torch.bool, device=input_ids.device)


class HFRollout:
    """Batched decoding with KV cache: :func:`~rlhf_core.workers.rollout.hf_decode.decode` (``model.generate``'s
    distributions, without its per-token overhead) when :func:`supports_lean_decode` holds for ``module``
    (``self.lean_decode``), else ``model.generate``.

    Args:
        module: the rollout's own (unsharded) causal LM, already on the device.
        tokenizer: gives ``pad_token_id`` and ``eos_token_id``.
        config: ``actor_rollout_ref.rollout`` (``temperature``, ``top_k``, ``top_p``, ``do_sample``, ``ignore_eos``,
            ``response_length``, ``val_kwargs``, ``calculate_log_probs``, ``logprobs_mode``).
        seed: base seed; rank: this worker's rank (different ranks sample differently).
        logprobs_mode: what ``rollout_log_probs`` hold (see ``rollout.logprobs_mode``); None: the config's
            ``logprobs_mode``. For a config without that key (``generation.yaml``'s rollout section).
    """

    def __init__(self, module: nn.Module, tokenizer, config: Mapping[str, Any], seed: int = 0, rank: int = 0,
                 logprobs_mode: str | None = None) -> None:
        kernels.install()  # the grouped decode attention and the packed prefill's per-sequence attention
        self.module = module
        self.tokenizer = tokenizer
        self.config = config
        self.logprobs_mode = logprobs_mode
        self.seed = int(seed)
        self.rank = int(rank)
        self.calls = 0
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = eos_ids_of(module, tokenizer)
        self.lean_decode = supports_lean_decode(module)
        self.use_remove_padding = False  # actor_rollout_ref.model.use_remove_padding (packed prefill), set by the worker
        self._interrupt = threading.Event()  # set by interrupt() from another thread, cleared by sync_weights
        self.partial: PartialGeneration | None = None  # the interruptible generation in flight (hf_partial.py)
        self.stream = None  # a continuous-batching session (hf_stream.RolloutStream), told of every weight load

    @torch.no_grad()
    def sync_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load the actor's full weights (HF key names, e.g. ``lm_head.weight`` included) into the engine.

        Raises ``RuntimeError`` (from ``load_state_dict``) on missing or unexpected keys."""
        dev = next(self.module.parameters()).device
        self.module.load_state_dict({k: v.to(dev) for k, v in state_dict.items()}, strict=True)
        if self.stream is not None:  # its open rows continue under the new weights (caches recomputed)
            self.stream.weights_loaded()
        self._interrupt.clear()  # the sync an interrupt asked for has happened

    # ---- partial rollouts (async_training.partial_rollout, hf_partial.py) --------------------------------------
    def interrupt(self) -> None:
        """Stop the partial generation in flight after its current token (thread-safe; a parameter sync waits).
        Stays set, stopping any segment after its first token, until :meth:`sync_weights` loads new weights."""
        self._interrupt.set()

    def release(self) -> None:
        """Undo :meth:`interrupt` when the weight load it waited for will not come (the sync failed)."""
        self._interrupt.clear()

    def start_partial(self, batch: Batch) -> bool:
        """Start an interruptible ``generate_sequences(batch)`` (:class:`~rlhf_core.workers.rollout.hf_partial.
        PartialGeneration`): True when it ran to the end, False when :meth:`interrupt` stopped it."""
        self.partial = PartialGeneration(self, batch)
        return self.partial.run_segment(self._interrupt.is_set)

    def resume_partial(self) -> bool:
        """Continue the interrupted generation with the weights loaded now; True when it ended.

        Raises:
            RuntimeError: no partial generation was started."""
        if self.partial is None:
            raise RuntimeError("resume_partial: no partial generation was started (start_partial)")
        return self.partial.run_segment(self._interrupt.is_set)

    def finish_partial(self) -> Batch:
        """The ended generation's rollout batch (``generate_sequences``' keys + ``rollout_last_segment (B,)``).

        Raises:
            RuntimeError: none was started, or rows are still open."""
        if self.partial is None:
            raise RuntimeError("finish_partial: no partial generation was started (start_partial)")
        out = self.partial.result()
        self.partial = None
        return out

    @torch.no_grad()
    def decode_tokens(self, ids: torch.Tensor, mask: torch.Tensor, T: int, params: dict, calc_lp: bool,
                      ignore_eos: bool, should_stop: Callable[[], bool] | None = None):
        """Up to ``T`` tokens after the left-padded ``ids``/``mask (b, P)`` (lean decode or ``generate``, with this
        call's RNG state): ``(tokens (b, n) int64, log_probs (b, n) float32 or None)`` on the engine's device,
        ``n ≤ T`` the steps run (fewer when every row ended, or ``should_stop`` returned True after a step);
        ``log_probs`` as ``rollout.logprobs_mode`` asks (:func:`token_log_probs`) at each drawn token, under the
        weights loaded now."""
        dev = next(self.module.parameters()).device
        ids, mask = ids.to(dev), mask.to(dev)
        eos = [] if ignore_eos else self.eos_ids
        if self.lean_decode:  # generate's distributions (hf_decode.py), without its per-token overhead
            gen, raw_logits = decode(self.module, ids, mask, T, eos, self.pad_token_id,
                                     params["do_sample"], params["temperature"], params["top_k"], params["top_p"],
                                     output_logits=calc_lp, pack_prompts=self.use_remove_padding,
                                     should_stop=should_stop)
        else:
            gen_cfg = GenerationConfig(
                do_sample=params["do_sample"], temperature=params["temperature"] if params["do_sample"] else None,
                top_k=params["top_k"] if params["do_sample"] else None,
                top_p=params["top_p"] if params["do_sample"] else None, max_new_tokens=T, num_beams=1,
                pad_token_id=self.pad_token_id, eos_token_id=eos, use_cache=True, return_dict_in_generate=True,
                output_logits=calc_lp)
            stop = StoppingCriteriaList([_StopWhen(should_stop)] if should_stop is not None else [])
            out = self.module.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg,
                                       stopping_criteria=stop)
            gen = out.sequences[:, ids.shape[-1]:]
            raw_logits = torch.stack(out.logits, dim=1) if calc_lp else None
        log_probs = None
        if calc_lp:
            # rollout.logprobs_mode: raw or warped logits, as log-probs or logits (rlhf generate passes its own)
            mode = str(self.config.logprobs_mode) if self.logprobs_mode is None else self.logprobs_mode
            log_probs = token_log_probs(raw_logits, gen, mode, params["do_sample"], params["temperature"],
                                        params["top_k"], params["top_p"])
        return gen, log_probs

    @torch.no_grad()
    def _generate_chunk(self, mb: Batch, params: dict, T: int, calc_lp: bool, ignore_eos: bool):
        gen, lp = self.decode_tokens(mb["input_ids"], mb["attention_mask"], T, params, calc_lp, ignore_eos)
        n, dev = gen.shape[-1], gen.device
        responses = torch.full((gen.shape[0], T), self.pad_token_id, dtype=torch.long, device=dev)
        responses[:, :n] = gen
        lengths = torch.full((gen.shape[0],), n, dtype=torch.long, device=dev)
        log_probs = None
        if calc_lp:
            log_probs = torch.zeros((gen.shape[0], T), dtype=torch.float32, device=dev)
            log_probs[:, :n] = lp
        return responses.cpu(), lengths.cpu(), None if log_probs is None else log_probs.cpu()

    def generate_sequences(self, batch: Batch) -> Batch:
        """Generate one response per row of ``batch`` (``input_ids/attention_mask/position_ids (B, P)``, left-padded).

        ``batch.meta``: ``do_sample``, ``validate`` (→ ``val_kwargs``), optional ``temperature``. Returns the
        ARCHITECTURE rollout batch; ``rollout_log_probs`` at each sampled token when ``calculate_log_probs``, as
        ``rollout.logprobs_mode`` asks (default ``processed_logprobs``: log-softmax of the logits the token was
        drawn from, i.e. / temperature and cut to top-k/top-p: :func:`token_log_probs`)."""
        cfg = self.config
        params = sampling_params(cfg, batch.meta)
        T = int(cfg.response_length)
        ignore_eos = bool(cfg.ignore_eos)
        calc_lp = bool(cfg.calculate_log_probs)
        size = len(batch)  # one generate() call per shard (verl's rollout has no micro-batch key)
        was_training = self.module.training
        self.module.eval()
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        call, counted = sampling_call_index(self.calls, batch.meta)
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed + 7919 * self.rank + call)
            parts = [self._generate_chunk(mb, params, T, calc_lp, ignore_eos)
                     for mb in progress(batch.split(size), "rollout", unit="micro-batch", leave=False)]
        self.calls += int(counted)
        self.module.train(was_training)
        responses = torch.cat([p[0] for p in parts])
        lengths = torch.cat([p[1] for p in parts])
        mask = response_mask_from(responses, lengths, self.eos_ids, ignore_eos)
        log_probs = torch.cat([p[2] for p in parts]) if calc_lp else None
        out = build_rollout_batch(batch, responses, mask, self.pad_token_id, log_probs)
        out.meta.update({"do_sample": params["do_sample"], "temperature": params["temperature"]})
        return out
