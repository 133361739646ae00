"""Reward managers: turn a generated :class:`~rlhf_core.protocol.Batch` into token-level scores.

Mirrors verl's ``NaiveRewardManager`` (``verl/workers/reward_manager/naive.py``) and its registry
(``register`` / ``get_reward_manager_cls``). A manager is called as

    manager(batch, return_dict=True) -> {"reward_tensor": (B, T) float32, "reward_extra_info": dict[str, list]}

It reads tensors ``prompts (B, P)``, ``responses (B, T)``, ``response_mask (B, T)`` (or, without it,
``attention_mask[:, P:]``) and ``attention_mask (B, P+T)``; non-tensors ``<reward_fn_key>`` (default
``data_source``), ``reward_model`` (a dict with ``ground_truth``) and ``extra_info`` (dict or None → ``{}``).
The scalar score sits on the last valid response token ``L - 1`` (``L`` = 1 + the last index where
``response_mask[i]`` is 1: its sum when contiguous; a multi-turn trajectory's full length); all other
positions are 0. A response with ``L == 0`` gets its score on position 0 (verl writes it to position ``-1``).

A scorer may return a float or a dict with key ``score``; every key of such a dict (``score`` included, as
verl) becomes a per-sample list in ``reward_extra_info``; samples that lack a key get ``None`` there.
If the batch already holds ``rm_scores`` (a reward model ran), they are returned unchanged (as verl).

A sample whose score cannot be computed — the scorer raised (``naive``/``dapo``; ``prime`` also on a timeout), or
returned ``None``, NaN, ±inf or something that is not a number — scores 0 (never a crashed or NaN step): one
warning per batch names the samples and the causes, and ``reward_extra_info["reward_error"]`` (per-sample 0/1) is
present whenever a sample failed; the trainer sums it into the ``reward/num_errors`` metric. A scorer that raises
:class:`~rlhf_core.reward.scorers.UnknownDataSourceError` (a configuration error) still stops the step.
"""
from __future__ import annotations

import abc
import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import torch

from rlhf_core.protocol import Batch
from rlhf_core.registry import Registry
from rlhf_core.reward.scorers import UnknownDataSourceError, default_compute_score

logger = logging.getLogger(__name__)

REWARD_MANAGERS: Registry[type] = Registry("reward_model.reward_manager")


def register(name: str) -> Callable[[type], type]:
    """Class decorator adding a reward manager under ``reward_model.reward_manager: <name>``.

    Raises:
        ValueError: when ``name`` is already registered to another class.
    """
    return REWARD_MANAGERS.register(name)


def get_reward_manager_cls(name: str) -> type:
    """Raises ``ValueError`` naming the registered managers when ``name`` is unknown."""
    return REWARD_MANAGERS.get(name)


@dataclass
class DecodedSample:
    """One sample ready to score; ``valid_response_length`` is ``L`` (the score goes to ``L - 1``)."""

    prompt_str: str
    response_str: str
    ground_truth: Any
    data_source: str
    extra_info: dict
    valid_response_length: int


def decode_batch(batch: Batch, tokenizer: Any, reward_fn_key: str = "data_source") -> list[DecodedSample]:
    """Decode every row's valid prompt (left-padded) and valid response (right-padded) ids.

    Raises:
        KeyError: when ``responses``, ``prompts``, ``attention_mask``, ``reward_model`` or ``reward_fn_key``
            is missing from the batch.
    """
    prompts, responses = batch["prompts"], batch["responses"]
    attention_mask = batch["attention_mask"]
    p_len = prompts.shape[-1]
    response_mask = batch["response_mask"] if "response_mask" in batch else attention_mask[:, p_len:]
    prompt_lengths = attention_mask[:, :p_len].sum(-1).tolist()
    # L = one past the last masked token: the sum for a contiguous single-turn mask; for a multi-turn trajectory
    # (tool tokens masked 0 in between) the whole trajectory, as verl's attention-mask length
    positions = torch.arange(1, response_mask.shape[-1] + 1, device=response_mask.device)
    response_lengths = (response_mask.long() * positions).amax(-1).tolist()
    data_sources, reward_models = batch[reward_fn_key], batch["reward_model"]
    extra_infos = batch["extra_info"] if "extra_info" in batch else [None] * len(batch)
    samples = []
    for i in range(len(batch)):
        pl, rl = int(prompt_lengths[i]), int(response_lengths[i])
        prompt_ids = prompts[i, p_len - pl :].tolist() if pl else []
        samples.append(
            DecodedSample(
                prompt_str=tokenizer.decode(prompt_ids, skip_special_tokens=True),
                response_str=tokenizer.decode(responses[i, :rl].tolist(), skip_special_tokens=True),
                ground_truth=(reward_models[i] or {}).get("ground_truth"),
                data_source=str(data_sources[i]),
                extra_info=dict(extra_infos[i] or {}),
                valid_response_length=rl,
            )
        )
    return samples


class ScoreFailure:
    """Stands in for the result of a sample whose scorer failed; :func:`assemble_rewards` scores it 0.

    Attributes:
        reason: what went wrong, e.g. ``"ValueError: bad answer"`` or ``"timed out after 300 s"``.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"ScoreFailure({self.reason!r})"


def score_value(result: Any) -> tuple[float, str | None]:
    """``(score, None)`` for a usable result (a finite number, or a dict whose ``score`` is one), else
    ``(0.0, reason)``: a :class:`ScoreFailure`, ``None``, NaN, ±inf or a value that is not a number.

    Raises:
        KeyError: when a dict result has no ``score``.
    """
    if isinstance(result, ScoreFailure):
        return 0.0, result.reason
    if isinstance(result, dict):
        if "score" not in result:
            raise KeyError(f"a reward function returned a dict without 'score': keys {sorted(result)}")
        result = result["score"]
    if result is None or isinstance(result, (str, bytes)):
        return 0.0, f"the reward function returned {result!r}, not a number"
    try:
        score = float(result)
    except (TypeError, ValueError):
        return 0.0, f"the reward function returned {type(result).__name__} {result!r:.80}, not a number"
    if not math.isfinite(score):
        return 0.0, f"the reward function returned {score}"
    return score, None


def assemble_rewards(
    samples: list[DecodedSample], results: list[Any], response_len: int
) -> tuple[torch.Tensor, dict[str, list]]:
    """Scores (float or dict with ``score``) → ``(B, T)`` float32 reward tensor and per-sample extra lists.

    A failed sample (see :func:`score_value`) scores 0; then ``reward_error`` (0/1 per sample) joins the extras, its
    ``score`` extra is 0, and one warning names the failed samples (index, data source, cause).

    Raises:
        KeyError: when a dict result has no ``score``.
    """
    reward = torch.zeros(len(samples), response_len, dtype=torch.float32)
    keys: list[str] = []
    for r in results:
        if isinstance(r, dict):
            keys += [k for k in r if k not in keys]
    extra: dict[str, list] = defaultdict(list)
    failures: list[tuple[int, str]] = []
    for i, (sample, r) in enumerate(zip(samples, results)):
        score, reason = score_value(r)
        if reason is not None:
            failures.append((i, reason))
        for k in keys:
            value = r.get(k) if isinstance(r, dict) else None
            extra[k].append(0.0 if k == "score" and reason is not None else value)
        reward[i, max(sample.valid_response_length - 1, 0)] = score
    if failures:
        extra["reward_error"] = [0] * len(samples)
        for i, _ in failures:
            extra["reward_error"][i] = 1
        shown = "; ".join(f"sample {i} (data_source {samples[i].data_source!r}): {why}" for i, why in failures[:5])
        logger.warning("reward: %d of %d samples scored 0 because their score could not be computed: %s%s",
                       len(failures), len(samples), shown, " ..." if len(failures) > 5 else "")
    return reward, dict(extra)


class RewardManagerBase(abc.ABC):
    """Shared decode / print / assemble logic; subclasses implement :meth:`score_samples`."""

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
    ) -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key

    @abc.abstractmethod
    def score_samples(self, samples: list[DecodedSample]) -> list[Any]:
        """One score (float, or dict with ``score``) per decoded sample, in order."""

    def __call__(self, batch: Batch, return_dict: bool = False) -> Any:
        if "rm_scores" in batch:
            keys = batch.meta.get("reward_extra_keys", [])
            out = {"reward_tensor": batch["rm_scores"], "reward_extra_info": {k: list(batch[k]) for k in keys}}
            return out if return_dict else out["reward_tensor"]
        samples = decode_batch(batch, self.tokenizer, self.reward_fn_key)
        results = self.score_samples(samples)
        reward, extra = assemble_rewards(samples, results, batch["responses"].shape[-1])
        self._examine(samples, results)
        if return_dict:
            return {"reward_tensor": reward, "reward_extra_info": extra}
        return reward

    def _examine(self, samples: list[DecodedSample], results: list[Any]) -> None:
        """Print the first ``num_examine`` samples of every data source (verl prints the same four lines)."""
        printed: dict[str, int] = defaultdict(int)
        for s, r in zip(samples, results):
            if printed[s.data_source] >= self.num_examine:
                continue
            printed[s.data_source] += 1
            print("[prompt]", s.prompt_str)
            print("[response]", s.response_str)
            print("[ground_truth]", s.ground_truth)
            print("[score]", r)


@register("naive")
class NaiveRewardManager(RewardManagerBase):
    """Scores one sample at a time in this process: ``compute_score(data_source, solution_str, ground_truth,
    extra_info)``. A scorer that raises scores that sample 0 (a :class:`ScoreFailure`, counted in ``reward_error``),
    except :class:`~rlhf_core.reward.scorers.UnknownDataSourceError`, which propagates. A scorer that hangs hangs the
    step: use ``prime`` (per-sample timeout) for scorers that may not return."""

    def score_samples(self, samples: list[DecodedSample]) -> list[Any]:
        return [self._score_one(s) for s in samples]

    def _score_one(self, s: DecodedSample) -> Any:
        try:
            return self.compute_score(
                data_source=s.data_source,
                solution_str=s.response_str,
                ground_truth=s.ground_truth,
                extra_info=s.extra_info,
            )
        except UnknownDataSourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - a scorer's failure scores 0 and is counted, never fails the step
            return ScoreFailure(f"{self.compute_score!r} raised {type(exc).__name__}: {exc}")


@register("batch")
class BatchRewardManager(RewardManagerBase):
    """verl's ``BatchRewardManager``: one call for the whole batch, ``compute_score(data_sources=[...],
    solution_strs=[...], ground_truths=[...], extra_infos=[...])`` → a list of floats or dicts (length ``B``).

    Without ``custom_reward_function.path`` the built-in scorers take one sample per call: they are then called once
    per sample (as ``naive``), so ``batch`` works without a file too (verl would call them with lists and fail).

    Raises:
        ValueError: when the function returns a list of the wrong length.
    """

    def score_samples(self, samples: list[DecodedSample]) -> list[Any]:
        fn = self.compute_score
        if fn is default_compute_score or getattr(fn, "func", None) is default_compute_score:  # a partial of it
            return [NaiveRewardManager._score_one(self, s) for s in samples]
        results = list(
            self.compute_score(
                data_sources=[s.data_source for s in samples],
                solution_strs=[s.response_str for s in samples],
                ground_truths=[s.ground_truth for s in samples],
                extra_infos=[s.extra_info for s in samples],
            )
        )
        if len(results) != len(samples):
            raise ValueError(f"batch reward function {self.compute_score!r} returned {len(results)} scores for "
                             f"{len(samples)} samples (one per sample, in order)")
        return results
