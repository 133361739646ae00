"""Reward managers: turn a generated :class:`~rlhf_core.protocol.Batch` into token-level scores.

Mirrors verl's ``NaiveRewardManager`` (``verl/workers/reward_manager/naive.py``) and its registry
(``register`` / ``get_reward_manager_cls``). A manager is called as

    manager(batch, return_dict=True) -> {"reward_tensor": (B, T) float32, "reward_extra_info": dict[str, list]}

It reads tensors ``prompts (B, P)``, ``responses (B, T)``, ``response_mask (B, T)`` (or, without it,
``attention_mask[:, P:]``) and ``attention_mask (B, P+T)``; non-tensors ``<reward_fn_key>`` (default
``data_source``), ``reward_model`` (a dict with ``ground_truth``) and ``extra_info`` (dict or None → ``{}``).
The scalar score sits on the last valid response token ``L - 1`` (``L = response_mask[i].sum()``); all other
positions are 0. A response with ``L == 0`` gets its score on position 0 (verl writes it to position ``-1``).

A scorer may return a float or a dict with key ``score``; every key of such a dict (``score`` included, as
verl) becomes a per-sample list in ``reward_extra_info``; samples that lack a key get ``None`` there.
If the batch already holds ``rm_scores`` (a reward model ran), they are returned unchanged (as verl).
"""
from __future__ import annotations

import abc
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import torch

from rlhf_core.protocol import Batch
from rlhf_core.registry import Registry
from rlhf_core.reward.scorers import default_compute_score

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
    response_lengths = response_mask.sum(-1).tolist()
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


def assemble_rewards(
    samples: list[DecodedSample], results: list[Any], response_len: int
) -> tuple[torch.Tensor, dict[str, list]]:
    """Scores (float or dict with ``score``) → ``(B, T)`` float32 reward tensor and per-sample extra lists.

    Raises:
        KeyError: when a dict result has no ``score``.
    """
    reward = torch.zeros(len(samples), response_len, dtype=torch.float32)
    keys: list[str] = []
    for r in results:
        if isinstance(r, dict):
            keys += [k for k in r if k not in keys]
    extra: dict[str, list] = defaultdict(list)
    for i, (sample, r) in enumerate(zip(samples, results)):
        if isinstance(r, dict):
            if "score" not in r:
                raise KeyError(f"a reward function returned a dict without 'score': keys {sorted(r)}")
            score = r["score"]
        else:
            score = r
        for k in keys:
            extra[k].append(r.get(k) if isinstance(r, dict) else None)
        reward[i, max(sample.valid_response_length - 1, 0)] = float(score)
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
    extra_info)``. An exception from the scorer propagates (use ``prime`` to contain crashing scorers)."""

    def score_samples(self, samples: list[DecodedSample]) -> list[Any]:
        return [
            self.compute_score(
                data_source=s.data_source,
                solution_str=s.response_str,
                ground_truth=s.ground_truth,
                extra_info=s.extra_info,
            )
            for s in samples
        ]


@register("batch")
class BatchRewardManager(RewardManagerBase):
    """verl's ``BatchRewardManager``: one call for the whole batch, ``compute_score(data_sources=[...],
    solution_strs=[...], ground_truths=[...], extra_infos=[...])`` → a list of floats or dicts (length ``B``).

    Raises:
        ValueError: when the function returns a list of the wrong length.
    """

    def score_samples(self, samples: list[DecodedSample]) -> list[Any]:
        results = list(
            self.compute_score(
                data_sources=[s.data_source for s in samples],
                solution_strs=[s.response_str for s in samples],
                ground_truths=[s.ground_truth for s in samples],
                extra_infos=[s.extra_info for s in samples],
            )
        )
        if len(results) != len(samples):
            raise ValueError(f"batch reward function returned {len(results)} scores for {len(samples)} samples")
        return results
