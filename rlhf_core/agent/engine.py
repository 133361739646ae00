"""A token-level scheduler over a Hugging Face causal LM: every trajectory's turn is its own request.

``continuous`` scheduling (``rollout.mode: async``): at every decoding step the running requests advance by
one token together; a finished request (EOS or its token budget) frees its slot at once and a waiting request
takes it, so one long trajectory never holds the others back (continuous batching, as vLLM/SGLang schedule).
``static`` scheduling (what ``mode: sync`` does for multi-turn here): a batch of waiting requests is admitted,
and nothing new starts until every one of them has finished.

Each step re-runs the forward over the running requests' whole sequences (left-padded, no KV cache): simple
and exact, fine for small models on CPU; vLLM's scheduler is the fast path for large ones. Sampling uses one
``torch.Generator`` per request seeded from ``(seed, request_id)``, and each row's logits do not depend on the
other rows, so a request samples the same tokens whatever it is batched with: both schedules give the same
trajectories for the same seeds.
"""
from __future__ import annotations

import asyncio
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from torch import nn

from rlhf_core.agent.base import TokenOutput
from rlhf_core.workers.rollout.hf_decode import LOGPROBS_MODES, sample_categorical

SCHEDULES = ("continuous", "static")


@dataclass
class SamplingParams:
    """``do_sample``, ``temperature`` (> 0), ``top_k`` (0 = off), ``top_p`` (1.0 = off); see
    ``rlhf_core.workers.rollout.postprocess.sampling_params``; ``logprobs_mode``: ``rollout.logprobs_mode``."""

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    logprobs_mode: str = "processed_logprobs"


@dataclass
class _Request:
    prompt_ids: list[int]
    max_new_tokens: int
    generator: torch.Generator
    future: asyncio.Future
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    request_id: str = ""
    versions: tuple[int, int] | None = None  # (first, last) weight version of its sampled tokens


def request_seed(seed: int, request_id: str) -> int:
    """A 63-bit seed from the base seed and the request id (crc32, stable across processes)."""
    return (int(seed) * 1_000_003 + zlib.crc32(request_id.encode())) % (2**63 - 1)


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """One token from ``logits (V,)`` float32: greedy when not sampling, else temperature, top-k, top-p (the
    smallest set of most likely tokens whose probability reaches ``top_p``), then a draw with ``generator``
    (:func:`~rlhf_core.workers.rollout.hf_decode.sample_categorical`).

    Returns:
        ``(token id, log-prob)`` where the log-prob is what ``params.logprobs_mode`` asks for (as
        :func:`~rlhf_core.workers.rollout.hf_decode.token_log_probs` in the sync rollout): ``processed_*`` of the
        logits drawn from (/ temperature, cut to top-k/top-p when sampling), ``raw_*`` of
        ``logits``; ``*_logprobs`` the log-softmax, ``*_logits`` the logit.
    """
    scaled = logits / params.temperature
    if not params.do_sample:
        token = int(torch.argmax(scaled))
        return token, _reported(logits, scaled, token, params.logprobs_mode)
    filtered = scaled.clone()
    if params.top_k > 0 and params.top_k < filtered.numel():
        kth = torch.topk(filtered, params.top_k).values[-1]
        filtered[filtered < kth] = float("-inf")
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(filtered, descending=True)
        cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= params.top_p  # mass before it already enough
        filtered[order[drop]] = float("-inf")
    token = int(sample_categorical(torch.softmax(filtered, dim=-1), generator))
    return token, _reported(logits, filtered, token, params.logprobs_mode)


def _reported(raw: torch.Tensor, processed: torch.Tensor, token: int, mode: str) -> float:
    """The value ``logprobs_mode`` reports at ``token`` from the raw or the processed logits ``(V,)``."""
    if mode not in LOGPROBS_MODES:
        raise ValueError(f"actor_rollout_ref.rollout.logprobs_mode={mode!r}: expected one of {LOGPROBS_MODES}")
    logits = processed if mode.startswith("processed") else raw
    return float(torch.log_softmax(logits, dim=-1)[token] if mode.endswith("logprobs") else logits[token])


class StepEngine:
    """The :class:`~rlhf_core.agent.base.Policy` over ``module``.

    Args:
        module: causal LM (``forward(input_ids, attention_mask, position_ids).logits``), in eval mode.
        eos_ids: tokens that end a request (kept as its last token). pad_token_id: the left-padding id.
        params: sampling. seed: base seed of the per-request generators.
        max_num_seqs: running requests at most (``rollout.max_num_seqs``).
        schedule: ``continuous`` or ``static``.
        gate: a :class:`~rlhf_core.agent.pause.WeightGate` each decoding step runs inside (partial rollouts: a
            weight load between two steps); None: none. Each finished request's (first, last) weight version is
            kept in ``request_versions[request_id]`` (``(0, 0)`` without a gate).

    Raises:
        ValueError: for an unknown ``schedule`` or ``max_num_seqs < 1``.
    """

    def __init__(self, module: nn.Module, eos_ids: list[int], pad_token_id: int, params: SamplingParams,
                 seed: int = 0, max_num_seqs: int = 1024, schedule: str = "continuous", gate=None) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if max_num_seqs < 1:
            raise ValueError(f"rollout.max_num_seqs must be >= 1, got {max_num_seqs}")
        self.module, self.eos_ids, self.pad_token_id = module, set(int(e) for e in eos_ids), int(pad_token_id)
        self.params, self.seed, self.max_num_seqs, self.schedule = params, int(seed), int(max_num_seqs), schedule
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlhf-engine")
        self.steps = 0          # forward passes run
        self.row_steps = 0      # sum over steps of running requests (the batch work done)
        self.gate = gate
        self.request_versions: dict[str, tuple[int, int]] = {}

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, request_id: str) -> TokenOutput:
        """Queue one request and wait for its tokens (see the module docstring)."""
        loop = asyncio.get_running_loop()
        generator = torch.Generator().manual_seed(request_seed(self.seed, request_id))
        request = _Request(list(prompt_ids), int(max_new_tokens), generator, loop.create_future(),
                           request_id=request_id)
        if request.max_new_tokens <= 0:
            return TokenOutput([], [])
        self._waiting.append(request)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._serve())
        return await request.future

    def _admit(self) -> None:
        if self.schedule == "static" and self._running:
            return
        while self._waiting and len(self._running) < self.max_num_seqs:
            self._running.append(self._waiting.popleft())

    @torch.no_grad()
    def _last_logits(self, sequences: list[list[int]]) -> torch.Tensor:
        width = max(len(s) for s in sequences)
        device = next(self.module.parameters()).device
        ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for i, seq in enumerate(sequences):
            ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[i, width - len(seq):] = 1
        positions = torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0)
        out = self.module(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device))
        return out.logits[:, -1, :].float().cpu()

    def _gated_logits(self, sequences: list[list[int]]) -> tuple[torch.Tensor, int]:
        if self.gate is None:
            return self._last_logits(sequences), 0
        with self.gate.step() as version:
            return self._last_logits(sequences), version

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await asyncio.sleep(0)  # let requests issued in the same tick join this step
                self._admit()
                if not self._running:
                    return
                batch = list(self._running)
                logits, version = await loop.run_in_executor(self._executor, self._gated_logits,
                                                             [r.prompt_ids + r.out_ids for r in batch])
                self.steps += 1
                self.row_steps += len(batch)
                for row, request in zip(logits, batch):
                    token, logprob = sample_token(row, self.params, request.generator)
                    request.out_ids.append(token)
                    request.out_logprobs.append(logprob)
                    request.versions = (version, version) if request.versions is None else \
                        (request.versions[0], version)
                    if token in self.eos_ids or len(request.out_ids) >= request.max_new_tokens:
                        self._running.remove(request)
                        self.request_versions[request.request_id] = request.versions
                        request.future.set_result(TokenOutput(request.out_ids, request.out_logprobs))
        except BaseException as exc:  # a failed forward must fail every waiting trajectory, not hang them
            for request in self._running + list(self._waiting):
                if not request.future.done():
                    request.future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            self._running.clear()
            self._waiting.clear()
            raise
