"""``reward_model.reward_manager: dapo``: the naive manager plus DAPO's soft overlong punishment.

DAPO (Yu et al. 2025, arXiv:2503.14476, §3.4 eq. 13, "Soft Overlong Punishment"): with L_max = ``max_resp_len`` and
L_cache = the buffer length, a response of |y| valid tokens gets

    R_length(y) = 0                               if |y| ≤ L_max − L_cache
                = ((L_max − L_cache) − |y|) / L_cache · penalty_factor   otherwise (down to −penalty_factor at L_max)

added to its score (verl ``DAPORewardManager``: min(−(|y| − (L_max − L_cache))/L_cache·factor, 0)). Configured as in
verl 0.6, through the manager's keyword arguments ``reward_model.reward_kwargs``::

    reward_model.reward_manager=dapo
    +reward_model.reward_kwargs.max_resp_len=1024
    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=256
    +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
    +reward_model.reward_kwargs.overlong_buffer_cfg.log=False
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from rlhf_core.protocol import Batch
from rlhf_core.reward.managers import NaiveRewardManager, assemble_rewards, decode_batch, register, score_value

_KEY = "reward_model.reward_kwargs"


def overlong_penalty(response_length: int, max_resp_len: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment (eq. 13): min(−(L − (L_max − L_buf)) / L_buf · ``penalty_factor``, 0).

    Args:
        response_length: valid tokens of the response L.
        max_resp_len: L_max. buffer_len: L_buf (> 0). penalty_factor: the penalty at L = L_max.
    Returns:
        The (non-positive) reward to add, a float.
    """
    exceed = response_length - (max_resp_len - buffer_len)
    return min(-exceed / buffer_len * penalty_factor, 0.0)


@dataclass(frozen=True)
class OverlongBuffer:
    """``reward_model.reward_kwargs.overlong_buffer_cfg`` (verl's ``overlong_buffer`` block; same defaults as its
    DAPO recipe: disabled, length 0, factor 0, no logging)."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 0.0
    log: bool = False

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> "OverlongBuffer":
        """From a mapping (dict or DictConfig); ``None`` → disabled (verl crashes on ``None`` with an
        AttributeError at the first batch).

        Raises:
            ValueError: for a key that is not enable, len, penalty_factor or log, naming it.
        """
        if cfg is None:
            return cls()
        known = {f.name for f in fields(cls)}
        values = dict(cfg.items())
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{_KEY}.overlong_buffer_cfg has unknown keys {unknown}; expected {sorted(known)}")
        return cls(enable=bool(values.get("enable", False)), len=int(values.get("len", 0)),
                   penalty_factor=float(values.get("penalty_factor", 0.0)), log=bool(values.get("log", False)))


@register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """verl's ``DAPORewardManager``: scores like ``naive`` (one ``compute_score`` call per sample), then, with
    ``overlong_buffer_cfg.enable``, adds :func:`overlong_penalty` of the response length to each score (at the last
    valid token). With ``overlong_buffer_cfg.log`` the per-sample ``overlong_reward`` and ``overlong`` (penalty < 0)
    join ``reward_extra_info``; a float score is also reported as ``acc`` (as verl). A trailing ``eos_token`` string
    is stripped from the decoded response before scoring (as verl). ``rm_scores`` pass through unchanged.

    Args:
        max_resp_len: L_max, needed when the buffer is enabled (verl passes ``data.max_response_length``).
        overlong_buffer_cfg: mapping with ``enable``, ``len``, ``penalty_factor``, ``log``; ``None`` = no penalty.
    Raises:
        ValueError: when the buffer is enabled and ``max_resp_len`` is missing, ``len <= 0`` or
            ``max_resp_len < len``; for unknown buffer keys.
    """

    def __init__(self, tokenizer: Any, num_examine: int = 0, compute_score: Callable[..., Any] | None = None,
                 reward_fn_key: str = "data_source", max_resp_len: int | None = None,
                 overlong_buffer_cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
        self.overlong_buffer = OverlongBuffer.from_config(overlong_buffer_cfg)
        self.max_resp_len = None if max_resp_len is None else int(max_resp_len)
        buf = self.overlong_buffer
        if buf.enable:
            if self.max_resp_len is None:
                raise ValueError(f"{_KEY}.overlong_buffer_cfg.enable=True needs {_KEY}.max_resp_len (verl scripts set "
                                 f"it to data.max_response_length)")
            if buf.len <= 0:
                raise ValueError(f"{_KEY}.overlong_buffer_cfg.len={buf.len} must be > 0 when the buffer is enabled")
            if self.max_resp_len < buf.len:
                raise ValueError(f"{_KEY}.max_resp_len={self.max_resp_len} must be >= "
                                 f"overlong_buffer_cfg.len={buf.len}")

    @classmethod
    def config_kwargs(cls, config: Any) -> dict[str, Any]:
        """``reward_model.overlong_buffer`` (the DAPO recipe's spelling) as ``overlong_buffer_cfg`` with
        ``max_resp_len = data.max_response_length``, when enabled; ``reward_model.reward_kwargs`` still wins (the
        loader merges it after)."""
        buffer = config.reward_model.overlong_buffer
        if not buffer.enable:
            return {}
        return {"overlong_buffer_cfg": {k: buffer[k] for k in ("enable", "len", "penalty_factor", "log")},
                "max_resp_len": int(config.data.max_response_length)}

    def __call__(self, batch: Batch, return_dict: bool = False) -> Any:
        if "rm_scores" in batch:
            return super().__call__(batch, return_dict)
        samples = decode_batch(batch, self.tokenizer, self.reward_fn_key)
        eos = getattr(self.tokenizer, "eos_token", None)
        for s in samples:
            if eos and s.response_str.endswith(eos):
                s.response_str = s.response_str[: -len(eos)]
        results = self.score_samples(samples)
        reward, extra = assemble_rewards(samples, results, batch["responses"].shape[-1])
        if not any(isinstance(r, dict) for r in results):
            extra["acc"] = [score_value(r)[0] for r in results]  # a failed sample: 0
        buf = self.overlong_buffer
        if buf.enable:
            penalties = [overlong_penalty(s.valid_response_length, self.max_resp_len, buf.len, buf.penalty_factor)
                         for s in samples]
            for i, (s, p) in enumerate(zip(samples, penalties)):
                reward[i, max(s.valid_response_length - 1, 0)] += p
            if buf.log:
                extra["overlong_reward"] = penalties
                extra["overlong"] = [p < 0 for p in penalties]
        self._examine(samples, results)
        if return_dict:
            return {"reward_tensor": reward, "reward_extra_info": extra}
        return reward
