"""Training-step metrics with verl's names (``verl/trainer/ppo/metric_utils.py``).

Tensors read from the :class:`~rlhf_core.protocol.Batch` (``B`` sequences, prompt width ``P``, response width
``T``): ``token_level_scores``, ``token_level_rewards``, ``advantages``, ``returns`` (and ``values`` with a
critic), all ``(B, T)`` float; ``responses (B, T)``; ``response_mask (B, T)`` 0/1; ``attention_mask (B, P+T)``.
Prompt length of a row = ``attention_mask[:, :P].sum()``, response length = ``attention_mask[:, P:].sum()``
(``P = attention_mask.shape[1] - T``), as verl's ``_compute_response_info``: in a multi-turn trajectory the tool and
user tokens between assistant turns count (``response_mask`` is 0 on them), so a trajectory cut at ``T`` by a tool
response is a clipped one. Advantages, returns and values are summarised over ``response_mask`` tokens only (the
tokens with a loss); scores and rewards are summed per sequence first.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from rlhf_core.protocol import Batch


def _lengths(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """``(prompt_length (B,), response_length (B,), P, T)`` as float32 tensors and ints: the attended tokens of the
    prompt and of the response part of ``attention_mask (B, P+T)`` (the whole trajectory, tool turns included)."""
    t = batch["responses"].shape[-1]
    attention_mask = batch["attention_mask"]
    p = attention_mask.shape[-1] - t
    return attention_mask[:, :p].sum(-1).float(), attention_mask[:, p:].sum(-1).float(), p, t


def aborted_mask(batch: Batch) -> torch.Tensor:
    """``(B,)`` bool: the rows whose response has no attended token, i.e. the responses that
    ``rollout.over_sample_rate`` aborted (``rlhf_core.trainer.rollout_control.abort_slowest``). verl's definition
    (``metric_utils``: response length 0); a finished response always has at least its end-of-sequence token."""
    return _lengths(batch)[1] == 0


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.detach().float()
    if x.numel() == 0:  # no valid token at all: report zeros rather than crash the step
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def compute_data_metrics(batch: Batch, use_critic: bool) -> dict[str, float]:
    """``critic/score/*``, ``critic/rewards/*`` (per-sequence sums), ``critic/advantages/*``,
    ``critic/returns/*`` (valid tokens), with a critic ``critic/values/*`` and
    ``critic/vf_explained_var = 1 − Var(returns − values) / (Var(returns) + 1e-5)`` (unbiased variances over
    valid tokens, as ``torch.var``), ``response_length/{mean,max,min,clip_ratio}`` and
    ``prompt_length/{mean,max,min,clip_ratio}`` (clip ratio = share of rows whose length equals ``T`` / ``P``),
    and :func:`reward_failure_metrics`.

    Aborted rows (:func:`aborted_mask`, ``rollout.over_sample_rate``), as verl 0.6: ``response/aborted_ratio`` is
    their share of the rows; ``critic/score/*``, ``critic/rewards/*`` and ``response_length_non_aborted/*`` (the
    ``response_length`` statistics over the other rows) leave them out and are absent when every row was aborted;
    ``response_length/*`` counts every row (an aborted one as 0), and advantages, returns and values have no valid
    token on an aborted row.

    Raises:
        KeyError: when a needed tensor is missing (``values`` only when ``use_critic``).
    """
    prompt_length, response_length, p, t = _lengths(batch)
    mask = (batch["response_mask"] if "response_mask" in batch else batch["attention_mask"][:, p:]).bool()
    kept = ~aborted_mask(batch)
    metrics: dict[str, float] = {}
    if bool(kept.any()):  # all aborted: no score to report (never a false 0)
        metrics.update(_stats("critic/score", batch["token_level_scores"].sum(-1)[kept]))
        metrics.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)[kept]))
        metrics.update(_stats("response_length_non_aborted", response_length[kept]))
        metrics["response_length_non_aborted/clip_ratio"] = torch.eq(response_length[kept], t).float().mean().item()
    metrics["response/aborted_ratio"] = (~kept).float().mean().item()
    metrics.update(_stats("critic/advantages", torch.masked_select(batch["advantages"], mask)))
    valid_returns = torch.masked_select(batch["returns"], mask).float()
    metrics.update(_stats("critic/returns", valid_returns))
    if use_critic:
        valid_values = torch.masked_select(batch["values"], mask).float()
        metrics.update(_stats("critic/values", valid_values))
        diff_var = torch.var(valid_returns - valid_values)
        metrics["critic/vf_explained_var"] = (1.0 - diff_var / (torch.var(valid_returns) + 1e-5)).item()
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = torch.eq(response_length, t).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = torch.eq(prompt_length, p).float().mean().item()
    metrics.update(reward_failure_metrics(batch))
    return metrics


def reward_failure_metrics(batch: Batch) -> dict[str, float]:
    """``reward/num_errors``: samples of this step whose score could not be computed and were scored 0 (the reward
    manager's per-sample ``reward_error`` column; 0 when absent); ``reward/num_timeouts`` likewise from
    ``reward_timeout`` when the manager reports timeouts (``prime``)."""
    out = {"reward/num_errors": float(sum(int(v) for v in batch["reward_error"])) if "reward_error" in batch else 0.0}
    if "reward_timeout" in batch:
        out["reward/num_timeouts"] = float(sum(int(v) for v in batch["reward_timeout"]))
    return out


def compute_timing_metrics(batch: Batch, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """``timing_s/<stage>`` for every timer (seconds) and ``timing_per_token_ms/<stage>`` (milliseconds per
    token) for the stages verl normalises: ``gen`` by response tokens (the response part of ``attention_mask``: tool
    and user turns of a multi-turn trajectory included, as verl counts them); ``ref``, ``values``, ``adv``,
    ``update_critic``, ``update_actor`` by prompt + response tokens (attended tokens of the whole batch)."""
    prompt_length, response_length, _, _ = _lengths(batch)
    n_prompt, n_response = prompt_length.sum().item(), response_length.sum().item()
    tokens = {"gen": n_response}
    tokens.update({k: n_prompt + n_response for k in ("ref", "values", "adv", "update_critic", "update_actor")})
    out = {f"timing_s/{k}": float(v) for k, v in timing_raw.items()}
    for k in sorted(set(tokens) & set(timing_raw)):
        if tokens[k] > 0:
            out[f"timing_per_token_ms/{k}"] = float(timing_raw[k]) * 1000.0 / tokens[k]
    return out


def compute_throughput_metrics(batch: Batch, timing_raw: Mapping[str, float], n_workers: int) -> dict[str, float]:
    """``perf/total_num_tokens`` (valid prompt + response tokens: ``batch.meta["global_token_num"]`` summed
    when present, else ``attention_mask.sum()``), ``perf/time_per_step = timing_raw["step"]`` (s) and
    ``perf/throughput = total_num_tokens / (time_per_step * n_workers)`` (tokens/s per worker).

    Raises:
        KeyError: without a ``step`` timer. ValueError: when ``n_workers < 1`` or the step time is not positive.
    """
    if "step" not in timing_raw:
        raise KeyError(f"compute_throughput_metrics needs timing_raw['step']; timers: {sorted(timing_raw)}")
    step_s = float(timing_raw["step"])
    if n_workers < 1 or step_s <= 0:
        raise ValueError(f"need n_workers >= 1 and a positive step time, got {n_workers} and {step_s}")
    if "global_token_num" in batch.meta:
        total = float(sum(batch.meta["global_token_num"]))
    else:
        total = float(batch["attention_mask"].sum().item())
    return {
        "perf/total_num_tokens": total,
        "perf/time_per_step": step_s,
        "perf/throughput": total / (step_s * n_workers),
    }


def reduce_metrics(metrics: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Mean of every metric: accepts ``{name: [values]}`` (verl's form; a scalar counts as one value) or a list
    of ``{name: value}`` dicts (a name missing from some dicts is averaged over the dicts that have it)."""
    lists: dict[str, list] = defaultdict(list)
    if isinstance(metrics, Mapping):
        for k, v in metrics.items():
            lists[k].extend(v if isinstance(v, (list, tuple, np.ndarray)) else [v])
    else:
        for d in metrics:
            for k, v in d.items():
                lists[k].extend(v if isinstance(v, (list, tuple, np.ndarray)) else [v])
    return {k: float(np.mean([float(x) for x in v])) for k, v in lists.items() if len(v)}
