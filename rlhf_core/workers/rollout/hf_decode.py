"""A lean decode loop for the HF rollout: ``model.generate``'s computation without its per-token overhead.

``generate`` spends, per token, Python time on its logits-processor and stopping-criteria lists, the deferred stop
check, ``prepare_inputs_for_generation`` (input slicing and clones, kwarg filtering) and model-kwarg bookkeeping;
for the small models this project trains on CPU that time is a large share of a decode step. :func:`decode`
runs the same computation directly: one prefill forward per *distinct* prompt (``rollout.n`` repeats each prompt),
then one forward per token. The prefill drops the columns that are padding in every row, and with
``use_remove_padding`` runs the prompts' valid tokens only (``packing.packed_prompt_pass``).

* On a Llama-form SDPA model the decode steps keep each prompt's keys and values once and attend to them for all
  its rows (``grouped_attention.py``, outputs equal to float rounding; distinct prompts are groups of one row); for
  stock Llama/Qwen2/Mistral models the step runs the model's modules without transformers' call plumbing, its
  linears on weights reordered for oneDNN (``packed_linear.py``: at 16 rows 2-3x the rate of torch's float32
  product on the 2-vCPU Intel machine, BENCHMARKS.md, "Limits of the machine").
* Otherwise (or with ``fast=False``, the reference path) every row gets a copy of its prompt's cache in buffers
  sized for the whole response (``DynamicLayer`` re-concatenates the whole cache every token), and SDPA models
  with only full-attention layers get the 4-D boolean mask transformers would build from the 2-D one, built once
  instead of at every step.
* Each step warps the logits with ``generate``'s warpers in its order (``TemperatureLogitsWarper`` →
  ``TopKLogitsWarper`` → ``TopPLogitsWarper``, then ``softmax``), so every step's distribution is ``generate``'s.
  Greedy decoding gives ``generate``'s tokens, and its logits exactly (reference path) or to 1e-5 (grouped), in
  float32; in bf16 the grouped attention's different rounding can flip near-ties (top-2 logits within a bf16 step).
  A sampled token is drawn from that distribution by inverse transform (:func:`sample_categorical`, one uniform
  per row) instead of ``torch.multinomial``, which on CPU draws one exponential per vocabulary entry
  (``bench/bench_kernels.py --only sampling``; BENCHMARKS.md, "Kernels"): sampled tokens follow ``generate``'s
  distribution, not its RNG stream.

tests/rlhf_core/workers/test_hf_decode.py checks all of it against ``generate``, with rows stopping at EOS mid-batch. Source:
transformers ``GenerationMixin._sample`` (5.x), whose inputs (``position_ids`` = ``cumsum(mask) − 1``, 0 at pads,
then the last position + 1 per step; the 2-D mask grown by a column of ones; the mask dropped when it has no
padding) this loop reproduces. Measured with ``bench/bench_hf_decode.py``.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Callable, Sequence

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from rlhf_core.kernels.packing import packed_prompt_pass, supports_varlen_attention
from rlhf_core.kernels.grouped_attention import (decode_step, group_cache, grouped_decode, sdpa_full_attention,
                                                         supports_decode_step, supports_grouped_decode)
from rlhf_core.kernels.packed_linear import DecodeWeights


# generation_config.json entries that add no logits processor beyond the ones this loop applies (the rollout sets
# do_sample/temperature/top_k/top_p/eos/pad/max_new_tokens itself), with the neutral values of a few others
_NO_PROCESSOR_KEYS = {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "do_sample",
                      "temperature", "top_k", "top_p", "max_length", "max_new_tokens", "use_cache",
                      "transformers_version", "_from_model_config"}
_NEUTRAL_VALUES = {"repetition_penalty": 1.0, "num_beams": 1, "num_return_sequences": 1, "length_penalty": 1.0,
                   "typical_p": 1.0, "output_attentions": False, "output_hidden_states": False,
                   "output_scores": False, "output_logits": False, "return_dict_in_generate": False}


def supports_lean_decode(model: nn.Module) -> bool:
    """Whether :func:`decode` gives what ``generate`` gives for this model: a decoder-only LM whose ``forward`` takes
    ``cache`` and ``logits_to_keep`` (transformers 5.x), and whose ``generation_config`` adds no logits processor
    that ``generate`` would merge in (``repetition_penalty ≠ 1``, ``min_new_tokens``, ``no_repeat_ngram_size``, a
    static ``cache_implementation``, ...). Otherwise the rollout keeps calling ``generate``."""
    params = inspect.signature(model.forward).parameters
    if getattr(model.config, "is_encoder_decoder", False) or not {"cache", "logits_to_keep"} <= set(params):
        return False
    gen_cfg = getattr(model, "generation_config", None)
    extra = {} if gen_cfg is None else gen_cfg.to_diff_dict()
    return all(k in _NO_PROCESSOR_KEYS or _NEUTRAL_VALUES.get(k, object()) == v for k, v in extra.items())


def sampling_warpers(do_sample: bool, temperature: float, top_k: int, top_p: float) -> LogitsProcessorList:
    """The warpers ``generate`` builds for these settings, in its order (``_get_logits_processor``, ``num_beams=1``):
    temperature when ≠ 1, top-k when > 0, top-p when < 1; none when greedy."""
    warpers = LogitsProcessorList()
    if not do_sample:
        return warpers
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return warpers


LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits")


def token_log_probs(raw_logits: torch.Tensor, tokens: torch.Tensor, mode: str, do_sample: bool, temperature: float,
                    top_k: int, top_p: float) -> torch.Tensor:
    """What ``rollout.logprobs_mode`` asks for, at each generated token (vLLM's ``logprobs_mode``, which verl 0.9
    passes to its engine): ``raw_*`` from the model's logits as they are, ``processed_*`` from the logits the token
    was drawn from (:func:`sampling_warpers`: temperature, then top-k/top-p, which set the cut tokens to ``-inf``;
    none when greedy); ``*_logprobs`` the log-softmax of those logits, ``*_logits`` the logit itself.

    Args:
        raw_logits: ``(b, n, V)`` the model's logits at each step (float32). tokens: ``(b, n)`` int64 drawn ids.
        mode: one of :data:`LOGPROBS_MODES`.

    Returns:
        ``(b, n)`` float32. Raises ``ValueError`` on another ``mode``."""
    if mode not in LOGPROBS_MODES:
        raise ValueError(f"actor_rollout_ref.rollout.logprobs_mode={mode!r}: expected one of {LOGPROBS_MODES}")
    b, n, V = raw_logits.shape
    logits = raw_logits.float().reshape(b * n, V)
    if mode.startswith("processed"):
        logits = sampling_warpers(do_sample, temperature, top_k, top_p)(None, logits)
    if mode.endswith("logprobs"):
        logits = torch.log_softmax(logits, dim=-1)
    return logits.gather(-1, tokens.reshape(b * n, 1)).reshape(b, n)


class _PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values are views into buffers sized for the whole decode: ``update`` writes the
    new step in place instead of concatenating (``DynamicLayer`` copies the whole cache every token)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n, q = self.keys.shape[-2], key_states.shape[-2]
        self._k_buf[:, :, n:n + q] = key_states
        self._v_buf[:, :, n:n + q] = value_states
        self.keys, self.values = self._k_buf[:, :, :n + q], self._v_buf[:, :, :n + q]
        return self.keys, self.values


def _expand_cache(cache: DynamicCache, index: torch.Tensor, extra: int) -> None:
    """Rows ``index`` of every layer (prefill of the unique prompts → one row per sample), stored in buffers with room
    for ``extra`` more positions; layers of another kind (e.g. sliding windows) are only re-indexed."""
    for layer in cache.layers:
        if type(layer) is not DynamicLayer or not layer.is_initialized:
            layer.reorder_cache(index)
            continue
        k, v = layer.keys, layer.values
        b, h, n, d = k.shape
        layer._k_buf = k.new_empty((index.numel(), h, n + extra, d))
        layer._v_buf = v.new_empty((index.numel(), v.shape[1], n + extra, v.shape[-1]))
        layer._k_buf[:, :, :n] = k.index_select(0, index)
        layer._v_buf[:, :, :n] = v.index_select(0, index)
        layer.keys, layer.values = layer._k_buf[:, :, :n], layer._v_buf[:, :, :n]
        layer.__class__ = _PreallocatedLayer


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None = None,
                       generators: Sequence[torch.Generator] | None = None,
                       uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One draw per row from ``probs (..., V)`` (non-negative, any positive sum: normalised here), by inverse
    transform sampling: ``u ~ U[0, sum)``, the token is the first index whose cumulative sum exceeds ``u``.

    An exact categorical draw up to the float rounding of the cumulative sum (about 1e-7 of the mass per token in
    float32; 16-bit probabilities are summed in float32): a token of probability 0 is never drawn (its cumulative
    sum equals its predecessor's, so it is never the *first* to exceed ``u``; ``u`` is kept strictly below the
    total). Uses one uniform per row from ``generator`` (the global torch RNG when None) where
    ``torch.multinomial`` on CPU draws one exponential per entry, the cost that dominated a small model's decode
    step (module docstring). ``generators`` (one per row of a ``(b, V)`` ``probs``): row ``i``'s uniform comes from
    ``generators[i]`` instead (one ``torch.rand((1,))`` draw each), so a row's draws do not depend on the other rows
    (the per-request streams of the continuous engine, ``hf_continuous.py``); ``uniforms (b,)`` in ``[0, 1)``: row
    ``i`` uses ``uniforms[i]`` (drawn beforehand).

    Returns: ``(...)`` int64 token ids.

    Raises:
        ValueError: a row with a negative, NaN or infinite entry or no positive mass (``torch.multinomial``
            refuses those too; an inverse-CDF draw would return an index past the vocabulary).
    """
    cdf = (probs.float() if probs.dtype in (torch.float16, torch.bfloat16) else probs).cumsum(-1)
    total = cdf[..., -1:]
    if not bool(((total > 0) & torch.isfinite(total)).all()) or bool((probs.amin(-1) < 0).any()):
        raise ValueError("sample_categorical: every row of probabilities must be finite and non-negative with a "
                         "positive sum (a NaN or inf in the logits or the weights?)")
    if generators is not None:
        uniforms = torch.cat([torch.rand((1,), generator=g, dtype=cdf.dtype) for g in generators])
    if uniforms is None:
        u = torch.rand(total.shape, generator=generator, dtype=cdf.dtype, device=cdf.device) * total
    else:
        if probs.dim() != 2 or uniforms.shape != probs.shape[:1]:
            raise ValueError(f"sample_categorical: {tuple(uniforms.shape)} uniforms or generators for probabilities "
                             f"of shape {tuple(probs.shape)} (one per row of a (b, V) tensor)")
        u = uniforms.to(device=cdf.device, dtype=cdf.dtype)[:, None] * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)


def next_token_probs(logits: torch.Tensor, warpers: LogitsProcessorList) -> torch.Tensor:
    """``softmax`` of the warped float32 logits ``(b, V)``: the distribution a sampling step draws from."""
    return torch.softmax(warpers(None, logits.float()), dim=-1)


@torch.no_grad()
def decode(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
           eos_ids: Sequence[int], pad_token_id: int, do_sample: bool, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0, output_logits: bool = False, pack_prompts: bool = False,
           should_stop: Callable[[], bool] | None = None, fast: bool = True,
           generators: Sequence[torch.Generator] | None = None):
    """Generate up to ``max_new_tokens`` tokens after left-padded prompts, as ``model.generate`` would (greedy: the
    same tokens; sampled: from the same distributions).

    Args:
        model: a causal LM accepting ``cache``/``use_cache``/``logits_to_keep`` (transformers 5.x), in eval mode.
        input_ids, attention_mask: ``(b, P)`` int64, left-padded prompts (mask 1 at tokens, 0 at pads).
        eos_ids: a row stops after emitting any of these (empty: never stops early); later tokens are
            ``pad_token_id`` (like ``generate``).
        do_sample: sample (temperature/top-k/top-p, one uniform per row per step from the global torch RNG:
            :func:`sample_categorical`) or greedy (argmax).
        output_logits: also return the raw float32 logits of every step.
        pack_prompts: run the prefill on the distinct prompts' valid tokens only
            (:func:`~rlhf_core.kernels.packing.packed_prompt_pass`, ``use_remove_padding``) where the model attends
            packed per sequence and some prompt is padded; the padded prefill otherwise.
        should_stop: asked after every step (once per token, never before the first): True stops the loop there,
            every row keeping the tokens sampled so far (the partial rollout's interrupt, ``hf_partial.py``).
        generators: one ``torch.Generator`` per row: row ``i`` draws its uniforms from ``generators[i]`` (per-request
            streams, as :mod:`~rlhf_core.workers.rollout.hf_continuous` samples) instead of the global RNG.
        fast: on a Llama-form SDPA model, run the decode steps on the grouped cache layout (``grouped_attention.py``;
            distinct prompts are groups of one row) and, for a stock Llama/Qwen2/Mistral model, through
            ``decode_step`` with the reordered weights: logits equal to float rounding. False: the reference path,
            each row's cache in preallocated buffers and the model's own forward (``generate``'s logits exactly).

    Columns that are padding in every row are dropped before the prefill (prompts arrive left-padded to
    ``data.max_prompt_length``); positions count valid tokens, so the logits are the same to float rounding (in bf16
    a rounding step can flip a sampled draw, so a sampled bf16 rollout can differ from the untrimmed one's).

    Returns:
        ``(tokens (b, n) int64, logits (b, n, V) float32 or None)`` where ``n ≤ max_new_tokens`` is the number of
        steps run: the loop stops when every row has emitted an EOS, like ``generate``, or when ``should_stop``
        says so.
    """
    b, _ = input_ids.shape
    dev = input_ids.device
    k = int(attention_mask.any(dim=0).int().argmax())  # leading columns that are padding in every row
    input_ids, attention_mask = input_ids[:, k:], attention_mask[:, k:]
    warpers = sampling_warpers(do_sample, temperature, top_k, top_p)
    eos = torch.tensor(list(eos_ids), dtype=torch.long, device=dev)
    has_eos = eos.numel() > 0
    position_ids = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    mask = None if bool(attention_mask.all()) else attention_mask.long()  # generate drops an all-ones mask
    # prefill each distinct prompt once (rollout.n repeats every prompt), then give every row its copy of the cache
    uniq, inverse = torch.unique(torch.cat([input_ids, attention_mask.long()], -1), dim=0, return_inverse=True)
    first = torch.full((uniq.shape[0],), b, dtype=torch.long, device=dev).scatter_reduce(
        0, inverse, torch.arange(b, device=dev), "amin")
    cache = DynamicCache(config=model.config)
    if (pack_prompts and mask is not None and supports_varlen_attention(model)
            and bool(attention_mask[first][:, -1].all())):
        prefill_logits = packed_prompt_pass(model, input_ids[first], mask[first], position_ids[first], cache)
    else:
        prefill_logits = model(input_ids=input_ids[first], attention_mask=None if mask is None else mask[first],
                               position_ids=position_ids[first], cache=cache, use_cache=True, logits_to_keep=1).logits
    # a Llama-form SDPA model: each prompt's keys/values read once per step for all its rows (repeated prompts), the
    # step without transformers' plumbing and on reordered weights (distinct prompts too: groups of one row)
    grouped = None
    if fast and supports_grouped_decode(model):
        grouped = group_cache(cache, inverse, attention_mask[first], max_new_tokens)
    if grouped is None:
        _expand_cache(cache, inverse, max_new_tokens)
    out_logits = prefill_logits[inverse]
    tokens = torch.full((b, max_new_tokens), pad_token_id, dtype=torch.long, device=dev)
    raw = [] if output_logits else None
    unfinished = torch.ones(b, dtype=torch.bool, device=dev)
    # the per-step mask, built once (transformers rebuilds a 4-D mask from the 2-D one at every step otherwise)
    P = input_ids.shape[1]
    mask4d = None
    if grouped is not None:
        mask = None  # the grouped attention holds the prompts' padding itself
    elif mask is not None and sdpa_full_attention(model):  # transformers passes a 4-D mask through as is
        mask4d = torch.ones((b, 1, 1, P + max_new_tokens), dtype=torch.bool, device=dev)
        mask4d[:, 0, 0, :P] = attention_mask.bool()
    position = position_ids[:, -1:]
    ones = torch.ones((b, 1), dtype=torch.long, device=dev)
    fast_step = grouped is not None and supports_decode_step(model)  # the forward without its call plumbing
    weights = DecodeWeights.of(model, b) if fast_step else None  # its linears as oneDNN products (CPU)
    n = 0
    with grouped_decode(model, grouped) if grouped is not None else contextlib.nullcontext():
        while n < max_new_tokens:
            logits = out_logits[:, -1].to(dtype=torch.float32, copy=True)
            if raw is not None:
                raw.append(logits)
            if do_sample:
                nxt = sample_categorical(next_token_probs(logits, warpers), generators=generators)
            else:
                nxt = torch.argmax(logits, dim=-1)
            if has_eos:
                nxt = torch.where(unfinished, nxt, pad_token_id)
                unfinished &= ~torch.isin(nxt, eos)
            tokens[:, n] = nxt
            n += 1
            if n == max_new_tokens or (has_eos and not bool(unfinished.any())):
                break
            if should_stop is not None and should_stop():
                break
            if mask4d is not None:
                mask = mask4d[..., :P + n]
            elif mask is not None:
                mask = torch.cat([mask, ones], dim=-1)
            position = position + 1
            if fast_step:
                out_logits = decode_step(model, nxt[:, None], position, weights)
            else:
                out_logits = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=position, cache=cache,
                                   use_cache=True, logits_to_keep=1).logits
    return tokens[:, :n], (torch.stack(raw, dim=1) if raw is not None else None)
