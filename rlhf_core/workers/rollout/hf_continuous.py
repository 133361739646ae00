"""Continuous batching (slot refilling) on a Hugging Face causal LM with a KV cache: a fixed number of *slots*
(rows of the decode batch); a request (one prompt's one sample) enters a free slot with its own prefill, decodes
in the shared batched step, leaves when it emits an EOS or reaches its ``max_new_tokens``, and its slot is taken at
the next step by the next waiting request while the other slots keep decoding (vLLM's / SGLang's scheduling, which
verl's fully async rollouter relies on; :func:`~rlhf_core.workers.rollout.hf_decode.decode` instead decodes a
batch in lockstep until its longest row ends).

Layout. Each slot owns one row of per-layer key/value buffers ``(slots, kv_heads, W, head_dim)``; a slot's row
holds its request's prompt (as prefilled, left padding included) and its tokens so far, from column 0; a boolean
``valid (slots, W)`` marks the columns that hold tokens. A decode step feeds every slot's last token at its own
position (``position_ids`` = tokens so far − 1 + 1, counted per request as ``generate`` does) and writes its key and
value at the slot's own next column (:class:`_SlotLayer`); the 4-D mask ``valid[:, None, None, :]`` (transformers
passes it through unchanged for SDPA full attention) makes every slot attend over its own cache only. A request
entering runs its prefill alone with the other entering ones (distinct prompts once, as ``decode``), and its
keys/values are copied into its slot's row. When nothing waits, finished slots are dropped from the batch instead
of idling (the buffers are re-indexed), so the tail of a run decodes only the rows still open.

Sampling. Every request has its own ``torch.Generator`` seeded from its ``seed``, and a step draws one uniform per
row from that row's generator (:func:`~rlhf_core.workers.rollout.hf_decode.sample_categorical` with
``generators``); warpers (temperature, top-k, top-p) are per row. A request's logits are its own prompt's and
tokens' (its slot's mask) and its draws its own stream's, so its tokens do not depend on its slot or its
neighbours; ``decode(..., generators=...)`` with the same per-row generators draws the same uniforms, and greedy and
seeded sampling give its tokens row for row (logits equal to float rounding: the batch composition and padding
differ; ``tests/rlhf_core/workers/test_hf_continuous.py``). ``decode`` without ``generators`` (the rollout's
existing path) still draws every row from the call's one seeded global stream, unchanged.

The rollout's existing streams. ``decode`` without ``generators`` draws, at step ``t``, ``torch.rand((b, 1))`` from
the call's seeded global stream, so row ``i`` at step ``t`` uses value ``t·b + i`` of that stream whatever the
other rows do (a finished row still draws). :func:`call_uniforms` draws those same values beforehand, and a
request submitted with ``uniforms`` = its row uses its ``t``-th value for its ``t``-th token: the call's tokens are
then ``decode``'s (and ``HFRollout.generate_sequences``' with the same seed) row for row, while each request's
tokens still do not depend on its slot or neighbours.

Weights may change between two steps (:meth:`ContinuousDecoder.reprefill`): every open request's cache is then
recomputed from ``prompt + tokens so far`` under the new weights (as ``hf_partial.py`` resumes an interrupted
generation, and verl's vLLM resume drops its cache); its generator continues its stream.

Limits: the model's own forward (no grouped attention or reordered weights, ``hf_decode``'s fast path), SDPA models
whose layers are all full attention (:func:`~rlhf_core.kernels.grouped_attention.sdpa_full_attention`); otherwise
:class:`ContinuousDecoder` raises.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlhf_core import kernels
from rlhf_core.kernels.grouped_attention import sdpa_full_attention
from rlhf_core.workers.rollout.hf_decode import next_token_probs, sample_categorical, sampling_warpers


class _SlotLayer(DynamicLayer):
    """Key/value buffers ``(R, h, W, d)`` with a write column per row: ``update`` writes row ``r``'s new key/value
    (one query token) at column ``cols[r]`` and returns the buffers' first ``width`` columns."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.k_buf, self.v_buf = keys, values
        self.cols: torch.Tensor | None = None
        self.width = 0
        self.device, self.is_initialized = keys.device, True
        self.keys, self.values = keys, values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write one decoding step's ``key_states`` / ``value_states`` ``(R, h, 1, d)`` (the buffers' dtype and
        device) at column ``cols[r]`` of row ``r`` (``cols (R,)`` int64, set by the decoder before the forward) and
        return ``(keys, values)``: views of the buffers' first ``width`` columns, ``(R, h, width, d)``. The other
        arguments of transformers' ``DynamicLayer.update`` (cache kwargs) are ignored."""
        rows = torch.arange(key_states.shape[0], device=key_states.device)
        self.k_buf[rows, :, self.cols] = key_states[:, :, 0]
        self.v_buf[rows, :, self.cols] = value_states[:, :, 0]
        self.keys, self.values = self.k_buf[:, :, :self.width], self.v_buf[:, :, :self.width]
        return self.keys, self.values


@dataclass
class Finished:
    """A request that left its slot: ``tokens (n,)`` int64 (its EOS included, ``n ≤ max_new_tokens``), ``logits
    (n, V)`` float32 raw logits of each step (None unless ``output_logits``), the step at which it entered (its
    first token was sampled at that step), the step of its last token, and its slot (0-based)."""

    request: int
    tokens: torch.Tensor
    logits: torch.Tensor | None
    entered: int
    finished: int
    slot: int
    log_probs: torch.Tensor | None = None  # (n,) float32, from ``logprob_fn`` when given
    versions: tuple[int, int] = (0, 0)  # ``ContinuousDecoder.version`` at its first and at its last token


def call_uniforms(seed: int, rows: int, steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(rows, steps)`` float32: the uniforms ``decode`` (without ``generators``) draws for a call of ``rows`` rows
    after ``torch.manual_seed(seed)`` — one ``torch.rand((rows, 1))`` per step — drawn here on a forked RNG (the
    global stream is left as it was)."""
    devices = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        return torch.cat([torch.rand((rows, 1), device=device) for _ in range(steps)], dim=1)


@dataclass
class _Request:
    prompt: torch.Tensor
    max_new_tokens: int
    generator: torch.Generator | None
    uniforms: torch.Tensor | None = None
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    first_version: int = 0
    entered: int = -1
    slot: int = -1


class ContinuousDecoder:
    """Continuous batching over ``slots`` rows (module docstring).

    Args:
        model: a causal LM accepting ``cache``/``position_ids``/``logits_to_keep`` and a 4-D boolean mask (SDPA,
            full attention), in eval mode. slots: rows decoded at once (≥ 1).
        eos_ids: a request ends after emitting one of these (empty: only ``max_new_tokens`` ends it).
        do_sample, temperature, top_k, top_p: ``generate``'s warpers (``sampling_warpers``); greedy = argmax.
        output_logits: keep every step's raw float32 logits per request.
        logprob_fn: ``(logits (r, V) float32, tokens (r,) int64) -> (r,)`` evaluated at every step on the rows that
            sampled (e.g. ``token_log_probs`` for ``rollout.logprobs_mode``); kept per request (``Finished.log_probs``)
            without keeping the logits.

    ``version`` (an int the owner sets, e.g. the weight loads so far) is recorded at each request's first and last
    token (``Finished.versions``).

    Raises:
        ValueError: ``slots < 1``, or a model whose attention is not SDPA over full-attention layers only.
    """

    def __init__(self, model: nn.Module, slots: int, eos_ids: Sequence[int], do_sample: bool,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, output_logits: bool = False,
                 logprob_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        kernels.install()  # "sdpa" as the rollout runs it (transformers' own in float32; by products for bf16 on CPU)
        if slots < 1:
            raise ValueError(f"continuous batching needs at least one slot, got {slots}")
        if not sdpa_full_attention(model):
            raise ValueError(f"continuous batching needs SDPA attention over full-attention layers only; "
                             f"{type(model).__name__} ({getattr(model.config, '_attn_implementation', None)}) is not")
        self.model, self.slots = model, int(slots)
        self.device = next(model.parameters()).device
        self.eos = torch.tensor(sorted({int(e) for e in eos_ids}), dtype=torch.long)
        self.do_sample, self.output_logits = bool(do_sample), bool(output_logits)
        self.warpers = sampling_warpers(do_sample, temperature, top_k, top_p)
        self.logprob_fn = logprob_fn
        self.version = 0
        self.requests: list[_Request] = []
        self.waiting: deque[int] = deque()
        self.rows: list[int | None] = []  # row → request index (None: free this step)
        self.step_index = 0
        self.events: list[tuple[int, str, int, int]] = []  # (step, "enter"/"finish", request, slot)
        self.cache: DynamicCache | None = None
        self.valid = torch.zeros((0, 0), dtype=torch.bool, device=self.device)
        self.wpos = torch.zeros(0, dtype=torch.long, device=self.device)  # next column to write, per row
        self.npos = torch.zeros(0, dtype=torch.long, device=self.device)  # position id of the next token fed
        self.prefill_rows: set[int] = set()  # rows whose cache is (re)built from prompt + tokens at the next step
        self.last = torch.zeros(0, dtype=torch.long)  # each row's last sampled token (fed at the next step)

    # ---- requests ---------------------------------------------------------------------------------------------
    def submit(self, prompt: torch.Tensor, max_new_tokens: int, seed: int = 0,
               uniforms: torch.Tensor | None = None) -> int:
        """Queue one request: ``prompt (p,)`` int64 token ids (no padding, p ≥ 1), up to ``max_new_tokens`` (≥ 1),
        sampled with ``torch.Generator().manual_seed(seed)``, or with ``uniforms (≥ max_new_tokens,)`` (its ``t``-th
        token drawn with ``uniforms[t]``: a row of :func:`call_uniforms`). Returns its index (submission order).

        Raises:
            ValueError: an empty or non-1-D prompt, ``max_new_tokens < 1``, or fewer uniforms than tokens."""
        prompt = torch.as_tensor(prompt, dtype=torch.long).cpu()
        if prompt.dim() != 1 or prompt.numel() == 0 or int(max_new_tokens) < 1:
            raise ValueError(f"a request needs a non-empty 1-D prompt and max_new_tokens >= 1, got prompt shape "
                             f"{tuple(prompt.shape)} and max_new_tokens={max_new_tokens}")
        if uniforms is not None and (uniforms.dim() != 1 or uniforms.numel() < int(max_new_tokens)):
            raise ValueError(f"a request of max_new_tokens={max_new_tokens} needs as many uniforms, got shape "
                             f"{tuple(uniforms.shape)}")
        generator = torch.Generator().manual_seed(int(seed)) if uniforms is None else None
        self.requests.append(_Request(prompt, int(max_new_tokens), generator, uniforms))
        self.waiting.append(len(self.requests) - 1)
        return len(self.requests) - 1

    @property
    def open(self) -> int:
        """Requests waiting or decoding."""
        return len(self.waiting) + sum(r is not None for r in self.rows)

    def reprefill(self) -> None:
        """Rebuild every open request's cache at the next step from ``prompt + tokens so far`` (after a weight
        load: the keys/values under the new weights); the requests keep their generators and tokens."""
        self.prefill_rows.update(i for i, r in enumerate(self.rows) if r is not None)

    # ---- the loop ---------------------------------------------------------------------------------------------
    def run(self, on_finish: Callable[[Finished], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> list[Finished]:
        """Step until no request is open, or ``should_stop()`` (asked after each step) says stop; each finished
        request is passed to ``on_finish`` the step it ends. Returns the finished ones, in finishing order."""
        done: list[Finished] = []
        while self.open:
            for f in self.step():
                done.append(f)
                if on_finish is not None:
                    on_finish(f)
            if should_stop is not None and should_stop():
                break
        return done

    @torch.no_grad()
    def step(self) -> list[Finished]:
        """One decoding step: free rows take waiting requests (prefill), the other open rows decode their last token,
        every open row samples one token; returns the requests that ended at this step (their slots are free
        for the next step's refill; with nothing waiting the free rows are dropped)."""
        self._admit()
        if not any(r is not None for r in self.rows):
            return []
        R = len(self.rows)
        logits = torch.empty((R, 0))
        decode_rows = [i for i, r in enumerate(self.rows) if r is not None and i not in self.prefill_rows]
        if decode_rows:
            logits = self._decode_forward()
        if self.prefill_rows:
            logits = self._prefill(sorted(self.prefill_rows), logits)
            self.prefill_rows.clear()
        open_rows = [i for i, r in enumerate(self.rows) if r is not None]
        lg = logits[open_rows].float()
        if self.do_sample:
            reqs = [self.requests[self.rows[i]] for i in open_rows]
            u = torch.cat([r.uniforms[len(r.tokens)].reshape(1).float() if r.uniforms is not None
                           else torch.rand((1,), generator=r.generator) for r in reqs])
            nxt = sample_categorical(next_token_probs(lg, self.warpers), uniforms=u)
        else:
            nxt = torch.argmax(lg, dim=-1)
        lps = self.logprob_fn(lg, nxt).float().cpu() if self.logprob_fn is not None else None
        nxt = nxt.cpu()
        finished = []
        for j, i in enumerate(open_rows):
            req = self.requests[self.rows[i]]
            tok = int(nxt[j])
            if not req.tokens:
                req.first_version = self.version
            req.tokens.append(tok)
            if lps is not None:
                req.log_probs.append(float(lps[j]))
            if self.output_logits:
                req.logits.append(lg[j].cpu())
            if bool((self.eos == tok).any()) or len(req.tokens) >= req.max_new_tokens:
                finished.append(self._finish(i))
        self.last[open_rows] = nxt
        self.step_index += 1
        if not self.waiting and any(r is None for r in self.rows):
            self._compact()
        return finished

    def _finish(self, row: int) -> Finished:
        index = self.rows[row]
        req = self.requests[index]
        self.rows[row] = None
        self.events.append((self.step_index, "finish", index, req.slot))
        logits = torch.stack(req.logits) if self.output_logits else None
        req.logits = []
        log_probs = torch.tensor(req.log_probs, dtype=torch.float32) if self.logprob_fn is not None else None
        return Finished(index, torch.tensor(req.tokens, dtype=torch.long), logits, req.entered, self.step_index,
                        req.slot, log_probs, (req.first_version, self.version))

    def _admit(self) -> None:
        """Free rows (lowest first), then new rows up to ``slots``, take waiting requests in submission order."""
        used = {self.requests[r].slot for r in self.rows if r is not None}
        free_slots = [s for s in range(self.slots) if s not in used]
        while self.waiting and (None in self.rows or len(self.rows) < self.slots):
            index = self.waiting.popleft()
            if None in self.rows:
                row = self.rows.index(None)
            else:
                row = len(self.rows)
                self._add_row()
            self.rows[row] = index
            req = self.requests[index]
            req.entered, req.slot = self.step_index, free_slots.pop(0)
            self.prefill_rows.add(row)
            self.events.append((self.step_index, "enter", index, req.slot))

    def _add_row(self) -> None:
        self.rows.append(None)
        self.valid = torch.cat([self.valid, self.valid.new_zeros((1, self.valid.shape[1]))])
        self.wpos = torch.cat([self.wpos, self.wpos.new_zeros(1)])
        self.npos = torch.cat([self.npos, self.npos.new_zeros(1)])
        self.last = torch.cat([self.last, self.last.new_zeros(1)])
        if self.cache is not None:
            for layer in self.cache.layers:
                layer.k_buf = torch.cat([layer.k_buf, layer.k_buf.new_zeros((1,) + layer.k_buf.shape[1:])])
                layer.v_buf = torch.cat([layer.v_buf, layer.v_buf.new_zeros((1,) + layer.v_buf.shape[1:])])

    def _compact(self) -> None:
        keep = [i for i, r in enumerate(self.rows) if r is not None]
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.rows = [self.rows[i] for i in keep]
        self.valid, self.wpos, self.npos = self.valid[idx], self.wpos[idx], self.npos[idx]
        self.last = self.last[keep]
        if self.cache is not None:
            for layer in self.cache.layers:
                layer.k_buf, layer.v_buf = layer.k_buf[idx], layer.v_buf[idx]

    def _ensure_width(self, width: int) -> None:
        """Grow the buffers (and ``valid``) to at least ``width`` columns."""
        extra = width - self.valid.shape[1]
        if extra <= 0:
            return
        self.valid = torch.cat([self.valid, self.valid.new_zeros((self.valid.shape[0], extra))], dim=1)
        if self.cache is not None:
            for layer in self.cache.layers:
                b, h, _, d = layer.k_buf.shape
                layer.k_buf = torch.cat([layer.k_buf, layer.k_buf.new_zeros((b, h, extra, d))], dim=2)
                layer.v_buf = torch.cat([layer.v_buf, layer.v_buf.new_zeros((b, h, extra, layer.v_buf.shape[-1]))],
                                        dim=2)

    def _decode_forward(self) -> torch.Tensor:
        """Every row's last token at its own position and column; rows about to be prefilled (and free rows) feed a
        dummy token at column 0, attending to it alone (their cache is rewritten or unused). ``(R, V)`` logits."""
        R = len(self.rows)
        rows = torch.arange(R, device=self.device)
        idle = torch.tensor([r is None or i in self.prefill_rows for i, r in enumerate(self.rows)],
                            device=self.device)
        self.wpos = torch.where(idle, torch.zeros_like(self.wpos), self.wpos)
        self.valid[idle] = False
        width = int(self.wpos.max()) + 1
        self._ensure_width(width)
        self.valid[rows, self.wpos] = True
        for layer in self.cache.layers:
            layer.cols, layer.width = self.wpos, width
        ids = self.last.to(self.device)[:, None]
        mask = self.valid[:, None, None, :width]
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=self.npos[:, None], cache=self.cache,
                         use_cache=True, logits_to_keep=1).logits[:, -1]
        self.wpos = self.wpos + 1
        self.npos = self.npos + 1
        return out

    def _prefill(self, rows: list[int], logits: torch.Tensor) -> torch.Tensor:
        """Prefill ``rows`` (left-padded together, each distinct sequence once) from ``prompt + tokens so far`` and
        copy their keys/values into their rows; their next-token logits go into ``logits`` (``(R, V)``)."""
        seqs = [torch.cat([self.requests[self.rows[i]].prompt,
                           torch.tensor(self.requests[self.rows[i]].tokens, dtype=torch.long)]) for i in rows]
        P = max(len(s) for s in seqs)
        ids = torch.zeros((len(rows), P), dtype=torch.long)
        mask = torch.zeros((len(rows), P), dtype=torch.long)
        for j, s in enumerate(seqs):
            ids[j, P - len(s):], mask[j, P - len(s):] = s, 1
        uniq, inverse = torch.unique(torch.cat([ids, mask], -1), dim=0, return_inverse=True)
        u_ids, u_mask = uniq[:, :P].to(self.device), uniq[:, P:].to(self.device)
        positions = (u_mask.cumsum(-1) - 1).masked_fill(u_mask == 0, 0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=u_ids, attention_mask=None if bool(u_mask.all()) else u_mask,
                         position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        if self.cache is None:  # the first prefill gives the layers' shapes
            self.cache = DynamicCache(config=self.model.config)
            self.cache.layers = [_SlotLayer(l.keys.new_zeros((len(self.rows), l.keys.shape[1], self.valid.shape[1],
                                                              l.keys.shape[3])),
                                            l.values.new_zeros((len(self.rows), l.values.shape[1],
                                                                self.valid.shape[1], l.values.shape[3])))
                                 for l in cache.layers]
        self._ensure_width(P + max(self.requests[self.rows[i]].max_new_tokens for i in rows))
        r = torch.tensor(rows, dtype=torch.long, device=self.device)
        inv = inverse.to(self.device)
        for slot_layer, layer in zip(self.cache.layers, cache.layers):
            slot_layer.k_buf[r, :, :P] = layer.keys[inv]
            slot_layer.v_buf[r, :, :P] = layer.values[inv]
        self.valid[r] = False
        self.valid[r, :P] = u_mask[inv].bool()
        self.wpos[r] = P
        self.npos[r] = u_mask[inv].sum(-1)
        if logits.shape[-1] == 0:
            logits = out.new_zeros((len(self.rows), out.shape[-1]))
        logits[r] = out[inv]
        return logits
